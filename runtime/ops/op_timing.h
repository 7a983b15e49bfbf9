// Timing of the ops as a real run executes them: what the simulator's
// cpu-local calibration (//benchmarks:calibrate) measures inside training
// steps, so that op rates come from the state a step leaves the caches,
// allocator and dispatcher in rather than from hot loops, and the per-op
// kernel time of a GPU step (//benchmarks:gpu_train's breakdown).
//
// While an observer is installed, every op that executes on a cpu device
// reports, after its kernel returns, its declared cost (cost.h) and the
// seconds of the backend's run on the observer's clock (wall time, or the
// running thread's CPU time, which excludes time the thread was not
// scheduled on a machine shared with other work): the kernel, plus F32Staging's
// widening and narrowing for 16-bit operands; not the dispatcher's
// validation and accounting, which are host work around the op. Ops that
// fail validation are not reported.
//
// Ops on other executing device kinds (cuda) are reported only to an
// observer whose clock is kDeviceEvents: the dispatcher records a timing
// Event on ctx.stream before and after the backend's method, waits for the
// second and reports the time between them -- the op's kernels (and the
// copies and memsets it enqueues) on the device. (Such an observer gets cpu
// ops on the wall clock.) The host then waits for
// every op, so a step timed this way is slower than one that is not; the
// per-op times are what a breakdown wants. Ops without a stream are not
// reported.
//
// Off (no observer): one relaxed atomic load per op.
//
// Thread safety: SetOpTimingObserver may be called from any thread.
// OnOp is called on the thread that ran the op, concurrently from several
// threads when several run ops (rank threads); it must be thread-safe and
// must not call ops. An observer must stay alive until it has been removed
// and no op that could have seen it is still running.
#ifndef SHARDKIT_RUNTIME_OPS_OP_TIMING_H_
#define SHARDKIT_RUNTIME_OPS_OP_TIMING_H_

#include "runtime/ops/cost.h"

namespace sk::ops {

class OpTimingObserver {
 public:
  enum class Clock { kWall, kThreadCpu, kDeviceEvents };
  virtual ~OpTimingObserver() = default;
  // The clock `seconds` is read from; asked once per op.
  virtual Clock clock() const { return Clock::kWall; }
  // `cost` as the dispatcher priced the op; `seconds` its run's time.
  virtual void OnOp(const OpCost& cost, double seconds) = 0;
};

// Installs `observer` (not owned) for every thread; nullptr removes it.
// Replaces any observer installed before.
void SetOpTimingObserver(OpTimingObserver* observer);

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_OP_TIMING_H_
