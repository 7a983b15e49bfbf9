#include "runtime/ops/ops.h"

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "runtime/core/trace.h"
#include "runtime/ops/cpu/cpu_backend.h"
#include "runtime/ops/op_timing.h"
#if defined(SHARDKIT_WITH_CUDA)
#include "runtime/ops/cuda/cuda_backend.h"
#endif

namespace sk::ops {

// ---- Registry ---------------------------------------------------------------

namespace {

constexpr size_t kMaxKinds = 16;

// op_timing.h's observer; null when none.
std::atomic<OpTimingObserver*> g_timing_observer{nullptr};

std::array<std::atomic<OpBackend*>, kMaxKinds>& Table() {
  static auto* table = [] {
    auto* t = new std::array<std::atomic<OpBackend*>, kMaxKinds>();
    for (auto& e : *t) e.store(nullptr);
    (*t)[static_cast<size_t>(DeviceKind::kCpu)].store(CpuOpBackend());
#if defined(SHARDKIT_WITH_CUDA)
    (*t)[static_cast<size_t>(DeviceKind::kCuda)].store(CudaOpBackend());
#endif
    return t;
  }();
  return *table;
}

}  // namespace

void SetOpTimingObserver(OpTimingObserver* observer) {
  g_timing_observer.store(observer, std::memory_order_release);
}

void RegisterOpBackend(DeviceKind kind, OpBackend* backend) {
  size_t i = static_cast<size_t>(kind);
  CHECK_LT(i, kMaxKinds) << "device kind " << i << " out of the op registry's range";
  Table()[i].store(backend);
}

OpBackend* BackendFor(DeviceKind kind) {
  size_t i = static_cast<size_t>(kind);
  if (i >= kMaxKinds) return nullptr;
  return Table()[i].load();
}

OpContext HostContext() {
  static Device* cpu = [] {
    auto d = Device::Get(DeviceId::Cpu(0));
    CHECK(d.ok()) << d.status().ToString();
    return *d;
  }();
  return OpContext{cpu, nullptr, &HostAllocator::Default()};
}

// ---- Validation helpers -----------------------------------------------------

namespace {

std::string N(int64_t v) { return std::to_string(v); }

Status Bad(const char* op, const std::string& msg) {
  return InvalidArgumentError(std::string(op) + ": " + msg);
}

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// The backend for ctx, or an error naming the op.
StatusOr<OpBackend*> Resolve(const char* op, const OpContext& ctx) {
  if (ctx.device == nullptr) return Bad(op, "OpContext has no device");
  if (ctx.alloc == nullptr) return Bad(op, "OpContext has no allocator");
  DeviceKind kind = ctx.device->id().kind;
  OpBackend* b = BackendFor(kind);
  if (b == nullptr) {
    return UnavailableError(std::string(op) + ": no op backend is registered for device " +
                            ctx.device->id().ToString());
  }
  if (ctx.stream == nullptr && kind != DeviceKind::kCpu) {
    return Bad(op, "OpContext has no stream (required on " + ctx.device->id().ToString() + ")");
  }
  return b;
}

// Defined, on ctx's device kind, and of one of `dtypes` (empty: any float).
Status CheckTensor(const char* op, const char* what, const OpContext& ctx, const Tensor& t,
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

Status CheckNumel(const char* op, const char* what, const Tensor& t, int64_t want) {
  if (t.numel() != want) {
    return Bad(op, std::string(what) + " has " + N(t.numel()) + " elements, expected " + N(want));
  }
  return OkStatus();
}

// `batch` matrices of rows x cols inside m.t.
Status CheckMatrix(const char* op, const char* what, const MatrixRef& m, int64_t rows,
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

bool Overlap(const Tensor& a, const Tensor& b) {
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

bool Same(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.byte_offset() == b.byte_offset() &&
         a.nbytes() == b.nbytes();
}

// Accounts, then runs `run` on executing backends. On cpu, where the op runs
// on the calling thread (the thread that plays ctx.stream), a Chrome trace
// being recorded gets the op as a span on its stream's track, as the
// simulator's Account() records it in virtual time; CUDA ops are enqueued,
// so a host-side span would time the launch, not the kernel, and is not
// recorded. Off the trace: one relaxed atomic load.
double ThreadCpuSeconds() {
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

template <typename Fn>
Status Dispatch(OpBackend* b, const OpContext& ctx, const OpCost& cost, Fn run) {
  SK_RETURN_IF_ERROR(b->Account(ctx, cost));
  if (!b->executes()) return OkStatus();
  if (OpTimingObserver* observer = g_timing_observer.load(std::memory_order_acquire);
      observer != nullptr && ctx.device != nullptr) {
    if (ctx.device->id().kind == DeviceKind::kCpu) return Timed(observer, cost, run);
    if (observer->clock() == OpTimingObserver::Clock::kDeviceEvents && ctx.stream != nullptr) {
      return TimedOnDevice(observer, ctx, cost, run);
    }
  }
  if (TraceRecorder::Global().enabled() && ctx.stream != nullptr && ctx.stream->device().is_cpu()) {
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
// Temporaries: host memory on cpu (emulation scratch a 16-bit kernel would
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
    Allocator* a = ctx_.device->id().kind == DeviceKind::kCpu ? &HostAllocator::Default()
                                                             : ctx_.alloc;
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
bool AllOne16BitDType(std::initializer_list<const Tensor*> ts) {
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
Status RowsOf(const char* op, const char* what, int64_t total, int64_t cols, int64_t* rows) {
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

}  // namespace

// ---- GEMM -------------------------------------------------------------------

// Gemm's and GemmBias's operands: dimensions, devices, dtypes, extents and
// overlaps.
Status CheckGemmOperands(const char* op, const OpContext& ctx, const GemmParams& p,
                         const MatrixRef& a, const MatrixRef& b, const MatrixRef& c) {
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 0) {
    return Bad(op, "negative dimension m=" + N(p.m) + " n=" + N(p.n) + " k=" + N(p.k) +
                       " batch=" + N(p.batch));
  }
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "A", a.t, "B", b.t, "C", c.t));
  if (a.t.dtype() != b.t.dtype()) {
    return Bad(op, "A is " + std::string(DTypeName(a.t.dtype())) + " but B is " +
                       std::string(DTypeName(b.t.dtype())));
  }
  if (c.t.dtype() != DType::kF32 && c.t.dtype() != a.t.dtype()) {
    return Bad(op, "C is " + std::string(DTypeName(c.t.dtype())) + ", expected f32 or A's " +
                       std::string(DTypeName(a.t.dtype())));
  }
  SK_RETURN_IF_ERROR(CheckMatrix(op, "A", a, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.batch));
  SK_RETURN_IF_ERROR(CheckMatrix(op, "B", b, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.batch));
  SK_RETURN_IF_ERROR(CheckMatrix(op, "C", c, p.m, p.n, p.batch));
  if (p.m > 0 && p.n > 0 && p.batch > 0 && (Overlap(c.t, a.t) || Overlap(c.t, b.t))) {
    return Bad(op, "C overlaps A or B");
  }
  return OkStatus();
}

Status Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
            const MatrixRef& c) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckGemmOperands(op, ctx, p, a, b, c));
  return Dispatch(be, ctx,
                  GemmCost(p.m, p.n, p.k, p.batch, a.t.dtype(), p.beta != 0.0f, c.t.dtype()),
                  [&] {
                    if (c.t.dtype() == DType::kF32 || be->GemmStores16Bit(p)) {
                      return be->Gemm(ctx, p, a, b, c);
                    }
                    // A 16-bit C: accumulated in f32, rounded once when stored.
                    return Staged(be, ctx, false, [&](F32Staging& st) -> Status {
                      SK_ASSIGN_OR_RETURN(MatrixRef wc, p.beta != 0.0f ? st.InOut(c) : st.Out(c));
                      return be->Gemm(ctx, p, a, b, wc);
                    });
                  });
}

// GemmBias's operands (and GemmBiasResidual's but the residual). The
// bias's own conditions first (C's ld among them, before C's extent is
// checked against it), then Gemm's.
Status CheckGemmBiasOperands(const char* op, const OpContext& ctx, const GemmParams& p,
                             const MatrixRef& a, const MatrixRef& b, const Tensor& bias,
                             const MatrixRef& c) {
  SK_RETURN_IF_ERROR(CheckTensor(op, "bias", ctx, bias));
  if (p.beta != 0.0f) return Bad(op, "a bias with beta=" + std::to_string(p.beta) + " (needs 0)");
  if (p.batch != 1) return Bad(op, "a bias with batch=" + N(p.batch) + " (needs 1)");
  if (bias.numel() != p.n) {
    return Bad(op, "bias has " + N(bias.numel()) + " elements, expected n=" + N(p.n));
  }
  if (c.ld != p.n) return Bad(op, "a bias with C's ld=" + N(c.ld) + " (needs n=" + N(p.n) + ")");
  SK_RETURN_IF_ERROR(CheckGemmOperands(op, ctx, p, a, b, c));
  if (Overlap(bias, c.t)) return Bad(op, "bias overlaps C");
  return OkStatus();
}

Status GemmBias(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                const Tensor& bias, const MatrixRef& c) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  // Everything is checked before anything is written: the two-op form
  // writes C before its GEMM would find a bad A or B.
  SK_RETURN_IF_ERROR(CheckGemmBiasOperands(op, ctx, p, a, b, bias, c));
  if (p.m == 0 || p.n == 0) return OkStatus();
  if (!be->GemmAddsBias(p, a.t.dtype(), bias.dtype(), c.t.dtype())) {
    // Two ops: the bias written into C, the product accumulated onto it.
    SK_ASSIGN_OR_RETURN(Tensor rows, c.t.View(static_cast<size_t>(c.offset) * DTypeSize(c.t.dtype()),
                                              c.t.dtype(), Shape{p.m * p.n}));
    SK_RETURN_IF_ERROR(BroadcastRows(ctx, bias, rows));
    GemmParams q = p;
    q.beta = 1.0f;
    return Gemm(ctx, q, a, b, c);
  }
  OpCost cost = GemmCost(p.m, p.n, p.k, 1, a.t.dtype(), false, c.t.dtype());
  cost.bytes_read += static_cast<double>(p.n) * DTypeSize(bias.dtype());
  return Dispatch(be, ctx, cost, [&] { return be->GemmBias(ctx, p, a, b, bias, c); });
}

Status GemmBiasResidual(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                        const MatrixRef& b, const Tensor& bias, const Tensor& residual,
                        const MatrixRef& c) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckGemmBiasOperands(op, ctx, p, a, b, bias, c));
  SK_RETURN_IF_ERROR(CheckTensor(op, "residual", ctx, residual));
  SK_RETURN_IF_ERROR(CheckNumel(op, "residual", residual, p.m * p.n));
  if (Overlap(residual, c.t)) return Bad(op, "residual overlaps C");
  if (p.m == 0 || p.n == 0) return OkStatus();
  SK_ASSIGN_OR_RETURN(Tensor rows, c.t.View(static_cast<size_t>(c.offset) * DTypeSize(c.t.dtype()),
                                            c.t.dtype(), Shape{p.m * p.n}));
  if (!be->GemmAddsResidual(p, a.t.dtype(), bias.dtype(), residual.dtype(), c.t.dtype())) {
    // The ops that define it: the linear layer in f32, the residual added
    // in f32, one rounding of a 16-bit C.
    if (c.t.dtype() == DType::kF32) {
      SK_RETURN_IF_ERROR(GemmBias(ctx, p, a, b, bias, c));
      return Axpy(ctx, 1.0f, residual, rows);
    }
    SK_ASSIGN_OR_RETURN(Tensor sum, ctx.alloc->Empty(DType::kF32, Shape{p.m * p.n}));
    SK_RETURN_IF_ERROR(GemmBias(ctx, p, a, b, bias, MatrixRef{sum, 0, p.n}));
    SK_RETURN_IF_ERROR(Axpy(ctx, 1.0f, residual, sum));
    return Cast(ctx, sum, rows);
  }
  // One GEMM whose beta = 1 term is the residual: C is written once.
  OpCost cost = GemmCost(p.m, p.n, p.k, 1, a.t.dtype(), true, c.t.dtype());
  cost.name = "gemm_bias_residual";
  cost.bytes_read += static_cast<double>(p.n) * DTypeSize(bias.dtype());
  if (residual.dtype() != c.t.dtype()) {
    cost.bytes_read += static_cast<double>(p.m * p.n) *
                       (static_cast<double>(DTypeSize(residual.dtype())) - DTypeSize(c.t.dtype()));
  }
  return Dispatch(be, ctx, cost, [&] { return be->GemmBiasResidual(ctx, p, a, b, bias, residual, c); });
}

Status GemmBiasGelu(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                    const MatrixRef& b, const Tensor& bias, const Tensor& pre, const Tensor& out) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "pre", ctx, pre));
  SK_RETURN_IF_ERROR(CheckNumel(op, "pre", pre, p.m * p.n));
  if (pre.dtype() != DType::kF32 && pre.dtype() != a.t.dtype()) {
    return Bad(op, "pre has dtype " + std::string(DTypeName(pre.dtype())) + ", expected f32 or A's " +
                       std::string(DTypeName(a.t.dtype())));
  }
  SK_RETURN_IF_ERROR(CheckGemmBiasOperands(op, ctx, p, a, b, bias, MatrixRef{out, 0, p.n}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "out", out, p.m * p.n));
  if (Overlap(pre, out)) return Bad(op, "pre overlaps out");
  if (Overlap(pre, a.t) || Overlap(pre, b.t) || Overlap(pre, bias)) return Bad(op, "pre overlaps an input");
  if (p.m == 0 || p.n == 0) return OkStatus();
  if (!be->GemmFusesGelu(p, a.t.dtype(), bias.dtype(), pre.dtype(), out.dtype())) {
    SK_RETURN_IF_ERROR(GemmBias(ctx, p, a, b, bias, MatrixRef{pre, 0, p.n}));
    return GeluForward(ctx, pre, out);
  }
  // One GEMM whose epilogue adds the bias, stores its input to GELU as pre
  // and GELU's output as out.
  OpCost cost = GemmCost(p.m, p.n, p.k, 1, a.t.dtype(), false, out.dtype());
  cost.name = "gemm_bias_gelu";
  cost.flops += kGeluForwardFlops * static_cast<double>(p.m * p.n);
  cost.bytes_read += static_cast<double>(p.n) * DTypeSize(bias.dtype());
  cost.bytes_written += static_cast<double>(p.m * p.n) * DTypeSize(pre.dtype());
  return Dispatch(be, ctx, cost, [&] { return be->GemmBiasGelu(ctx, p, a, b, bias, pre, out); });
}

Status GemmGeluBackward(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                        const MatrixRef& b, const Tensor& pre, const MatrixRef& c) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "pre", ctx, pre));
  if (p.beta != 0.0f) return Bad(op, "GELU's gradient with beta=" + std::to_string(p.beta) + " (needs 0)");
  if (p.batch != 1) return Bad(op, "GELU's gradient with batch=" + N(p.batch) + " (needs 1)");
  if (c.ld != p.n) return Bad(op, "GELU's gradient with C's ld=" + N(c.ld) + " (needs n=" + N(p.n) + ")");
  SK_RETURN_IF_ERROR(CheckGemmOperands(op, ctx, p, a, b, c));
  SK_RETURN_IF_ERROR(CheckNumel(op, "pre", pre, p.m * p.n));
  if (Overlap(pre, c.t)) return Bad(op, "pre overlaps C");
  if (p.m == 0 || p.n == 0) return OkStatus();
  if (!be->GemmFusesGelu(p, a.t.dtype(), c.t.dtype(), pre.dtype(), c.t.dtype())) {
    SK_RETURN_IF_ERROR(Gemm(ctx, p, a, b, c));
    SK_ASSIGN_OR_RETURN(Tensor rows, c.t.View(static_cast<size_t>(c.offset) * DTypeSize(c.t.dtype()),
                                              c.t.dtype(), Shape{p.m * p.n}));
    return GeluBackward(ctx, pre, rows, rows);
  }
  OpCost cost = GemmCost(p.m, p.n, p.k, 1, a.t.dtype(), false, c.t.dtype());
  cost.name = "gemm_dgelu";
  cost.flops += kGeluBackwardFlops * static_cast<double>(p.m * p.n);
  cost.bytes_read += static_cast<double>(p.m * p.n) * DTypeSize(pre.dtype());
  return Dispatch(be, ctx, cost, [&] { return be->GemmGeluBackward(ctx, p, a, b, pre, c); });
}

// ---- Data movement ------------------------------------------------------------

Status Copy(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  const char* op = "copy";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  const DeviceKind kind = ctx.device->id().kind;
  for (const Tensor* t : {&src, &dst}) {
    const char* what = t == &src ? "src" : "dst";
    if (!t->defined()) return Bad(op, std::string(what) + " is undefined");
    if (t->device().kind != kind && !t->device().is_cpu()) {
      return Bad(op, std::string(what) + " " + t->ToString() + " is neither host memory nor on " +
                         ctx.device->id().ToString());
    }
  }
  if (src.dtype() != dst.dtype()) {
    return Bad(op, "src is " + std::string(DTypeName(src.dtype())) + " but dst is " +
                       std::string(DTypeName(dst.dtype())) + " (use cast)");
  }
  SK_RETURN_IF_ERROR(CheckNumel(op, "dst", dst, src.numel()));
  if (!Same(src, dst) && Overlap(src, dst)) return Bad(op, "src and dst overlap");
  return Dispatch(be, ctx, CopyCost(src.numel(), src.dtype()),
                  [&] { return Same(src, dst) ? OkStatus() : be->Copy(ctx, src, dst); });
}

Status Cast(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  const char* op = "cast";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "src", src, "dst", dst));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dst", dst, src.numel()));
  if (Overlap(src, dst)) return Bad(op, "src and dst overlap");
  return Dispatch(be, ctx, CastCost(src.numel(), src.dtype(), dst.dtype()),
                  [&] { return be->Cast(ctx, src, dst); });
}

Status RoundToDType(const OpContext& ctx, const Tensor& x, DType t) {
  const char* op = "round_to_dtype";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "x", ctx, x, {DType::kF32}));
  if (!IsFloat(t)) return Bad(op, "target dtype " + std::string(DTypeName(t)) + " is not a float type");
  if (t == DType::kF32) return be->Account(ctx, RoundToDTypeCost(0));
  return Dispatch(be, ctx, RoundToDTypeCost(x.numel()), [&] { return be->RoundToDType(ctx, x, t); });
}

Status Scale(const OpContext& ctx, const Tensor& x, float alpha) {
  const char* op = "scale";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "x", ctx, x));
  return Dispatch(be, ctx, ScaleCost(x.numel(), x.dtype()), [&] { return be->Scale(ctx, x, alpha); });
}

Status Axpy(const OpContext& ctx, float alpha, const Tensor& x, const Tensor& y) {
  const char* op = "axpy";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "y", y));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, x.numel()));
  if (Overlap(x, y) && !(Same(x, y) && x.dtype() == y.dtype())) return Bad(op, "x and y overlap");
  return Dispatch(be, ctx, AxpyCost(x.numel(), x.dtype(), y.dtype()),
                  [&] { return be->Axpy(ctx, alpha, x, y); });
}

Status Fill(const OpContext& ctx, const Tensor& x, float value) {
  const char* op = "fill";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "x", ctx, x));
  return Dispatch(be, ctx, FillCost(x.numel(), x.dtype()), [&] { return be->Fill(ctx, x, value); });
}

Status InitPhilox(const OpContext& ctx, const Initializer& init, uint64_t seed, uint64_t param_id,
                  int64_t begin, const Tensor& out) {
  const char* op = "init_philox";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(ValidateInitializer(init).WithContext(op));
  if (begin < 0) return Bad(op, "negative begin " + N(begin));
  SK_RETURN_IF_ERROR(CheckTensor(op, "out", ctx, out));
  return Dispatch(be, ctx, InitCost(out.numel(), out.dtype()),
                  [&] { return be->InitPhilox(ctx, init, seed, param_id, begin, out); });
}

// ---- Bias ---------------------------------------------------------------------

Status BroadcastRows(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  const char* op = "broadcast_rows";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "src", src, "dst", dst));
  int64_t rows = 0;
  SK_RETURN_IF_ERROR(RowsOf(op, "dst", dst.numel(), src.numel(), &rows));
  if (Overlap(src, dst)) return Bad(op, "src and dst overlap");
  const OpCost cost = BroadcastRowsCost(rows, src.numel(), dst.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor s, st.In(src));
    SK_ASSIGN_OR_RETURN(Tensor d, st.Out(dst));
    return be->BroadcastRows(ctx, s, d);
  });
}

Status BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y) {
  const char* op = "bias_add";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "bias", bias, "y", y));
  int64_t rows = 0;
  SK_RETURN_IF_ERROR(RowsOf(op, "y", y.numel(), bias.numel(), &rows));
  if (Overlap(bias, y)) return Bad(op, "bias and y overlap");
  const OpCost cost = BiasAddCost(rows, bias.numel(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor b, st.In(bias));
    SK_ASSIGN_OR_RETURN(Tensor w, st.InOut(y));
    return be->BiasAdd(ctx, b, w);
  });
}

Status BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias) {
  const char* op = "bias_grad";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "dy", dy, "dbias", dbias));
  int64_t rows = 0;
  SK_RETURN_IF_ERROR(RowsOf(op, "dy", dy.numel(), dbias.numel(), &rows));
  if (Overlap(dy, dbias)) return Bad(op, "dy and dbias overlap");
  const OpCost cost = BiasGradCost(rows, dbias.numel(), dy.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor d, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor g, st.InOut(dbias));
    return be->BiasGrad(ctx, d, g);
  });
}

// ---- Activations and normalisation -----------------------------------------------

Status GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y) {
  const char* op = "gelu_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "y", y));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, x.numel()));
  if (Same(x, y) ? x.dtype() != y.dtype() : Overlap(x, y)) return Bad(op, "x and y overlap");
  const OpCost cost = GeluForwardCost(x.numel(), x.dtype(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->GeluForward(ctx, wx, wy);
  });
}

Status GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const char* op = "gelu_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "dy", dy, "dx", dx));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dy", dy, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dx", dx, x.numel()));
  if (Overlap(dx, x) || (Same(dx, dy) ? dx.dtype() != dy.dtype() : Overlap(dx, dy))) {
    return Bad(op, "dx overlaps an input");
  }
  const OpCost cost = GeluBackwardCost(x.numel(), x.dtype(), dx.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wdy, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor wdx, st.Out(dx));
    return be->GeluBackward(ctx, wx, wdy, wdx);
  });
}

namespace {

// The layer and RMS norms' x: [rows, cols] for gamma's cols; an empty
// gamma is an error.
Status NormShape(const char* op, const Tensor& x, const Tensor& gamma, int64_t* rows,
                 int64_t* cols) {
  *cols = gamma.numel();
  if (*cols == 0) return Bad(op, "gamma is empty");
  return RowsOf(op, "x", x.numel(), *cols, rows);
}

}  // namespace

Status LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                        const Tensor& beta, const Tensor& y, const Tensor& mean,
                        const Tensor& rstd) {
  const char* op = "layer_norm_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "gamma", gamma, "beta", beta, "y", y));
  SK_RETURN_IF_ERROR(CheckTensor(op, "mean", ctx, mean, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "rstd", ctx, rstd, {DType::kF32}));
  int64_t rows = 0, cols = 0;
  SK_RETURN_IF_ERROR(NormShape(op, x, gamma, &rows, &cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "beta", beta, cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "mean", mean, rows));
  SK_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows));
  if (AnyOverlap({&y, &mean, &rstd}, {&x, &gamma, &beta})) {
    return Bad(op, "an output overlaps an input");
  }
  const OpCost cost = LayerNormForwardCost(rows, cols, x.dtype(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gamma));
    SK_ASSIGN_OR_RETURN(Tensor wb, st.In(beta));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->LayerNormForward(ctx, wx, wg, wb, wy, mean, rstd);
  });
}

Status LayerNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                         const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const char* op = "layer_norm_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "gamma", gamma, "dy", dy, "dx", dx, "dgamma", dgamma,
                                  "dbeta", dbeta));
  SK_RETURN_IF_ERROR(CheckTensor(op, "mean", ctx, mean, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "rstd", ctx, rstd, {DType::kF32}));
  int64_t rows = 0, cols = 0;
  SK_RETURN_IF_ERROR(NormShape(op, x, gamma, &rows, &cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dy", dy, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dx", dx, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "mean", mean, rows));
  SK_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dgamma", dgamma, cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dbeta", dbeta, cols));
  if (AnyOverlap({&dx, &dgamma, &dbeta}, {&x, &gamma, &dy, &mean, &rstd})) {
    return Bad(op, "an output overlaps an input");
  }
  const OpCost cost = LayerNormBackwardCost(rows, cols, x.dtype(), dx.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gamma));
    SK_ASSIGN_OR_RETURN(Tensor wdy, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor wdx, st.InOut(dx));
    SK_ASSIGN_OR_RETURN(Tensor wdg, st.InOut(dgamma));
    SK_ASSIGN_OR_RETURN(Tensor wdb, st.InOut(dbeta));
    return be->LayerNormBackward(ctx, wx, wg, wdy, mean, rstd, wdx, wdg, wdb);
  });
}

// ---- Llama-family ops ---------------------------------------------------------------

Status RmsNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma, float eps,
                      const Tensor& y, const Tensor& rstd) {
  const char* op = "rms_norm_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "gamma", gamma, "y", y));
  SK_RETURN_IF_ERROR(CheckTensor(op, "rstd", ctx, rstd, {DType::kF32}));
  if (!(eps > 0.0f)) return Bad(op, "eps must be positive, got " + std::to_string(eps));
  int64_t rows = 0, cols = 0;
  SK_RETURN_IF_ERROR(NormShape(op, x, gamma, &rows, &cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows));
  if (AnyOverlap({&y, &rstd}, {&x, &gamma})) return Bad(op, "an output overlaps an input");
  if (Overlap(y, rstd)) return Bad(op, "y overlaps rstd");
  const OpCost cost = RmsNormForwardCost(rows, cols, x.dtype(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gamma));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->RmsNormForward(ctx, wx, wg, eps, wy, rstd);
  });
}

Status RmsNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                       const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dgamma) {
  const char* op = "rms_norm_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(
      CheckTensors(op, ctx, "x", x, "gamma", gamma, "dy", dy, "dx", dx, "dgamma", dgamma));
  SK_RETURN_IF_ERROR(CheckTensor(op, "rstd", ctx, rstd, {DType::kF32}));
  int64_t rows = 0, cols = 0;
  SK_RETURN_IF_ERROR(NormShape(op, x, gamma, &rows, &cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dy", dy, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dx", dx, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dgamma", dgamma, cols));
  if (AnyOverlap({&dx, &dgamma}, {&x, &gamma, &dy, &rstd})) {
    return Bad(op, "an output overlaps an input");
  }
  if (Overlap(dx, dgamma)) return Bad(op, "dx overlaps dgamma");
  const OpCost cost = RmsNormBackwardCost(rows, cols, x.dtype(), dx.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gamma));
    SK_ASSIGN_OR_RETURN(Tensor wdy, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor wdx, st.InOut(dx));
    SK_ASSIGN_OR_RETURN(Tensor wdg, st.InOut(dgamma));
    return be->RmsNormBackward(ctx, wx, wg, wdy, rstd, wdx, wdg);
  });
}

namespace {

// RopeForward and RopeBackward: x -> y rotated by plus or minus the angle.
Status Rope(const char* op, const OpContext& ctx, const Tensor& x, int64_t seq_len,
            int64_t heads, int64_t head_dim, float theta, const RopeScaling& scaling,
            bool inverse, const Tensor& y, const Tensor& positions) {
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  const char* in = inverse ? "dy" : "x";
  SK_RETURN_IF_ERROR(CheckTensor(op, in, ctx, x));
  SK_RETURN_IF_ERROR(CheckTensor(op, inverse ? "dx" : "y", ctx, y));
  if (seq_len <= 0) return Bad(op, "seq_len must be positive, got " + N(seq_len));
  if (heads <= 0) return Bad(op, "heads must be positive, got " + N(heads));
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return Bad(op, "head_dim must be positive and even, got " + N(head_dim));
  }
  if (!(theta > 0.0f)) return Bad(op, "theta must be positive, got " + std::to_string(theta));
  SK_RETURN_IF_ERROR(ValidateRopeScaling(scaling).WithContext(op));
  if (heads > std::numeric_limits<int64_t>::max() / head_dim) {
    return Bad(op, "heads=" + N(heads) + " x head_dim=" + N(head_dim) + " overflows int64");
  }
  int64_t rows = 0;
  SK_RETURN_IF_ERROR(RowsOf(op, in, x.numel(), heads * head_dim, &rows));
  if (rows % seq_len != 0) {
    return Bad(op, std::string(in) + " has " + N(rows) + " rows, not a multiple of seq_len " +
                       N(seq_len));
  }
  SK_RETURN_IF_ERROR(CheckNumel(op, inverse ? "dx" : "y", y, x.numel()));
  if (Same(x, y) ? x.dtype() != y.dtype() : Overlap(x, y)) return Bad(op, "input and output overlap");
  if (positions.defined()) {
    SK_RETURN_IF_ERROR(CheckTensor(op, "positions", ctx, positions, {DType::kI32}));
    SK_RETURN_IF_ERROR(CheckNumel(op, "positions", positions, rows));
    if (Overlap(positions, y)) return Bad(op, "positions overlap the output");
  }
  const OpCost cost = RopeCost(x.numel(), x.dtype(), y.dtype(), inverse);
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->Rope(ctx, wx, seq_len, heads, head_dim, theta, scaling, inverse, wy, positions);
  });
}

}  // namespace

Status RopeForward(const OpContext& ctx, const Tensor& x, int64_t seq_len, int64_t heads,
                   int64_t head_dim, float theta, const RopeScaling& scaling, const Tensor& y,
                   const Tensor& positions) {
  return Rope("rope_fwd", ctx, x, seq_len, heads, head_dim, theta, scaling, false, y, positions);
}

Status RopeBackward(const OpContext& ctx, const Tensor& dy, int64_t seq_len, int64_t heads,
                    int64_t head_dim, float theta, const RopeScaling& scaling, const Tensor& dx,
                    const Tensor& positions) {
  return Rope("rope_bwd", ctx, dy, seq_len, heads, head_dim, theta, scaling, true, dx, positions);
}

Status ValidateRopeScaling(const RopeScaling& s) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(std::string("rope scaling '") + RopeScalingTypeName(s.type) + "': " + why);
  };
  auto positive = [](float v) { return v > 0.0f && std::isfinite(v); };
  switch (s.type) {
    case RopeScalingType::kNone: return OkStatus();
    case RopeScalingType::kLinear:
      if (!positive(s.factor)) return bad("factor must be a positive number, got " + std::to_string(s.factor));
      return OkStatus();
    case RopeScalingType::kLlama3:
      if (!positive(s.factor)) return bad("factor must be a positive number, got " + std::to_string(s.factor));
      if (!positive(s.low_freq_factor)) {
        return bad("low_freq_factor must be a positive number, got " + std::to_string(s.low_freq_factor));
      }
      if (!(positive(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor)) {
        return bad("high_freq_factor must be a number above low_freq_factor " +
                   std::to_string(s.low_freq_factor) + ", got " + std::to_string(s.high_freq_factor));
      }
      if (s.original_max_positions <= 0) {
        return bad("original_max_positions must be positive, got " +
                   std::to_string(s.original_max_positions));
      }
      return OkStatus();
  }
  return InvalidArgumentError("rope scaling type " + std::to_string(static_cast<int32_t>(s.type)) +
                              " is not one of default (0), linear (1), llama3 (2)");
}

Status SwiGluForward(const OpContext& ctx, const Tensor& gate, const Tensor& up, const Tensor& y) {
  const char* op = "swiglu_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "gate", gate, "up", up, "y", y));
  SK_RETURN_IF_ERROR(CheckNumel(op, "up", up, gate.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, gate.numel()));
  if (Overlap(y, gate) || Overlap(y, up)) return Bad(op, "y overlaps an input");
  const OpCost cost = SwiGluForwardCost(gate.numel(), gate.dtype(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gate));
    SK_ASSIGN_OR_RETURN(Tensor wu, st.In(up));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->SwiGluForward(ctx, wg, wu, wy);
  });
}

Status SwiGluBackward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                      const Tensor& dy, const Tensor& dgate, const Tensor& dup) {
  const char* op = "swiglu_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  for (auto [what, t] : {std::pair<const char*, const Tensor*>{"gate", &gate}, {"up", &up},
                         {"dy", &dy}, {"dgate", &dgate}, {"dup", &dup}}) {
    SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, *t));
    SK_RETURN_IF_ERROR(CheckNumel(op, what, *t, gate.numel()));
  }
  if (AnyOverlap({&dgate, &dup}, {&gate, &up, &dy})) return Bad(op, "an output overlaps an input");
  if (Overlap(dgate, dup)) return Bad(op, "dgate overlaps dup");
  const OpCost cost = SwiGluBackwardCost(gate.numel(), gate.dtype(), dgate.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gate));
    SK_ASSIGN_OR_RETURN(Tensor wu, st.In(up));
    SK_ASSIGN_OR_RETURN(Tensor wdy, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor wdg, st.Out(dgate));
    SK_ASSIGN_OR_RETURN(Tensor wdu, st.Out(dup));
    return be->SwiGluBackward(ctx, wg, wu, wdy, wdg, wdu);
  });
}

// ---- Attention ------------------------------------------------------------------

namespace {

// The shape and the q/k/v-shaped views every attention op takes.
Status CheckAttentionViews(const char* op, const OpContext& ctx, const AttentionShape& s,
                           std::initializer_list<std::pair<const char*, const MatrixRef*>> q_rows,
                           std::initializer_list<std::pair<const char*, const MatrixRef*>> kv_rows) {
  if (s.batch < 0 || s.heads < 0 || s.q_len < 0 || s.kv_len < 0 || s.head_dim <= 0) {
    return Bad(op, "bad shape: batch=" + N(s.batch) + " heads=" + N(s.heads) + " q_len=" +
                       N(s.q_len) + " kv_len=" + N(s.kv_len) + " head_dim=" + N(s.head_dim));
  }
  if (s.causal && s.q_len != s.kv_len) {
    return Bad(op, "causal attention needs q_len == kv_len, got " + N(s.q_len) + " and " +
                       N(s.kv_len));
  }
  if (s.q_len > 0 && s.kv_len == 0) return Bad(op, "queries without keys (kv_len = 0)");
  if (s.key_start.defined()) {
    if (!s.causal) return Bad(op, "key_start (packed documents) needs causal attention");
    SK_RETURN_IF_ERROR(CheckTensor(op, "key_start", ctx, s.key_start, {DType::kI32}));
    SK_RETURN_IF_ERROR(CheckNumel(op, "key_start", s.key_start, s.batch * s.q_len));
    const int64_t rows = s.batch * s.q_len;
    if (s.masked_pairs < rows || s.masked_pairs > rows * (s.q_len + 1) / 2) {
      return Bad(op, "masked_pairs=" + N(s.masked_pairs) + " is outside [" + N(rows) + ", " +
                         N(rows * (s.q_len + 1) / 2) + "] for batch=" + N(s.batch) +
                         " q_len=" + N(s.q_len));
    }
  } else if (s.masked_pairs != 0) {
    return Bad(op, "masked_pairs=" + N(s.masked_pairs) + " without key_start");
  }
  if (s.kv_heads < 0 || (s.kv_heads > 0 && s.heads % s.kv_heads != 0)) {
    return Bad(op, "kv_heads=" + N(s.kv_heads) + " does not divide heads=" + N(s.heads));
  }
  const int64_t cols = s.heads * s.head_dim;
  const int64_t kv_cols = s.KvHeads() * s.head_dim;
  for (auto [what, m] : q_rows) {
    SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, m->t));
    SK_RETURN_IF_ERROR(CheckMatrix(op, what, *m, s.batch * s.q_len, cols, 1));
  }
  for (auto [what, m] : kv_rows) {
    SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, m->t));
    SK_RETURN_IF_ERROR(CheckMatrix(op, what, *m, s.batch * s.kv_len, kv_cols, 1));
  }
  return OkStatus();
}

Status CheckAttention(const char* op, const OpContext& ctx, const AttentionShape& s,
                      std::initializer_list<std::pair<const char*, const MatrixRef*>> q_rows,
                      std::initializer_list<std::pair<const char*, const MatrixRef*>> kv_rows,
                      const Tensor& probs) {
  if (s.KvHeads() != s.heads) {
    return Bad(op, "grouped-query attention (kv_heads=" + N(s.kv_heads) + ", heads=" +
                       N(s.heads) + ") runs only in the linear-memory attention");
  }
  SK_RETURN_IF_ERROR(CheckAttentionViews(op, ctx, s, q_rows, kv_rows));
  SK_RETURN_IF_ERROR(CheckTensor(op, "probs", ctx, probs, {DType::kF32}));
  return CheckNumel(op, "probs", probs, s.batch * s.heads * s.q_len * s.kv_len);
}

}  // namespace

Status AttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                        const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                        const MatrixRef& out) {
  const char* op = "attention_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckAttention(op, ctx, s, {{"q", &q}, {"out", &out}}, {{"k", &k}, {"v", &v}},
                                    probs));
  if (AnyOverlap({&out.t, &probs}, {&q.t, &k.t, &v.t})) {
    return Bad(op, "an output overlaps an input");
  }
  const OpCost cost =
      AttentionForwardCost(s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, q.t.dtype());
  return DispatchStaged(be, ctx, op, cost, {&q.t, &k.t, &v.t, &out.t},
                        [&](F32Staging& st) -> Status {
                          SK_ASSIGN_OR_RETURN(MatrixRef wq, st.In(q));
                          SK_ASSIGN_OR_RETURN(MatrixRef wk, st.In(k));
                          SK_ASSIGN_OR_RETURN(MatrixRef wv, st.In(v));
                          SK_ASSIGN_OR_RETURN(MatrixRef wo, st.Out(out));
                          return be->AttentionForward(ctx, s, wq, wk, wv, probs, wo);
                        });
}

int64_t ComposedAttentionBackwardGroup(const AttentionShape& s) {
  const int64_t per_seq = s.heads * s.q_len * s.kv_len;
  if (per_seq <= 0) return 1;
  return std::clamp<int64_t>((int64_t{1} << 26) / per_seq, 1, std::max<int64_t>(s.batch, 1));
}

ComposedAttentionBytes ComposedAttentionTemporaryBytes(const AttentionShape& s, DType t) {
  ComposedAttentionBytes b;
  if (s.batch <= 0 || s.heads <= 0 || s.q_len <= 0) return b;
  const int64_t hpq = s.heads * s.q_len * s.kv_len;  // one sequence's scores
  const int64_t all = s.batch * hpq;
  const int64_t half = t == DType::kF32 ? 0 : static_cast<int64_t>(DTypeSize(t));
  // k or v repeated per query head: [batch * kv_len, heads * head_dim] in t.
  const int64_t repeated =
      s.Group() > 1 ? s.batch * s.kv_len * s.heads * s.head_dim * static_cast<int64_t>(DTypeSize(t)) : 0;
  b.forward = 4 * all + half * all + 2 * repeated;
  const int64_t group = ComposedAttentionBackwardGroup(s);
  b.backward = 4 * all + 4 * hpq + (group > 1 ? 4 * group * hpq : 0) + 2 * half * group * hpq +
               4 * repeated;
  return b;
}

int64_t AttentionBackwardScratchElements(const AttentionShape& s) {
  if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return 0;
  return s.heads * s.q_len * s.kv_len;
}

Status AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                         const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                         const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                         const MatrixRef& dv) {
  const char* op = "attention_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckAttention(op, ctx, s, {{"q", &q}, {"dout", &dout}, {"dq", &dq}},
                                    {{"k", &k}, {"v", &v}, {"dk", &dk}, {"dv", &dv}}, probs));
  if (AnyOverlap({&dq.t, &dk.t, &dv.t}, {&q.t, &k.t, &v.t, &probs, &dout.t})) {
    return Bad(op, "an output overlaps an input");
  }
  // The workspace comes from ctx.alloc here, for every backend alike, so
  // the simulator's memory is the executing backends' (and is counted).
  Tensor scratch;
  if (const int64_t n = AttentionBackwardScratchElements(s); n > 0) {
    SK_ASSIGN_OR_RETURN(scratch, ctx.alloc->Empty(DType::kF32, Shape{n}));
  }
  const OpCost cost =
      AttentionBackwardCost(s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, q.t.dtype());
  return DispatchStaged(be, ctx, op, cost, {&q.t, &k.t, &v.t, &dout.t, &dq.t, &dk.t, &dv.t},
                        [&](F32Staging& st) -> Status {
                          SK_ASSIGN_OR_RETURN(MatrixRef wq, st.In(q));
                          SK_ASSIGN_OR_RETURN(MatrixRef wk, st.In(k));
                          SK_ASSIGN_OR_RETURN(MatrixRef wv, st.In(v));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdo, st.In(dout));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdq, st.Out(dq));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdk, st.Out(dk));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdv, st.Out(dv));
                          return be->AttentionBackward(ctx, s, wq, wk, wv, probs, wdo, wdq, wdk,
                                                       wdv, scratch);
                        });
}

// ---- Attention in linear memory ----------------------------------------------------

namespace {

// The views of AttentionForward's checks (probs aside) and lse
// [batch, heads, q_len] f32.
Status CheckFlashAttention(const char* op, const OpContext& ctx, const AttentionShape& s,
                           std::initializer_list<std::pair<const char*, const MatrixRef*>> q_rows,
                           std::initializer_list<std::pair<const char*, const MatrixRef*>> kv_rows,
                           const Tensor& lse) {
  SK_RETURN_IF_ERROR(CheckAttentionViews(op, ctx, s, q_rows, kv_rows));
  SK_RETURN_IF_ERROR(CheckTensor(op, "lse", ctx, lse, {DType::kF32}));
  return CheckNumel(op, "lse", lse, s.batch * s.heads * s.q_len);
}

}  // namespace

Status FlashAttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                             const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                             const Tensor& lse) {
  const char* op = "flash_attention_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(
      CheckFlashAttention(op, ctx, s, {{"q", &q}, {"out", &out}}, {{"k", &k}, {"v", &v}}, lse));
  if (AnyOverlap({&out.t, &lse}, {&q.t, &k.t, &v.t})) return Bad(op, "an output overlaps an input");
  if (Overlap(out.t, lse)) return Bad(op, "out overlaps lse");
  const OpCost cost =
      FlashAttentionForwardCost(s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, s.causal,
                                q.t.dtype(), s.kv_heads, s.masked_pairs);
  return DispatchStaged(be, ctx, op, cost, {&q.t, &k.t, &v.t, &out.t},
                        [&](F32Staging& st) -> Status {
                          SK_ASSIGN_OR_RETURN(MatrixRef wq, st.In(q));
                          SK_ASSIGN_OR_RETURN(MatrixRef wk, st.In(k));
                          SK_ASSIGN_OR_RETURN(MatrixRef wv, st.In(v));
                          SK_ASSIGN_OR_RETURN(MatrixRef wo, st.Out(out));
                          return be->FlashAttentionForward(ctx, s, wq, wk, wv, wo, lse);
                        });
}

bool PrefersFlashAttention(const OpContext& ctx, const AttentionShape& s, DType t) {
  return ctx.device != nullptr && PrefersFlashAttention(ctx.device->id().kind, s, t);
}

bool PrefersFlashAttention(DeviceKind kind, const AttentionShape& s, DType t) {
  if (const OpBackend* be = BackendFor(kind); be != nullptr) return be->PrefersFlashAttention(s, t);
  return kind == DeviceKind::kSim && CpuPrefersFlashAttention(s);
}

int64_t FlashAttentionBackwardWorkspaceElements(const AttentionShape& s) {
  return s.batch * s.heads * s.q_len * (s.head_dim + 1);
}

Status FlashAttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                              const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                              const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                              const MatrixRef& dk, const MatrixRef& dv) {
  const char* op = "flash_attention_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckFlashAttention(
      op, ctx, s, {{"q", &q}, {"out", &out}, {"dout", &dout}, {"dq", &dq}},
      {{"k", &k}, {"v", &v}, {"dk", &dk}, {"dv", &dv}}, lse));
  if (AnyOverlap({&dq.t, &dk.t, &dv.t}, {&q.t, &k.t, &v.t, &out.t, &dout.t, &lse})) {
    return Bad(op, "an output overlaps an input");
  }
  // From ctx.alloc for every backend alike, so the simulator's memory is
  // the executing backends'.
  Tensor workspace;
  if (const int64_t n = FlashAttentionBackwardWorkspaceElements(s); n > 0) {
    SK_ASSIGN_OR_RETURN(workspace, ctx.alloc->Empty(DType::kF32, Shape{n}));
  }
  const OpCost cost =
      FlashAttentionBackwardCost(s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, s.causal,
                                 q.t.dtype(), s.kv_heads, s.masked_pairs);
  return DispatchStaged(be, ctx, op, cost, {&q.t, &k.t, &v.t, &out.t, &dout.t, &dq.t, &dk.t, &dv.t},
                        [&](F32Staging& st) -> Status {
                          SK_ASSIGN_OR_RETURN(MatrixRef wq, st.In(q));
                          SK_ASSIGN_OR_RETURN(MatrixRef wk, st.In(k));
                          SK_ASSIGN_OR_RETURN(MatrixRef wv, st.In(v));
                          SK_ASSIGN_OR_RETURN(MatrixRef wo, st.In(out));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdo, st.In(dout));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdq, st.Out(dq));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdk, st.Out(dk));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdv, st.Out(dv));
                          return be->FlashAttentionBackward(ctx, s, wq, wk, wv, wo, wdo, lse, wdq,
                                                            wdk, wdv, workspace);
                        });
}

// ---- Embedding and loss -----------------------------------------------------------

Status EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids,
                        const Tensor& out) {
  const char* op = "embedding_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "table", ctx, table));
  SK_RETURN_IF_ERROR(CheckTensor(op, "ids", ctx, ids, {DType::kI32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "out", ctx, out));
  if (table.shape().rank() != 2) return Bad(op, "table must be [vocab, dim], got " + table.ToString());
  const int64_t dim = table.shape().dim(1);
  SK_RETURN_IF_ERROR(CheckNumel(op, "out", out, ids.numel() * dim));
  if (Overlap(out, table)) return Bad(op, "out overlaps table");
  const OpCost cost = EmbeddingForwardCost(ids.numel(), dim, table.dtype(), out.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wt, st.In(table));
    SK_ASSIGN_OR_RETURN(Tensor wo, st.Out(out));
    return be->EmbeddingForward(ctx, wt, ids, wo);
  });
}

Status EmbeddingBackward(const OpContext& ctx, const Tensor& ids, const Tensor& dout,
                         const Tensor& dtable) {
  const char* op = "embedding_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "ids", ctx, ids, {DType::kI32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "dout", ctx, dout));
  SK_RETURN_IF_ERROR(CheckTensor(op, "dtable", ctx, dtable, {DType::kF32}));
  if (dtable.shape().rank() != 2) {
    return Bad(op, "dtable must be [vocab, dim], got " + dtable.ToString());
  }
  const int64_t dim = dtable.shape().dim(1);
  SK_RETURN_IF_ERROR(CheckNumel(op, "dout", dout, ids.numel() * dim));
  if (Overlap(dout, dtable)) return Bad(op, "dout overlaps dtable");
  const OpCost cost = EmbeddingBackwardCost(ids.numel(), dim, dout.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wd, st.In(dout));
    return be->EmbeddingBackward(ctx, ids, wd, dtable);
  });
}

namespace {

Status CheckLoss(const char* op, const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                 int64_t* vocab) {
  SK_RETURN_IF_ERROR(CheckTensor(op, "logits", ctx, logits));
  SK_RETURN_IF_ERROR(CheckTensor(op, "targets", ctx, targets, {DType::kI32}));
  SK_RETURN_IF_ERROR(RowsOf(op, "logits", logits.numel(), targets.numel(), vocab));
  if (targets.numel() > 0 && *vocab == 0) return Bad(op, "logits have no columns");
  return OkStatus();
}

}  // namespace

Status CrossEntropyForward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                           const Tensor& loss) {
  const char* op = "cross_entropy_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  int64_t vocab = 0;
  SK_RETURN_IF_ERROR(CheckLoss(op, ctx, logits, targets, &vocab));
  SK_RETURN_IF_ERROR(CheckTensor(op, "loss", ctx, loss, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "loss", loss, 1));
  if (Overlap(loss, logits)) return Bad(op, "loss overlaps logits");
  const OpCost cost = CrossEntropyForwardCost(targets.numel(), vocab, logits.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wl, st.In(logits));
    return be->CrossEntropyForward(ctx, wl, targets, loss);
  });
}

Status CrossEntropyBackward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                            const Tensor& dlogits, float scale) {
  const char* op = "cross_entropy_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  int64_t vocab = 0;
  SK_RETURN_IF_ERROR(CheckLoss(op, ctx, logits, targets, &vocab));
  SK_RETURN_IF_ERROR(CheckTensor(op, "dlogits", ctx, dlogits));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dlogits", dlogits, logits.numel()));
  if (Same(logits, dlogits) ? logits.dtype() != dlogits.dtype() : Overlap(logits, dlogits)) {
    return Bad(op, "dlogits overlaps logits");
  }
  if (!(scale >= 0.0f) || !std::isfinite(scale)) {
    return Bad(op, "scale must be finite and >= 0 (0: 1 / count), got " + std::to_string(scale));
  }
  const OpCost cost =
      CrossEntropyBackwardCost(targets.numel(), vocab, logits.dtype(), dlogits.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wl, st.In(logits));
    SK_ASSIGN_OR_RETURN(Tensor wd, st.Out(dlogits));
    return be->CrossEntropyBackward(ctx, wl, targets, wd, scale);
  });
}

Status CrossEntropyRowLosses(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                             const Tensor& row_loss) {
  const char* op = "cross_entropy_rows";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  int64_t vocab = 0;
  SK_RETURN_IF_ERROR(CheckLoss(op, ctx, logits, targets, &vocab));
  SK_RETURN_IF_ERROR(CheckTensor(op, "row_loss", ctx, row_loss, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "row_loss", row_loss, targets.numel()));
  if (Overlap(row_loss, logits)) return Bad(op, "row_loss overlaps logits");
  const OpCost cost = CrossEntropyRowLossesCost(targets.numel(), vocab, logits.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wl, st.In(logits));
    return be->CrossEntropyRowLosses(ctx, wl, targets, row_loss);
  });
}

Status CrossEntropyMean(const OpContext& ctx, const Tensor& row_loss, const Tensor& targets,
                        const Tensor& loss) {
  const char* op = "cross_entropy_mean";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "row_loss", ctx, row_loss, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "targets", ctx, targets, {DType::kI32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "row_loss", row_loss, targets.numel()));
  SK_RETURN_IF_ERROR(CheckTensor(op, "loss", ctx, loss, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "loss", loss, 1));
  if (Overlap(loss, row_loss)) return Bad(op, "loss overlaps row_loss");
  return Dispatch(be, ctx, CrossEntropyMeanCost(targets.numel()),
                  [&] { return be->CrossEntropyMean(ctx, row_loss, targets, loss); });
}

// ---- Reductions ---------------------------------------------------------------------

namespace {

// SumOfSquares' and MaxAbs's operands: a float x and one f64 accumulator.
Status CheckReduction(const char* op, const OpContext& ctx, const Tensor& x, const Tensor& acc) {
  SK_RETURN_IF_ERROR(CheckTensor(op, "x", ctx, x));
  SK_RETURN_IF_ERROR(CheckTensor(op, "acc", ctx, acc, {DType::kF64}));
  return CheckNumel(op, "acc", acc, 1);
}

}  // namespace

Status SumOfSquares(const OpContext& ctx, const Tensor& x, const Tensor& acc) {
  const char* op = "sum_of_squares";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckReduction(op, ctx, x, acc));
  return Dispatch(be, ctx, SumOfSquaresCost(x.numel(), x.dtype()),
                  [&] { return be->SumOfSquares(ctx, x, acc); });
}

Status MaxAbs(const OpContext& ctx, const Tensor& x, const Tensor& acc) {
  const char* op = "max_abs";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckReduction(op, ctx, x, acc));
  return Dispatch(be, ctx, MaxAbsCost(x.numel(), x.dtype()), [&] { return be->MaxAbs(ctx, x, acc); });
}

// ---- Optimizer updates -----------------------------------------------------------------

Status SgdUpdate(const OpContext& ctx, const SgdHyper& h, const Tensor& param, const Tensor& grad,
                 const Tensor& momentum) {
  const char* op = "sgd_update";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "param", ctx, param, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "grad", ctx, grad, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "grad", grad, param.numel()));
  const bool has_momentum = h.momentum != 0.0f;
  if (has_momentum) {
    SK_RETURN_IF_ERROR(CheckTensor(op, "momentum", ctx, momentum, {DType::kF32}));
    SK_RETURN_IF_ERROR(CheckNumel(op, "momentum", momentum, param.numel()));
    if (Overlap(momentum, param) || Overlap(momentum, grad)) {
      return Bad(op, "momentum overlaps param or grad");
    }
  }
  if (Overlap(param, grad)) return Bad(op, "param overlaps grad");
  return Dispatch(be, ctx, SgdUpdateCost(param.numel(), has_momentum),
                  [&] { return be->SgdUpdate(ctx, h, param, grad, momentum); });
}

Status AdamUpdate(const OpContext& ctx, const AdamHyper& h, const Tensor& param,
                  const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  const char* op = h.decoupled ? "adamw_update" : "adam_update";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  for (auto [what, t] : {std::pair<const char*, const Tensor*>{"param", &param}, {"grad", &grad},
                         {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}) {
    SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, *t, {DType::kF32}));
    SK_RETURN_IF_ERROR(CheckNumel(op, what, *t, param.numel()));
  }
  const Tensor* ts[] = {&param, &grad, &exp_avg, &exp_avg_sq};
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) {
      if (Overlap(*ts[i], *ts[j])) return Bad(op, "param, grad and state tensors overlap");
    }
  }
  return Dispatch(be, ctx, AdamUpdateCost(param.numel(), h.decoupled),
                  [&] { return be->AdamUpdate(ctx, h, param, grad, exp_avg, exp_avg_sq); });
}

// ---- Reading values back ---------------------------------------------------------------

StatusOr<double> ReadScalar(const OpContext& ctx, const Tensor& t) {
  const char* op = "read_scalar";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "t", ctx, t,
                                 {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "t", t, 1));
  SK_RETURN_IF_ERROR(be->Account(ctx, ReadScalarCost(t.dtype())));
  if (!be->executes()) return std::numeric_limits<double>::quiet_NaN();
  return be->ReadScalar(ctx, t);
}

StatusOr<std::vector<double>> ReadValues(const OpContext& ctx, const Tensor& t) {
  const char* op = "read_values";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "t", ctx, t,
                                 {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32}));
  if (t.numel() < 1 || t.numel() > kMaxReadValues) {
    return InvalidArgumentError(std::string(op) + ": t has " + std::to_string(t.numel()) +
                                " elements; reads 1 to " + std::to_string(kMaxReadValues));
  }
  SK_RETURN_IF_ERROR(be->Account(ctx, ReadValuesCost(t.dtype(), t.numel())));
  std::vector<double> out(static_cast<size_t>(t.numel()), std::numeric_limits<double>::quiet_NaN());
  if (!be->executes()) return out;
  SK_RETURN_IF_ERROR(be->ReadValues(ctx, t, out.data()));
  return out;
}

}  // namespace sk::ops
