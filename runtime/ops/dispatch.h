// The op dispatcher's shared part, private to //runtime/ops: what every op
// function of ops.h does around its backend call. The op functions live by
// family (gemm_ops.cc, data_ops.cc, elementwise_ops.cc, norm_ops.cc,
// attention_ops.cc, embedding_ops.cc, loss_ops.cc, optimizer_ops.cc) and
// each does the same four steps with the helpers here:
//   1. Resolve: the backend registered for ctx.device's kind (backend.h's
//      registry), or Unavailable naming the op;
//   2. validate: CheckTensor(s), CheckNumel, CheckMatrix, Overlap, RowsOf --
//      InvalidArgument naming the op and the operand (Bad), nothing written;
//   3. price: the op's OpCost (cost.h), once per call;
//   4. Dispatch (or DispatchStaged for the compute-dtype model ops, which
//      widens 16-bit operands through F32Staging for a backend without a
//      16-bit kernel): Account(), then the backend's method if it executes,
//      timed for an installed OpTimingObserver and traced on cpu.
// Everything here is inline, so that each op file compiles these checks into
// its functions: they run on every op call, and the tracking gate counts
// their instructions (benchmarks/track.py).
#ifndef SHARDKIT_RUNTIME_OPS_DISPATCH_H_
#define SHARDKIT_RUNTIME_OPS_DISPATCH_H_

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/core/trace.h"
#include "runtime/ops/backend.h"
#include "runtime/ops/op_timing.h"

namespace sk::ops::internal {

// op_timing.h's observer; null when none (dispatch.cc).
extern std::atomic<OpTimingObserver*> g_timing_observer;

inline std::string N(int64_t v) { return std::to_string(v); }

inline Status Bad(const char* op, const std::string& msg) {
  return InvalidArgumentError(std::string(op) + ": " + msg);
}

inline bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// The backend for ctx, or an error naming the op.
inline StatusOr<OpBackend*> Resolve(const char* op, const OpContext& ctx) {
  if (ctx.device == nullptr) return Bad(op, "OpContext has no device");
  if (ctx.alloc == nullptr) return Bad(op, "OpContext has no allocator");
  DeviceKind kind = ctx.device->id().kind;
  OpBackend* b = BackendFor(kind);
  if (b == nullptr) {
    return UnavailableError(std::string(op) + ": no op backend is registered for device " +
                            ctx.device->id().ToString());
  }
  // A device whose ops run when issued (cpu) needs no stream to order them.
  if (ctx.stream == nullptr && !ctx.device->capabilities().ops_run_when_issued) {
    return Bad(op, "OpContext has no stream (required on " + ctx.device->id().ToString() + ")");
  }
  return b;
}

// Defined, on ctx's device kind, and of one of `dtypes` (empty: any float).
inline Status CheckTensor(const char* op, const char* what, const OpContext& ctx, const Tensor& t,
                          std::initializer_list<DType> dtypes = {}) {
  if (!t.defined()) return Bad(op, std::string(what) + " is undefined");
  if (t.device().kind != ctx.device->id().kind) {
    return Bad(op, std::string(what) + " " + t.ToString() + " is not on the context's device " +
                       ctx.device->id().ToString());
  }
  bool ok = false;
  if (dtypes.size() == 0) {
    ok = IsFloat(t.dtype());
  } else {
    for (DType d : dtypes) ok = ok || t.dtype() == d;
  }
  if (!ok) {
    std::string want;
    if (dtypes.size() == 0) {
      want = "f32, bf16 or f16";
    } else {
      for (DType d : dtypes) want += (want.empty() ? "" : " or ") + std::string(DTypeName(d));
    }
    return Bad(op, std::string(what) + " has dtype " + std::string(DTypeName(t.dtype())) +
                       ", expected " + want);
  }
  return OkStatus();
}

// CheckTensor, of any float dtype, on each name and tensor of
// `what, t, rest...` in order: the first that fails gives the error.
// Variadic and inline so that it compiles to the calls it stands for: out
// of line it cost every op ~25 instructions a tensor (callgrind, gpt-tiny).
inline Status CheckTensors(const char*, const OpContext&) { return OkStatus(); }
template <typename... Rest>
inline Status CheckTensors(const char* op, const OpContext& ctx, const char* what,
                           const Tensor& t, const Rest&... rest) {
  SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, t));
  return CheckTensors(op, ctx, rest...);
}

inline Status CheckNumel(const char* op, const char* what, const Tensor& t, int64_t want) {
  if (t.numel() != want) {
    return Bad(op, std::string(what) + " has " + N(t.numel()) + " elements, expected " + N(want));
  }
  return OkStatus();
}

// `batch` matrices of rows x cols inside m.t.
inline Status CheckMatrix(const char* op, const char* what, const MatrixRef& m, int64_t rows,
                          int64_t cols, int64_t batch) {
  if (m.offset < 0 || m.ld < 0 || m.batch_stride < 0) {
    return Bad(op, std::string(what) + " has a negative offset or stride");
  }
  if (rows == 0 || cols == 0 || batch == 0) return OkStatus();
  if (m.ld < cols) {
    return Bad(op, std::string(what) + " row stride " + N(m.ld) + " is below its " + N(cols) +
                       " columns");
  }
  // The last element touched, in int64 without overflow for sane sizes.
  const int64_t last = m.offset + (batch - 1) * m.batch_stride + (rows - 1) * m.ld + cols - 1;
  if (last >= m.t.numel()) {
    return Bad(op, std::string(what) + ": " + N(batch) + " x [" + N(rows) + ", " + N(cols) +
                       "] at offset " + N(m.offset) + " with row stride " + N(m.ld) +
                       " does not fit in " + m.t.ToString());
  }
  return OkStatus();
}

inline bool Overlap(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  size_t a0 = a.byte_offset(), a1 = a0 + a.nbytes();
  size_t b0 = b.byte_offset(), b1 = b0 + b.nbytes();
  return a0 < b1 && b0 < a1;
}

// Whether any of an op's `outputs` overlaps any of its `inputs`.
inline bool AnyOverlap(std::initializer_list<const Tensor*> outputs,
                       std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* o : outputs) {
    for (const Tensor* i : inputs) {
      if (Overlap(*o, *i)) return true;
    }
  }
  return false;
}

inline bool Same(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.byte_offset() == b.byte_offset() &&
         a.nbytes() == b.nbytes();
}

// The calling thread's CPU time in seconds.
inline double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Runs `run`, reporting its time on the observer's clock (op_timing.h).
template <typename Fn>
Status Timed(OpTimingObserver* observer, const OpCost& cost, Fn run) {
  if (observer->clock() == OpTimingObserver::Clock::kThreadCpu) {
    const double t0 = ThreadCpuSeconds();
    Status s = run();
    const double seconds = ThreadCpuSeconds() - t0;
    if (s.ok()) observer->OnOp(cost, seconds);
    return s;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status s = run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (s.ok()) observer->OnOp(cost, seconds);
  return s;
}

// Runs `run` between two timing events on ctx.stream and reports the
// device time between them (op_timing.h: kDeviceEvents).
template <typename Fn>
Status TimedOnDevice(OpTimingObserver* observer, const OpContext& ctx, const OpCost& cost, Fn run) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> start, ctx.device->CreateEvent(/*enable_timing=*/true));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> end, ctx.device->CreateEvent(/*enable_timing=*/true));
  SK_RETURN_IF_ERROR(start->Record(*ctx.stream));
  SK_RETURN_IF_ERROR(run());
  SK_RETURN_IF_ERROR(end->Record(*ctx.stream));
  SK_RETURN_IF_ERROR(end->Synchronize());
  SK_ASSIGN_OR_RETURN(double ms, start->ElapsedMillis(*end));
  observer->OnOp(cost, ms * 1e-3);
  return OkStatus();
}

// Accounts, then runs `run` on executing backends. Where the op runs when
// issued, on the calling thread (cpu: the thread that plays ctx.stream), a Chrome trace
// being recorded gets the op as a span on its stream's track, as the
// simulator's Account() records it in virtual time; CUDA ops are enqueued,
// so a host-side span would time the launch, not the kernel, and is not
// recorded. Off the trace: one relaxed atomic load.
template <typename Fn>
Status Dispatch(OpBackend* b, const OpContext& ctx, const OpCost& cost, Fn run) {
  SK_RETURN_IF_ERROR(b->Account(ctx, cost));
  if (!b->executes()) return OkStatus();
  if (OpTimingObserver* observer = g_timing_observer.load(std::memory_order_acquire);
      observer != nullptr && ctx.device != nullptr) {
    if (ctx.device->capabilities().ops_run_when_issued) return Timed(observer, cost, run);
    if (observer->clock() == OpTimingObserver::Clock::kDeviceEvents && ctx.stream != nullptr) {
      return TimedOnDevice(observer, ctx, cost, run);
    }
  }
  if (TraceRecorder::Global().enabled() && ctx.stream != nullptr &&
      KindCapabilities(ctx.stream->device().kind).ops_run_when_issued) {
    TraceSpan span(cost.name, "compute", ctx.stream->device().index, ctx.stream->id());
    return run();
  }
  return run();
}

// Runs ops on 16-bit operands through a backend whose kernels for the op
// read and write f32 only (OpBackend::Native16Bit false): each 16-bit
// operand is widened exactly into an f32 temporary (In, InOut), the backend
// runs on the temporaries, and Finish() narrows the written ones back,
// rounding once to nearest even: the same numbers a kernel computing in f32
// and storing 16-bit values would give. f32 operands are passed through
// untouched, so f32 calls run exactly as before. Operands that are the same
// tensor share one temporary (in-place ops, q/k/v views of one buffer).
// Temporaries: host memory on a device whose memory is the host's (cpu:
// emulation scratch a 16-bit kernel would
// not need, kept out of ctx.alloc's statistics so a cpu run's memory is what
// the simulator, which executes nothing, accounts); ctx.alloc elsewhere.
// The widening and narrowing are not accounted: the op's cost is priced
// once, at its operands' real dtypes. A staging made with `native` (the
// backend handles the op's 16-bit operands itself) passes every operand
// through untouched and Finish() does nothing.
class F32Staging {
 public:
  F32Staging(OpBackend* be, const OpContext& ctx, bool native = false)
      : be_(be), ctx_(ctx), native_(native) {}

  StatusOr<Tensor> In(const Tensor& t) { return Stage(t, true, false); }
  StatusOr<Tensor> Out(const Tensor& t) { return Stage(t, false, true); }
  StatusOr<Tensor> InOut(const Tensor& t) { return Stage(t, true, true); }
  StatusOr<MatrixRef> In(const MatrixRef& m) { return Stage(m, true, false); }
  StatusOr<MatrixRef> Out(const MatrixRef& m) { return Stage(m, false, true); }
  StatusOr<MatrixRef> InOut(const MatrixRef& m) { return Stage(m, true, true); }

  // Narrows every written temporary into its tensor.
  Status Finish() {
    for (const Entry& e : entries_) {
      if (e.write) SK_RETURN_IF_ERROR(be_->Cast(ctx_, e.wide, e.orig));
    }
    return OkStatus();
  }

 private:
  struct Entry {
    Tensor orig, wide;
    bool read = false, write = false;
  };

  StatusOr<Tensor> Stage(const Tensor& t, bool read, bool write) {
    if (native_ || !t.defined() || t.dtype() == DType::kF32 || t.numel() == 0) return t;
    for (Entry& e : entries_) {
      if (!Same(e.orig, t)) continue;
      if (read && !e.read) {
        SK_RETURN_IF_ERROR(be_->Cast(ctx_, e.orig, e.wide));
        e.read = true;
      }
      e.write = e.write || write;
      return e.wide;
    }
    Allocator* a = ctx_.device->capabilities().host_memory ? &HostAllocator::Default() : ctx_.alloc;
    Entry e;
    e.orig = t;
    SK_ASSIGN_OR_RETURN(e.wide, a->Empty(DType::kF32, t.shape()));
    if (read) SK_RETURN_IF_ERROR(be_->Cast(ctx_, t, e.wide));
    e.read = read;
    e.write = write;
    entries_.push_back(e);
    return e.wide;
  }

  // A matrix may cover only part of its tensor, and Finish() narrows the
  // whole tensor back: written matrices are widened first so the elements
  // outside them come back unchanged.
  StatusOr<MatrixRef> Stage(const MatrixRef& m, bool read, bool write) {
    SK_ASSIGN_OR_RETURN(Tensor w, Stage(m.t, read || write, write));
    return MatrixRef{w, m.offset, m.ld, m.batch_stride};
  }

  OpBackend* be_;
  OpContext ctx_;
  bool native_ = false;
  std::vector<Entry> entries_;
};

// Runs fn(staging) and narrows its outputs; `native`: the backend reads and
// writes the op's 16-bit operands itself (nothing is staged).
template <typename Fn>
Status Staged(OpBackend* be, const OpContext& ctx, bool native, Fn fn) {
  F32Staging s(be, ctx, native);
  SK_RETURN_IF_ERROR(fn(s));
  return s.Finish();
}

// Whether every tensor of `ts` has the one 16-bit dtype of the first.
inline bool AllOne16BitDType(std::initializer_list<const Tensor*> ts) {
  const DType t = (*ts.begin())->dtype();
  if (t != DType::kBF16 && t != DType::kF16) return false;
  for (const Tensor* x : ts) {
    if (x->dtype() != t) return false;
  }
  return true;
}

// Dispatch of an op that the backend runs on f32 temporaries unless it has
// a 16-bit kernel for `op` (OpBackend::Native16Bit): stage(st) widens the
// operands through st and calls the backend. Native16Bit is asked only on
// executing backends, when the op runs.
template <typename Fn>
Status DispatchStaged(OpBackend* be, const OpContext& ctx, const char* op, const OpCost& cost,
                      Fn stage) {
  return Dispatch(be, ctx, cost, [&] { return Staged(be, ctx, be->Native16Bit(op), stage); });
}

// The same for an op whose 16-bit kernel takes its operands only when all
// of `operands` have one 16-bit dtype (AllOne16BitDType); otherwise every
// 16-bit operand is staged.
template <typename Fn>
Status DispatchStaged(OpBackend* be, const OpContext& ctx, const char* op, const OpCost& cost,
                      std::initializer_list<const Tensor*> operands, Fn stage) {
  return Dispatch(be, ctx, cost, [&] {
    return Staged(be, ctx, be->Native16Bit(op) && AllOne16BitDType(operands), stage);
  });
}

// rows = x / cols when cols divides it (cols > 0).
inline Status RowsOf(const char* op, const char* what, int64_t total, int64_t cols,
                     int64_t* rows) {
  if (cols <= 0) {
    if (total != 0) return Bad(op, std::string(what) + ": row width is 0 but data is not empty");
    *rows = 0;
    return OkStatus();
  }
  if (total % cols != 0) {
    return Bad(op, std::string(what) + " has " + N(total) + " elements, not a multiple of " +
                       N(cols));
  }
  *rows = total / cols;
  return OkStatus();
}


}  // namespace sk::ops::internal

namespace sk::ops {

// The op files name these unqualified (this header is theirs alone).
using internal::AnyOverlap;
using internal::Bad;
using internal::CheckMatrix;
using internal::CheckNumel;
using internal::CheckTensor;
using internal::CheckTensors;
using internal::Dispatch;
using internal::DispatchStaged;
using internal::F32Staging;
using internal::IsFloat;
using internal::N;
using internal::Overlap;
using internal::Resolve;
using internal::RowsOf;
using internal::Same;
using internal::Staged;

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_DISPATCH_H_
