#include "runtime/comm/caller_collectives.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace sk::comm {

namespace {

size_t ElementSize(CallerDType t) {
  switch (t) {
    case CallerDType::kBF16:
    case CallerDType::kF16: return 2;
    case CallerDType::kF32:
    case CallerDType::kI32: return 4;
    case CallerDType::kF64:
    case CallerDType::kI64: return 8;
  }
  return 0;
}

bool Known(CallerDType t) { return ElementSize(t) != 0; }
bool IsInteger(CallerDType t) { return t == CallerDType::kI32 || t == CallerDType::kI64; }

// Element i of buffer p as a double (bf16/f16/f32/f64) for comparisons.
double LoadFloat(const unsigned char* p, CallerDType dtype, int64_t i) {
  switch (dtype) {
    case CallerDType::kBF16: return BF16ToFloat(reinterpret_cast<const BF16*>(p)[i]);
    case CallerDType::kF16: return F16ToFloat(reinterpret_cast<const F16*>(p)[i]);
    case CallerDType::kF64: {
      double v;
      std::memcpy(&v, p + static_cast<size_t>(i) * 8, 8);
      return v;
    }
    default: {
      float v;
      std::memcpy(&v, p + static_cast<size_t>(i) * 4, 4);
      return v;
    }
  }
}

int64_t LoadInt(const unsigned char* p, CallerDType dtype, int64_t i) {
  if (dtype == CallerDType::kI32) {
    int32_t v;
    std::memcpy(&v, p + static_cast<size_t>(i) * 4, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p + static_cast<size_t>(i) * 8, 8);
  return v;
}

// Reduces the n gathered copies (rank-major, `stride` bytes apart) elementwise into
// `out`, in rank order so that every rank computes the same bits.
void ReduceGathered(const unsigned char* gathered, size_t stride, int n, int64_t count, CallerDType dtype,
                    CallerReduceOp op, unsigned char* out) {
  const size_t elem = ElementSize(dtype);
  for (int64_t i = 0; i < count; ++i) {
    unsigned char* dst = out + static_cast<size_t>(i) * elem;
    if (op == CallerReduceOp::kMax || op == CallerReduceOp::kMin) {
      // The winner's bits (NaN wins, as torch's max and min).
      int best = 0;
      for (int r = 1; r < n; ++r) {
        const unsigned char* rv = gathered + static_cast<size_t>(r) * stride;
        const unsigned char* bv = gathered + static_cast<size_t>(best) * stride;
        bool better;
        if (IsInteger(dtype)) {
          const int64_t v = LoadInt(rv, dtype, i), b = LoadInt(bv, dtype, i);
          better = op == CallerReduceOp::kMax ? v > b : v < b;
        } else {
          const double v = LoadFloat(rv, dtype, i), b = LoadFloat(bv, dtype, i);
          better = (op == CallerReduceOp::kMax ? v > b : v < b) || (v != v && b == b);
        }
        if (better) best = r;
      }
      std::memcpy(dst, gathered + static_cast<size_t>(best) * stride + static_cast<size_t>(i) * elem, elem);
      continue;
    }
    // SUM and MEAN of f64 and integer buffers.
    if (IsInteger(dtype)) {
      uint64_t sum = 0;  // wraps, as two's complement addition
      for (int r = 0; r < n; ++r) sum += static_cast<uint64_t>(LoadInt(gathered + static_cast<size_t>(r) * stride, dtype, i));
      if (dtype == CallerDType::kI32) {
        const uint32_t v = static_cast<uint32_t>(sum);
        std::memcpy(dst, &v, 4);
      } else {
        std::memcpy(dst, &sum, 8);
      }
    } else {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += LoadFloat(gathered + static_cast<size_t>(r) * stride, dtype, i);
      if (op == CallerReduceOp::kMean) sum /= n;
      std::memcpy(dst, &sum, 8);
    }
  }
}

}  // namespace

const char* CallerDTypeName(CallerDType t) {
  switch (t) {
    case CallerDType::kF32: return "f32";
    case CallerDType::kBF16: return "bf16";
    case CallerDType::kF16: return "f16";
    case CallerDType::kF64: return "f64";
    case CallerDType::kI32: return "i32";
    case CallerDType::kI64: return "i64";
  }
  return "invalid";
}

StatusOr<std::unique_ptr<CallerCollectives>> CallerCollectives::Create(ProcessGroup* group,
                                                                       Duration timeout) {
  if (group == nullptr) return InvalidArgumentError("caller collectives need a process group");
  const DeviceId id = group->bound_device().value_or(DeviceId::Cpu(group->rank()));
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(id));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream("caller collectives"));
  return std::unique_ptr<CallerCollectives>(new CallerCollectives(group, device, std::move(stream), timeout));
}

StatusOr<Tensor> CallerCollectives::Wrap(const void* data, int64_t count, CallerDType dtype,
                                         const char* what) const {
  if (!Known(dtype)) {
    return InvalidArgumentError(std::string(what) + ": dtype " + std::to_string(static_cast<int>(dtype)) +
                                " is not f32 (1), bf16 (2), f16 (3), f64 (4), i32 (5) or i64 (6)");
  }
  if (count < 0) return InvalidArgumentError(std::string(what) + ": count " + std::to_string(count) + " is negative");
  if (data == nullptr && count > 0) {
    return InvalidArgumentError(std::string(what) + " is NULL with count " + std::to_string(count));
  }
  const DeviceId want = device_->id();
  const DeviceCapabilities can = device_->capabilities();
  const std::optional<DeviceId> at = Device::PointerDevice(data);
  if (can.host_memory && at.has_value()) {
    return InvalidArgumentError(std::string(what) + " points into " + at->ToString() + " memory, but the " +
                                group_->backend_name() + " group moves host buffers");
  }
  if (can.device_memory() && count > 0 && (!at.has_value() || *at != want)) {
    return InvalidArgumentError(std::string(what) + " is " + (at ? at->ToString() + " memory" : "host memory") +
                                ", but the " + group_->backend_name() + " group moves buffers of " +
                                want.ToString());
  }
  switch (dtype) {
    case CallerDType::kF32: return Tensor::Wrap(const_cast<void*>(data), DType::kF32, Shape{count}, want);
    case CallerDType::kBF16: return Tensor::Wrap(const_cast<void*>(data), DType::kBF16, Shape{count}, want);
    case CallerDType::kF16: return Tensor::Wrap(const_cast<void*>(data), DType::kF16, Shape{count}, want);
    default: {
      const int64_t words = count * static_cast<int64_t>(ElementSize(dtype) / 4);
      return Tensor::Wrap(const_cast<void*>(data), DType::kF32, Shape{words}, want);
    }
  }
}

Status CallerCollectives::Wait(StatusOr<std::shared_ptr<Work>> work, const std::string& what) {
  if (!work.ok()) return work.status().WithContext(what);
  Status s = (*work)->wait(timeout_);
  if (!s.ok()) {
    // The failed collective's error is also the stream's sticky error: every
    // call here is synchronous, so once the stream has drained it belongs to
    // this call alone. Without clearing it, a later MAX (whose result comes
    // back through this stream) failed with this call's stale error.
    (void)stream_->Synchronize(timeout_);
    stream_->ClearError();
  }
  return s.WithContext(what);
}

Status CallerCollectives::AllReduce(void* data, int64_t count, CallerDType dtype, CallerReduceOp op) {
  SK_ASSIGN_OR_RETURN(Tensor t, Wrap(data, count, dtype, "all_reduce buffer"));
  switch (op) {
    case CallerReduceOp::kSum:
    case CallerReduceOp::kMean:
    case CallerReduceOp::kMax:
    case CallerReduceOp::kMin: break;
    default:
      return InvalidArgumentError("all_reduce op " + std::to_string(static_cast<int>(op)) +
                                  " is not sum (1), mean (2), max (3) or min (4)");
  }
  if (op == CallerReduceOp::kMean && IsInteger(dtype)) {
    return InvalidArgumentError(std::string("all_reduce MEAN of an ") + CallerDTypeName(dtype) +
                                " buffer: the mean of integers is not an integer (use SUM and divide)");
  }
  const bool backend_sums = dtype == CallerDType::kF32 || dtype == CallerDType::kBF16 || dtype == CallerDType::kF16;
  if (backend_sums && (op == CallerReduceOp::kSum || op == CallerReduceOp::kMean)) {
    ReduceOptions o;
    o.op = op == CallerReduceOp::kSum ? ReduceOp::kSum : ReduceOp::kAvg;
    o.timeout = timeout_;
    o.label = "caller all_reduce";
    return Wait(group_->all_reduce(t, *stream_, o), "all_reduce of the caller's buffer");
  }
  return GatherAndReduce(data, t, count, dtype, op);
}

// Every rank gathers each rank's buffer followed by a 4-byte tag of its
// call (dtype and op): the backends compare element counts and wire dtypes
// only, so an f64 SUM on one rank and an i64 MAX (or a count of i32 twice
// as long) on another would otherwise reduce each other's bytes.
Status CallerCollectives::GatherAndReduce(void* data, const Tensor& t, int64_t count, CallerDType dtype,
                                          CallerReduceOp op) {
  const size_t bytes = static_cast<size_t>(count) * ElementSize(dtype);
  const size_t wire = DTypeSize(t.dtype());
  const size_t stride = bytes + sizeof(int32_t);  // one rank's buffer and tag
  const int n = group_->size();
  const int32_t tag = static_cast<int32_t>(dtype) << 8 | static_cast<int32_t>(op);
  std::vector<unsigned char> host(stride * static_cast<size_t>(n));
  std::vector<unsigned char> mine(stride);
  std::memcpy(mine.data() + bytes, &tag, sizeof tag);
  void* in = mine.data();
  void* gathered = host.data();
  void* device_buffer = nullptr;  // input then gathered copies, on a GPU group
  const size_t device_bytes = stride * static_cast<size_t>(n + 1);
  if (!device_->capabilities().host_memory) {
    SK_ASSIGN_OR_RETURN(device_buffer, device_->RawAllocate(device_bytes));
    in = device_buffer;
    gathered = static_cast<unsigned char*>(device_buffer) + stride;
  }
  auto release = [&] {
    if (device_buffer != nullptr) device_->RawFree(device_buffer, device_bytes);
  };
  Status s = OkStatus();
  if (device_buffer != nullptr) {
    s = device_->CopyAsync(in, data, bytes, *stream_);
    if (s.ok()) s = device_->CopyAsync(static_cast<unsigned char*>(in) + bytes, &tag, sizeof tag, *stream_);
    if (s.ok()) s = stream_->Synchronize(timeout_);
  } else if (bytes > 0) {
    std::memcpy(in, data, bytes);
  }
  const int64_t wire_count = static_cast<int64_t>(stride / wire);
  StatusOr<Tensor> in_t = Tensor::Wrap(in, t.dtype(), Shape{wire_count}, device_->id());
  StatusOr<Tensor> out_t = Tensor::Wrap(gathered, t.dtype(), Shape{wire_count * n}, device_->id());
  if (s.ok() && !in_t.ok()) s = in_t.status();
  if (s.ok() && !out_t.ok()) s = out_t.status();
  const char* op_name = op == CallerReduceOp::kMax   ? "max"
                        : op == CallerReduceOp::kMin ? "min"
                        : op == CallerReduceOp::kSum ? "sum"
                                                     : "mean";
  const std::string what = std::string(op_name) + " of " + CallerDTypeName(dtype);
  if (s.ok()) {
    CollectiveOptions o;
    o.timeout = timeout_;
    o.label = "caller all_reduce " + what;
    s = Wait(group_->all_gather(*out_t, *in_t, *stream_, o), "all_reduce (" + what + ") of the caller's buffer");
  }
  if (s.ok() && device_buffer != nullptr) {
    s = device_->CopyAsync(host.data(), gathered, host.size(), *stream_);
    if (s.ok()) s = stream_->Synchronize(timeout_);
  }
  release();
  SK_RETURN_IF_ERROR(s);
  for (int r = 1; r < n; ++r) {
    int32_t theirs, first;
    std::memcpy(&first, host.data() + bytes, sizeof first);
    std::memcpy(&theirs, host.data() + static_cast<size_t>(r) * stride + bytes, sizeof theirs);
    if (theirs == first) continue;
    auto name = [](int32_t tag) {
      const int op = tag & 0xff;
      return std::string(op == 3 ? "max" : op == 4 ? "min" : op == 1 ? "sum" : "mean") + " of " +
             CallerDTypeName(static_cast<CallerDType>(tag >> 8));
    };
    return InvalidArgumentError("all_reduce of the caller's buffer: rank 0 called " + name(first) + " but rank " +
                                std::to_string(r) + " " + name(theirs) + " (every rank must pass the same dtype and op)");
  }
  if (bytes == 0) return OkStatus();
  ReduceGathered(host.data(), stride, n, count, dtype, op, mine.data());
  SK_RETURN_IF_ERROR(device_->CopyAsync(data, mine.data(), bytes, *stream_));
  return stream_->Synchronize(timeout_);
}

// f32, i32, f64 and i64 buffers all travel as f32 words, and the backends
// compare wire dtypes and counts only: an i32 broadcast on one rank and an
// f32 one on another (or f64 against twice as many f32) moved the root's
// bytes into the wrong type, silently. bf16 and f16 keep their own wire
// dtypes, which the backends compare.
Status CallerCollectives::AgreeOnDType(const char* call, CallerDType dtype) {
  if (dtype == CallerDType::kBF16 || dtype == CallerDType::kF16 || group_->size() == 1) return OkStatus();
  const int n = group_->size();
  const int32_t mine = static_cast<int32_t>(dtype);
  std::vector<int32_t> all(static_cast<size_t>(n));
  void* in = const_cast<int32_t*>(&mine);
  void* gathered = all.data();
  void* device_buffer = nullptr;  // this rank's word, then every rank's, on a GPU group
  const size_t device_bytes = sizeof(int32_t) * static_cast<size_t>(n + 1);
  if (!device_->capabilities().host_memory) {
    SK_ASSIGN_OR_RETURN(device_buffer, device_->RawAllocate(device_bytes));
    in = device_buffer;
    gathered = static_cast<int32_t*>(device_buffer) + 1;
  }
  Status s = OkStatus();
  if (device_buffer != nullptr) {
    s = device_->CopyAsync(in, &mine, sizeof mine, *stream_);
    if (s.ok()) s = stream_->Synchronize(timeout_);
  }
  StatusOr<Tensor> in_t = Tensor::Wrap(in, DType::kF32, Shape{1}, device_->id());
  StatusOr<Tensor> out_t = Tensor::Wrap(gathered, DType::kF32, Shape{n}, device_->id());
  if (s.ok() && !in_t.ok()) s = in_t.status();
  if (s.ok() && !out_t.ok()) s = out_t.status();
  if (s.ok()) {
    CollectiveOptions o;
    o.timeout = timeout_;
    o.label = std::string("caller ") + call + " dtypes";
    s = Wait(group_->all_gather(*out_t, *in_t, *stream_, o), std::string(call) + " of the caller's buffer (dtypes)");
  }
  if (s.ok() && device_buffer != nullptr) {
    s = device_->CopyAsync(all.data(), gathered, sizeof(int32_t) * all.size(), *stream_);
    if (s.ok()) s = stream_->Synchronize(timeout_);
  }
  if (device_buffer != nullptr) device_->RawFree(device_buffer, device_bytes);
  SK_RETURN_IF_ERROR(s);
  for (int r = 1; r < n; ++r) {
    if (all[static_cast<size_t>(r)] == all[0]) continue;
    return InvalidArgumentError(std::string(call) + " of the caller's buffer: rank 0 passed " +
                                CallerDTypeName(static_cast<CallerDType>(all[0])) + " but rank " + std::to_string(r) +
                                " " + CallerDTypeName(static_cast<CallerDType>(all[static_cast<size_t>(r)])) +
                                " (every rank must pass the same dtype)");
  }
  return OkStatus();
}

Status CallerCollectives::Broadcast(void* data, int64_t count, CallerDType dtype, int root) {
  if (root < 0 || root >= group_->size()) {
    return OutOfRangeError("broadcast root " + std::to_string(root) + " is not a rank of the group (size " +
                           std::to_string(group_->size()) + ")");
  }
  SK_ASSIGN_OR_RETURN(Tensor t, Wrap(data, count, dtype, "broadcast buffer"));
  SK_RETURN_IF_ERROR(AgreeOnDType("broadcast", dtype));
  BroadcastOptions o;
  o.root = root;
  o.timeout = timeout_;
  o.label = "caller broadcast";
  return Wait(group_->broadcast(t, *stream_, o), "broadcast of the caller's buffer");
}

Status CallerCollectives::AllGather(const void* input, void* output, int64_t count, CallerDType dtype) {
  SK_ASSIGN_OR_RETURN(Tensor in, Wrap(input, count, dtype, "all_gather input"));
  SK_ASSIGN_OR_RETURN(Tensor out, Wrap(output, count * group_->size(), dtype, "all_gather output"));
  const auto* ib = static_cast<const unsigned char*>(input);
  const auto* ob = static_cast<const unsigned char*>(output);
  const size_t in_bytes = static_cast<size_t>(count) * ElementSize(dtype);
  if (count > 0 && ib < ob + in_bytes * static_cast<size_t>(group_->size()) && ob < ib + in_bytes) {
    return InvalidArgumentError("all_gather input and output overlap");
  }
  SK_RETURN_IF_ERROR(AgreeOnDType("all_gather", dtype));
  CollectiveOptions o;
  o.timeout = timeout_;
  o.label = "caller all_gather";
  return Wait(group_->all_gather(out, in, *stream_, o), "all_gather of the caller's buffer");
}

Status CallerCollectives::Barrier() {
  CollectiveOptions o;
  o.timeout = timeout_;
  o.label = "caller barrier";
  return Wait(group_->barrier(*stream_, o), "barrier");
}

}  // namespace sk::comm
