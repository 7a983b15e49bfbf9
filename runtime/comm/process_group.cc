#include "runtime/comm/process_group.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace sk::comm {

const char* CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "unknown_collective";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
  }
  return "unknown_op";
}

namespace {

std::string TensorSummary(const Tensor& t) {
  return std::string(DTypeName(t.dtype())) + "[" + std::to_string(t.numel()) + "]";
}

bool Overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  auto a0 = reinterpret_cast<uintptr_t>(a.data());
  auto b0 = reinterpret_cast<uintptr_t>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

}  // namespace

std::string Collective::Describe() const {
  // Appended, not streamed: every simulated collective names its span with
  // this, and an ostringstream's locale set-up was 1% of a plan.
  std::string out = CollectiveName(kind);
  out += " #";
  out += std::to_string(seq);
  auto append_label = [&] {
    if (!label.empty()) {
      out += " [";
      out += label;
      out += "]";
    }
  };
  if (kind == CollectiveKind::kBarrier) {
    append_label();
    return out;
  }
  out += " (";
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (i > 0) out += ", ";
    if (kind == CollectiveKind::kAllGather || kind == CollectiveKind::kReduceScatter) {
      out += TensorSummary(inputs[i]);
      out += " -> ";
      out += TensorSummary(outputs[i]);
    } else {
      out += TensorSummary(outputs[i]);
    }
  }
  if (kind == CollectiveKind::kBroadcast) {
    out += ", root ";
    out += std::to_string(root);
  }
  if (kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllReduce) {
    out += ", ";
    out += ReduceOpName(op);
  }
  out += ")";
  append_label();
  return out;
}

size_t Collective::nccl_bytes() const {
  size_t total = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    total += kind == CollectiveKind::kReduceScatter ? inputs[i].nbytes() : outputs[i].nbytes();
  }
  return total;
}

CallFingerprint CallFingerprint::Of(const Collective& c) {
  CallFingerprint f;
  f.seq = c.seq;
  f.kind = static_cast<uint8_t>(c.kind);
  f.op = c.kind == CollectiveKind::kReduceScatter || c.kind == CollectiveKind::kAllReduce
             ? static_cast<uint8_t>(c.op)
             : 0;
  f.root = static_cast<int16_t>(c.kind == CollectiveKind::kBroadcast ? c.root : 0);
  f.entries = static_cast<int32_t>(c.outputs.size());
  uint64_t h = 0;
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    uint8_t dtype = static_cast<uint8_t>(c.outputs[i].dtype());
    int64_t in = c.inputs[i].numel();
    int64_t out = c.outputs[i].numel();
    h = Mix(Mix(Mix(h, dtype), static_cast<uint64_t>(in)), static_cast<uint64_t>(out));
    if (i < kMaxEntries) {
      f.dtype[i] = dtype;
      f.in_numel[i] = in;
      f.out_numel[i] = out;
    }
  }
  f.entry_hash = h;
  return f;
}

bool CallFingerprint::Matches(const CallFingerprint& o) const {
  return seq == o.seq && kind == o.kind && op == o.op && root == o.root && entries == o.entries &&
         entry_hash == o.entry_hash;
}

std::string CallFingerprint::ToString() const {
  std::ostringstream os;
  os << CollectiveName(static_cast<CollectiveKind>(kind)) << " #" << seq;
  if (static_cast<CollectiveKind>(kind) == CollectiveKind::kBarrier) return os.str();
  os << " (";
  for (int i = 0; i < entries && i < kMaxEntries; ++i) {
    if (i > 0) os << ", ";
    os << DTypeName(static_cast<DType>(dtype[i])) << " " << in_numel[i];
    if (in_numel[i] != out_numel[i]) os << " -> " << out_numel[i];
  }
  if (entries > kMaxEntries) os << ", ... " << entries << " tensors";
  if (op != 0) os << ", " << ReduceOpName(static_cast<ReduceOp>(op));
  if (static_cast<CollectiveKind>(kind) == CollectiveKind::kBroadcast) os << ", root " << root;
  os << ")";
  return os.str();
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

std::string NameRanks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + RankList(ranks);
}

Status CompareFingerprints(const std::vector<CallFingerprint>& per_rank, const std::string& who) {
  for (size_t r = 1; r < per_rank.size(); ++r) {
    if (!per_rank[r].Matches(per_rank[0])) {
      return InvalidArgumentError(who + ": collectives do not match across ranks (desync): rank 0 called " +
                                  per_rank[0].ToString() + " but rank " + std::to_string(r) +
                                  " called " + per_rank[r].ToString());
    }
  }
  return OkStatus();
}

Status ProcessGroup::Invalid(const std::string& what) const {
  return InvalidArgumentError(backend_name() + " group rank " + std::to_string(rank_) + " of " +
                              std::to_string(size_) + ": " + what);
}

Status ProcessGroup::ValidateTensor(const Tensor& t, const char* role, size_t index,
                                    const Stream& stream) const {
  std::string name = std::string(role) + "[" + std::to_string(index) + "]";
  if (!t.defined()) return Invalid(name + " is an undefined tensor");
  if (!ValidateDType(t.dtype()).ok()) return Invalid(name + " has invalid dtype");
  if (t.device().kind != stream.device().kind) {
    return Invalid(name + " is on " + t.device().ToString() + " but the stream '" + stream.name() +
                   "' is on " + stream.device().ToString());
  }
  return OkStatus();
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::SubmitStagedFromHost(Collective c, Stream& stream) {
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(stream.device()));
  // Device buffers: freed once the copies back are complete; left allocated
  // (a bounded leak) when the collective did not complete, since a kernel may
  // still write them.
  struct Buffers {
    Device* device;
    std::vector<std::pair<void*, size_t>> raw;
    bool release = false;
    ~Buffers() {
      if (!release) return;
      for (auto& [p, n] : raw) device->RawFree(p, n);
    }
  } buffers{device, {}};
  auto stage = [&](const Tensor& t) -> StatusOr<Tensor> {
    const size_t n = std::max<size_t>(t.nbytes(), 16);
    SK_ASSIGN_OR_RETURN(void* p, device->RawAllocate(n));
    buffers.raw.emplace_back(p, n);
    return Tensor(Storage::Wrap(p, n, stream.device()), t.dtype(), t.shape());
  };
  Collective staged = c;
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    const Tensor& out = c.outputs[i];
    const Tensor& in = c.inputs[i];
    if (!KindCapabilities(out.device().kind).host_memory ||
        !KindCapabilities(in.device().kind).host_memory) {
      return Invalid(std::string(CollectiveName(c.kind)) + " mixes host and device tensors on stream '" +
                     stream.name() + "' of " + stream.device().ToString());
    }
    SK_ASSIGN_OR_RETURN(staged.outputs[i], stage(out));
    const char* ob = static_cast<const char*>(out.data());
    const char* ib = static_cast<const char*>(in.data());
    if (ib >= ob && ib + in.nbytes() <= ob + out.nbytes()) {
      // In place (all_gather's own chunk, all_reduce, broadcast): the same
      // relation between the staged buffers.
      SK_ASSIGN_OR_RETURN(staged.inputs[i],
                          staged.outputs[i].View(static_cast<size_t>(ib - ob), in.dtype(), in.shape()));
    } else {
      SK_ASSIGN_OR_RETURN(staged.inputs[i], stage(in));
    }
    if (in.nbytes() > 0) {
      SK_RETURN_IF_ERROR(device->CopyAsync(staged.inputs[i].data(), in.data(), in.nbytes(), stream));
    }
  }
  const Duration timeout = c.timeout;
  const std::vector<Tensor> staged_outputs = staged.outputs;
  SK_ASSIGN_OR_RETURN(std::shared_ptr<Work> w, Submit(std::move(staged), stream));
  SK_RETURN_IF_ERROR(w->wait(timeout));
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    if (c.outputs[i].nbytes() == 0) continue;
    SK_RETURN_IF_ERROR(device->CopyAsync(c.outputs[i].data(), staged_outputs[i].data(),
                                         c.outputs[i].nbytes(), stream));
  }
  SK_RETURN_IF_ERROR(stream.Synchronize(timeout).WithContext("copying a collective's result to the host"));
  buffers.release = true;
  return w;
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::Submit(Collective c, Stream& stream) {
  if (KindCapabilities(stream.device().kind).device_memory()) {
    auto on_host = [](const Tensor& t) {
      return t.defined() && KindCapabilities(t.device().kind).host_memory;
    };
    bool host = false;
    for (const Tensor& t : c.outputs) host |= on_host(t);
    for (const Tensor& t : c.inputs) host |= on_host(t);
    if (host) return SubmitStagedFromHost(std::move(c), stream);
  }
  if (c.timeout.count() <= 0) {
    return Invalid(std::string(CollectiveName(c.kind)) + " with a non-positive timeout (" +
                   std::to_string(c.timeout.count()) + " ms)");
  }
  if (c.inputs.size() != c.outputs.size()) {
    return Invalid(std::string(CollectiveName(c.kind)) + " with " + std::to_string(c.outputs.size()) +
                   " outputs but " + std::to_string(c.inputs.size()) + " inputs");
  }
  if (c.kind != CollectiveKind::kBarrier && c.outputs.empty()) {
    return Invalid(std::string(CollectiveName(c.kind)) + " with no tensors");
  }
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    const Tensor& in = c.inputs[i];
    const Tensor& out = c.outputs[i];
    SK_RETURN_IF_ERROR(ValidateTensor(in, "input", i, stream));
    SK_RETURN_IF_ERROR(ValidateTensor(out, "output", i, stream));
    if (in.dtype() != out.dtype()) {
      return Invalid(std::string(CollectiveName(c.kind)) + " input[" + std::to_string(i) + "] is " +
                     std::string(DTypeName(in.dtype())) + " but output is " +
                     std::string(DTypeName(out.dtype())));
    }
    if (c.kind == CollectiveKind::kAllGather) {
      if (out.numel() != in.numel() * size_) {
        return Invalid("all_gather output[" + std::to_string(i) + "] has " +
                       std::to_string(out.numel()) + " elements, expected input's " +
                       std::to_string(in.numel()) + " x " + std::to_string(size_) + " ranks");
      }
      const char* own_chunk = static_cast<const char*>(out.data()) + rank_ * in.nbytes();
      bool in_place = in.data() == own_chunk;
      if (!in_place && Overlap(in, out)) {
        return Invalid("all_gather input[" + std::to_string(i) +
                       "] overlaps its output other than as this rank's chunk");
      }
    } else if (c.kind == CollectiveKind::kReduceScatter) {
      if (in.numel() != out.numel() * size_) {
        return Invalid("reduce_scatter input[" + std::to_string(i) + "] has " +
                       std::to_string(in.numel()) + " elements, expected output's " +
                       std::to_string(out.numel()) + " x " + std::to_string(size_) + " ranks");
      }
      if (Overlap(in, out)) {
        return Invalid("reduce_scatter input[" + std::to_string(i) + "] overlaps its output");
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (Overlap(c.outputs[i], c.outputs[j])) {
        return Invalid(std::string(CollectiveName(c.kind)) + " output[" + std::to_string(i) +
                       "] overlaps output[" + std::to_string(j) + "]");
      }
    }
  }
  if (c.kind == CollectiveKind::kReduceScatter || c.kind == CollectiveKind::kAllReduce) {
    if (c.op != ReduceOp::kSum && c.op != ReduceOp::kAvg) {
      return Invalid("unknown reduce op " + std::to_string(static_cast<int>(c.op)));
    }
    if (!std::isfinite(c.pre_scale) || !std::isfinite(c.post_scale)) {
      return Invalid("pre_scale and post_scale must be finite (got " + std::to_string(c.pre_scale) +
                     ", " + std::to_string(c.post_scale) + ")");
    }
  }
  if (c.kind == CollectiveKind::kBroadcast && (c.root < 0 || c.root >= size_)) {
    return Invalid("broadcast root " + std::to_string(c.root) + " is not a rank of a group of " +
                   std::to_string(size_));
  }
  std::lock_guard<std::mutex> lock(launch_mu_);
  c.seq = next_seq_;
  if (flight_recorder_ != nullptr) flight_recorder_->Enqueued(c);
  const uint64_t seq = c.seq;
  StatusOr<std::shared_ptr<Work>> work = Launch(std::move(c), stream);
  if (work.ok()) {
    ++next_seq_;
  } else if (flight_recorder_ != nullptr) {
    flight_recorder_->Ended(seq, work.status());
  }
  return work;
}

Status ProcessGroup::FailPeers(const Status&) { return OkStatus(); }

uint64_t ProcessGroup::ReserveSequence() {
  std::lock_guard<std::mutex> lock(launch_mu_);
  return next_seq_++;
}

uint64_t ProcessGroup::next_sequence() {
  std::lock_guard<std::mutex> lock(launch_mu_);
  return next_seq_;
}

void ProcessGroup::ResumeAt(uint64_t next_seq) {
  std::lock_guard<std::mutex> lock(launch_mu_);
  if (next_seq < next_seq_) return;
  next_seq_ = next_seq;
  OnResume(next_seq);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::all_gather(const Tensor& output, const Tensor& input,
                                                         Stream& stream,
                                                         const CollectiveOptions& opts) {
  return all_gather_coalesced({output}, {input}, stream, opts);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::all_gather_coalesced(
    const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs, Stream& stream,
    const CollectiveOptions& opts) {
  Collective c;
  c.kind = CollectiveKind::kAllGather;
  c.inputs = inputs;
  c.outputs = outputs;
  c.timeout = opts.timeout;
  c.label = opts.label;
  return Submit(std::move(c), stream);
}

namespace {
// A reduce-scatter or all-reduce call as backends receive it.
Collective Reduction(CollectiveKind kind, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& outputs, const ReduceOptions& opts) {
  Collective c;
  c.kind = kind;
  c.inputs = inputs;
  c.outputs = outputs;
  c.op = opts.op;
  c.pre_scale = opts.pre_scale;
  c.post_scale = opts.post_scale;
  c.timeout = opts.timeout;
  c.label = opts.label;
  return c;
}
}  // namespace

StatusOr<std::shared_ptr<Work>> ProcessGroup::reduce_scatter(const Tensor& output,
                                                             const Tensor& input, Stream& stream,
                                                             const ReduceOptions& opts) {
  return reduce_scatter_coalesced({output}, {input}, stream, opts);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::reduce_scatter_coalesced(
    const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs, Stream& stream,
    const ReduceOptions& opts) {
  return Submit(Reduction(CollectiveKind::kReduceScatter, inputs, outputs, opts), stream);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::all_reduce(const Tensor& tensor, Stream& stream,
                                                         const ReduceOptions& opts) {
  return all_reduce_coalesced({tensor}, stream, opts);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::all_reduce_coalesced(
    const std::vector<Tensor>& tensors, Stream& stream, const ReduceOptions& opts) {
  return Submit(Reduction(CollectiveKind::kAllReduce, tensors, tensors, opts), stream);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::broadcast(const Tensor& tensor, Stream& stream,
                                                        const BroadcastOptions& opts) {
  return broadcast_coalesced({tensor}, stream, opts);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::broadcast_coalesced(
    const std::vector<Tensor>& tensors, Stream& stream, const BroadcastOptions& opts) {
  Collective c;
  c.kind = CollectiveKind::kBroadcast;
  c.inputs = tensors;
  c.outputs = tensors;
  c.root = opts.root;
  c.timeout = opts.timeout;
  c.label = opts.label;
  return Submit(std::move(c), stream);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::barrier(Stream& stream,
                                                      const CollectiveOptions& opts) {
  Collective c;
  c.kind = CollectiveKind::kBarrier;
  c.timeout = opts.timeout;
  c.label = opts.label;
  return Submit(std::move(c), stream);
}

StatusOr<std::shared_ptr<Work>> ProcessGroup::EnqueueOnStream(std::string description,
                                                              Stream& stream,
                                                              std::function<Status()> body) {
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(stream.device()));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device->CreateEvent());
  auto work = std::make_shared<Work>(std::move(description), std::move(event));
  SK_RETURN_IF_ERROR(stream.Enqueue([work, body = std::move(body)]() -> Status {
    Status s = body();
    if (!s.ok()) s = s.WithContext(work->description());
    work->SetStatus(s);
    return s;
  }));
  SK_RETURN_IF_ERROR(work->mutable_event().Record(stream));
  return work;
}

Status ValidateGroupRanks(const std::vector<int>& ranks, int world, int self) {
  if (ranks.empty()) return InvalidArgumentError("a group needs at least one rank");
  bool has_self = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world) {
      return InvalidArgumentError("rank " + std::to_string(ranks[i]) +
                                  " is not in a group of size " + std::to_string(world));
    }
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      return InvalidArgumentError("group ranks must be sorted and distinct");
    }
    has_self |= ranks[i] == self;
  }
  if (!has_self) {
    return InvalidArgumentError("rank " + std::to_string(self) +
                                " creates a group it is not a member of");
  }
  return OkStatus();
}

StatusOr<SubGroupNames::Entry> SubGroupNames::Next(const std::vector<int>& ranks, int world, int self) {
  SK_RETURN_IF_ERROR(ValidateGroupRanks(ranks, world, self));
  Entry e;
  e.ranks = RankList(ranks);
  {
    std::lock_guard<std::mutex> lock(mu_);
    e.occurrence = counts_[e.ranks]++;
  }
  e.sub_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), self) - ranks.begin());
  return e;
}

std::vector<int> SubGroupNames::GlobalRanks(const std::vector<int>& ranks,
                                            const std::vector<int>& global_ranks) {
  std::vector<int> global;
  global.reserve(ranks.size());
  for (int r : ranks) global.push_back(global_ranks[r]);
  return global;
}

}  // namespace sk::comm
