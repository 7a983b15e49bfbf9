// The backend-independent specification of every collective: each op x dtype
// against the serial reference, run by every backend's test.
#ifndef SHARDKIT_TESTS_COMM_CONFORMANCE_H_
#define SHARDKIT_TESTS_COMM_CONFORMANCE_H_

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/memory/caching_allocator.h"
#include "tests/comm/comm_test_util.h"

namespace sk::comm::testing {

inline float RoundTo(DType dtype, float v) {
  if (dtype == DType::kBF16) return BF16ToFloat(FloatToBF16(v));
  if (dtype == DType::kF16) return F16ToFloat(FloatToF16(v));
  return v;
}

// Rank j's input element i in every conformance check.
inline float InputValue(DType dtype, int rank, int64_t i) {
  return RoundTo(dtype, TestValue(static_cast<uint64_t>(rank) * 7919 + 1, i));
}

// Fills `t` with rank `rank`'s conformance inputs.
inline void FillRank(const Tensor& t, int rank) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    StoreFromFloat(t.data(), t.dtype(), i, InputValue(t.dtype(), rank, i));
  }
}

struct OpCase {
  CollectiveKind kind;
  DType dtype;
  int64_t n;  // per-rank elements: all_gather input, reduce_scatter output, the buffer otherwise
  ReduceOptions reduce;
};

// Tensors of a check on a GPU: device copies of the host tensors, moved in
// before the collective and out after it, in the stream's order.
class Staging {
 public:
  explicit Staging(Stream* stream) : stream_(stream) {}
  bool on_host() const { return stream_->device().is_cpu(); }
  // `host` itself on CPU; a device tensor holding its contents otherwise.
  Tensor In(const Tensor& host) {
    if (on_host()) return host;
    StatusOr<CachingAllocator*> alloc = CachingAllocator::ForDevice(stream_->device());
    CHECK(alloc.ok()) << alloc.status();
    auto storage = (*alloc)->Allocate(host.nbytes(), stream_);
    CHECK(storage.ok()) << storage.status();
    Tensor dev(std::move(storage).value(), host.dtype(), host.shape());
    CHECK(Copy(dev.data(), host.data(), host.nbytes()).ok());
    pairs_.push_back({host, dev});
    return dev;
  }
  // Copies every device tensor back into its host tensor and waits.
  Status Out() {
    for (auto& [host, dev] : pairs_) SK_RETURN_IF_ERROR(Copy(host.data(), dev.data(), host.nbytes()));
    return stream_->Synchronize(std::chrono::seconds(60));
  }

 private:
  Status Copy(void* dst, const void* src, size_t bytes) {
    SK_ASSIGN_OR_RETURN(Device * device, Device::Get(stream_->device()));
    return device->CopyAsync(dst, src, bytes, *stream_);
  }
  Stream* stream_;
  std::vector<std::pair<Tensor, Tensor>> pairs_;
};

// Runs `c` on rank `rank` of `group` and checks the result against the
// serial reference. Runs on the calling thread (one per rank). The tensors
// live on cpu:rank, or on `device` when given (a GPU: staged through host
// memory).
inline void CheckOnRank(ProcessGroup& group, const OpCase& c,
                        std::optional<DeviceId> device = std::nullopt) {
  const int rank = group.rank();
  const int world = group.size();
  const DType dt = c.dtype;
  std::unique_ptr<Stream> stream;
  if (device.has_value()) {
    StatusOr<Device*> d = Device::Get(*device);
    ASSERT_TRUE(d.ok()) << d.status();
    auto s = (*d)->CreateStream("comm rank " + std::to_string(rank));
    ASSERT_TRUE(s.ok()) << s.status();
    stream = std::move(s).value();
  } else {
    stream = MakeStream(rank, "comm");
  }
  Staging staging(stream.get());
  Tensor input, output;
  StatusOr<std::shared_ptr<Work>> work = InternalError("unset");
  const int root = world - 1;
  switch (c.kind) {
    case CollectiveKind::kAllGather:
      input = MakeTensor(rank, dt, c.n);
      output = MakeTensor(rank, dt, c.n * world);
      for (int64_t i = 0; i < c.n; ++i) StoreFromFloat(input.data(), dt, i, InputValue(dt, rank, i));
      work = group.all_gather(staging.In(output), staging.In(input), *stream);
      break;
    case CollectiveKind::kReduceScatter:
      input = MakeTensor(rank, dt, c.n * world);
      output = MakeTensor(rank, dt, c.n);
      for (int64_t i = 0; i < c.n * world; ++i) {
        StoreFromFloat(input.data(), dt, i, InputValue(dt, rank, i));
      }
      work = group.reduce_scatter(staging.In(output), staging.In(input), *stream, c.reduce);
      break;
    case CollectiveKind::kAllReduce:
      output = MakeTensor(rank, dt, c.n);
      for (int64_t i = 0; i < c.n; ++i) StoreFromFloat(output.data(), dt, i, InputValue(dt, rank, i));
      work = group.all_reduce(staging.In(output), *stream, c.reduce);
      break;
    case CollectiveKind::kBroadcast:
      output = MakeTensor(rank, dt, c.n);
      for (int64_t i = 0; i < c.n; ++i) StoreFromFloat(output.data(), dt, i, InputValue(dt, rank, i));
      work = group.broadcast(staging.In(output), *stream, BroadcastOptions{root});
      break;
    case CollectiveKind::kBarrier:
      work = group.barrier(*stream);
      break;
  }
  ASSERT_TRUE(work.ok()) << work.status();
  Status s = (*work)->wait(std::chrono::seconds(60));
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE((*work)->is_completed());
  if (c.kind == CollectiveKind::kBarrier) return;
  s = staging.Out();
  ASSERT_TRUE(s.ok()) << s;

  std::vector<float> want(static_cast<size_t>(output.numel()));
  std::vector<float> per_rank(world);
  for (int64_t i = 0; i < output.numel(); ++i) {
    switch (c.kind) {
      case CollectiveKind::kAllGather:
        want[i] = InputValue(dt, static_cast<int>(i / c.n), i % c.n);
        break;
      case CollectiveKind::kReduceScatter:
        for (int j = 0; j < world; ++j) per_rank[j] = InputValue(dt, j, rank * c.n + i);
        want[i] = ReferenceReduce(per_rank, dt, c.reduce.op, c.reduce.pre_scale, c.reduce.post_scale);
        break;
      case CollectiveKind::kAllReduce:
        for (int j = 0; j < world; ++j) per_rank[j] = InputValue(dt, j, i);
        want[i] = ReferenceReduce(per_rank, dt, c.reduce.op, c.reduce.pre_scale, c.reduce.post_scale);
        break;
      case CollectiveKind::kBroadcast:
        want[i] = InputValue(dt, root, i);
        break;
      case CollectiveKind::kBarrier:
        break;
    }
  }
  EXPECT_TRUE(BitsEqual(Values(output), want))
      << CollectiveName(c.kind) << " " << DTypeName(dt) << " world " << world << " n " << c.n
      << " rank " << rank;
}

inline void CheckOnAllRanks(const std::vector<std::unique_ptr<ProcessGroup>>& groups,
                            const OpCase& c, std::optional<DeviceId> device = std::nullopt) {
  RunRanks(static_cast<int>(groups.size()), [&](int r) { CheckOnRank(*groups[r], c, device); });
}

}  // namespace sk::comm::testing

#endif  // SHARDKIT_TESTS_COMM_CONFORMANCE_H_
