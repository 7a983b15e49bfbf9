// The backend-independent specification of every collective: each op x dtype
// against the serial reference, run by every backend's test.
#ifndef SHARDKIT_TESTS_COMM_CONFORMANCE_H_
#define SHARDKIT_TESTS_COMM_CONFORMANCE_H_

#include <memory>
#include <vector>

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

struct OpCase {
  CollectiveKind kind;
  DType dtype;
  int64_t n;  // per-rank elements: all_gather input, reduce_scatter output, the buffer otherwise
  ReduceOptions reduce;
};

// Runs `c` on rank `rank` of `group` and checks the result against the
// serial reference. Runs on the calling thread (one per rank).
inline void CheckOnRank(ProcessGroup& group, const OpCase& c) {
  const int rank = group.rank();
  const int world = group.size();
  const DType dt = c.dtype;
  std::unique_ptr<Stream> stream = MakeStream(rank, "comm");
  Tensor input, output;
  StatusOr<std::shared_ptr<Work>> work = InternalError("unset");
  const int root = world - 1;
  switch (c.kind) {
    case CollectiveKind::kAllGather:
      input = MakeTensor(rank, dt, c.n);
      output = MakeTensor(rank, dt, c.n * world);
      for (int64_t i = 0; i < c.n; ++i) StoreFromFloat(input.data(), dt, i, InputValue(dt, rank, i));
      work = group.all_gather(output, input, *stream);
      break;
    case CollectiveKind::kReduceScatter:
      input = MakeTensor(rank, dt, c.n * world);
      output = MakeTensor(rank, dt, c.n);
      for (int64_t i = 0; i < c.n * world; ++i) {
        StoreFromFloat(input.data(), dt, i, InputValue(dt, rank, i));
      }
      work = group.reduce_scatter(output, input, *stream, c.reduce);
      break;
    case CollectiveKind::kAllReduce:
      output = MakeTensor(rank, dt, c.n);
      for (int64_t i = 0; i < c.n; ++i) StoreFromFloat(output.data(), dt, i, InputValue(dt, rank, i));
      work = group.all_reduce(output, *stream, c.reduce);
      break;
    case CollectiveKind::kBroadcast:
      output = MakeTensor(rank, dt, c.n);
      for (int64_t i = 0; i < c.n; ++i) StoreFromFloat(output.data(), dt, i, InputValue(dt, rank, i));
      work = group.broadcast(output, *stream, BroadcastOptions{root});
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
                            const OpCase& c) {
  RunRanks(static_cast<int>(groups.size()), [&](int r) { CheckOnRank(*groups[r], c); });
}

}  // namespace sk::comm::testing

#endif  // SHARDKIT_TESTS_COMM_CONFORMANCE_H_
