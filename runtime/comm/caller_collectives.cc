#include "runtime/comm/caller_collectives.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace sk::comm {

namespace {

float Load(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: return BF16ToFloat(static_cast<const BF16*>(p)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const F16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

}  // namespace

StatusOr<std::unique_ptr<CallerCollectives>> CallerCollectives::Create(ProcessGroup* group,
                                                                       Duration timeout) {
  if (group == nullptr) return InvalidArgumentError("caller collectives need a process group");
  const DeviceId id = group->bound_device().value_or(DeviceId::Cpu(group->rank()));
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(id));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream("caller collectives"));
  return std::unique_ptr<CallerCollectives>(new CallerCollectives(group, device, std::move(stream), timeout));
}

StatusOr<Tensor> CallerCollectives::Wrap(const void* data, int64_t count, DType dtype,
                                         const char* what) const {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return InvalidArgumentError(std::string(what) + ": dtype must be f32, bf16 or f16, not " +
                                std::string(DTypeName(dtype)));
  }
  if (count < 0) return InvalidArgumentError(std::string(what) + ": count " + std::to_string(count) + " is negative");
  if (data == nullptr && count > 0) {
    return InvalidArgumentError(std::string(what) + " is NULL with count " + std::to_string(count));
  }
  const DeviceId want = device_->id();
  const std::optional<DeviceId> at = Device::PointerDevice(data);
  if (want.is_cpu() && at.has_value()) {
    return InvalidArgumentError(std::string(what) + " points into " + at->ToString() + " memory, but the " +
                                group_->backend_name() + " group moves host buffers");
  }
  if (want.is_cuda() && count > 0 && (!at.has_value() || *at != want)) {
    return InvalidArgumentError(std::string(what) + " is " + (at ? at->ToString() + " memory" : "host memory") +
                                ", but the " + group_->backend_name() + " group moves buffers of " +
                                want.ToString());
  }
  return Tensor::Wrap(const_cast<void*>(data), dtype, Shape{count}, want);
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

Status CallerCollectives::AllReduce(void* data, int64_t count, DType dtype, CallerReduceOp op) {
  SK_ASSIGN_OR_RETURN(Tensor t, Wrap(data, count, dtype, "all_reduce buffer"));
  switch (op) {
    case CallerReduceOp::kSum:
    case CallerReduceOp::kMean: {
      ReduceOptions o;
      o.op = op == CallerReduceOp::kSum ? ReduceOp::kSum : ReduceOp::kAvg;
      o.timeout = timeout_;
      o.label = "caller all_reduce";
      return Wait(group_->all_reduce(t, *stream_, o), "all_reduce of the caller's buffer");
    }
    case CallerReduceOp::kMax: break;
    default:
      return InvalidArgumentError("all_reduce op " + std::to_string(static_cast<int>(op)) +
                                  " is not sum (1), mean (2) or max (3)");
  }
  // MAX: gather every rank's values, take the elementwise max here.
  const size_t elem = DTypeSize(dtype);
  const size_t bytes = static_cast<size_t>(count) * elem;
  const int n = group_->size();
  std::vector<unsigned char> host(bytes * static_cast<size_t>(n));
  std::vector<unsigned char> mine(bytes);
  void* gathered = host.data();
  void* device_gathered = nullptr;
  if (!device_->id().is_cpu() && bytes > 0) {
    SK_ASSIGN_OR_RETURN(device_gathered, device_->RawAllocate(bytes * static_cast<size_t>(n)));
    gathered = device_gathered;
  }
  auto release = [&] {
    if (device_gathered != nullptr) device_->RawFree(device_gathered, bytes * static_cast<size_t>(n));
  };
  StatusOr<Tensor> out = Tensor::Wrap(gathered, dtype, Shape{count * n}, device_->id());
  if (!out.ok()) {
    release();
    return out.status();
  }
  CollectiveOptions o;
  o.timeout = timeout_;
  o.label = "caller all_reduce max";
  Status s = Wait(group_->all_gather(*out, t, *stream_, o), "all_reduce (max) of the caller's buffer");
  if (s.ok() && device_gathered != nullptr) {
    s = device_->CopyAsync(host.data(), device_gathered, host.size(), *stream_);
    if (s.ok()) s = stream_->Synchronize(timeout_);
  }
  release();
  SK_RETURN_IF_ERROR(s);
  // The result in `mine` (any rank's value bits: the max is one of them).
  for (int64_t i = 0; i < count; ++i) {
    int best = 0;
    for (int r = 1; r < n; ++r) {
      const float v = Load(host.data() + static_cast<size_t>(r) * bytes, dtype, i);
      const float b = Load(host.data() + static_cast<size_t>(best) * bytes, dtype, i);
      if (v > b || (v != v && b == b)) best = r;  // NaN wins, as torch's max
    }
    std::memcpy(mine.data() + static_cast<size_t>(i) * elem,
                host.data() + static_cast<size_t>(best) * bytes + static_cast<size_t>(i) * elem, elem);
  }
  if (bytes == 0) return OkStatus();
  SK_RETURN_IF_ERROR(device_->CopyAsync(data, mine.data(), bytes, *stream_));
  return stream_->Synchronize(timeout_);
}

Status CallerCollectives::Broadcast(void* data, int64_t count, DType dtype, int root) {
  if (root < 0 || root >= group_->size()) {
    return OutOfRangeError("broadcast root " + std::to_string(root) + " is not a rank of the group (size " +
                           std::to_string(group_->size()) + ")");
  }
  SK_ASSIGN_OR_RETURN(Tensor t, Wrap(data, count, dtype, "broadcast buffer"));
  BroadcastOptions o;
  o.root = root;
  o.timeout = timeout_;
  o.label = "caller broadcast";
  return Wait(group_->broadcast(t, *stream_, o), "broadcast of the caller's buffer");
}

Status CallerCollectives::AllGather(const void* input, void* output, int64_t count, DType dtype) {
  SK_ASSIGN_OR_RETURN(Tensor in, Wrap(input, count, dtype, "all_gather input"));
  SK_ASSIGN_OR_RETURN(Tensor out, Wrap(output, count * group_->size(), dtype, "all_gather output"));
  const auto* ib = static_cast<const unsigned char*>(input);
  const auto* ob = static_cast<const unsigned char*>(output);
  const size_t in_bytes = static_cast<size_t>(count) * DTypeSize(dtype);
  if (count > 0 && ib < ob + in_bytes * static_cast<size_t>(group_->size()) && ob < ib + in_bytes) {
    return InvalidArgumentError("all_gather input and output overlap");
  }
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
