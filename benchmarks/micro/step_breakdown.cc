// Where a training step's CPU time goes, op by op, against the machine's
// measured f32 FMA peak (issue 16).
//
//   ./bazelw run -c opt //benchmarks:step_breakdown --
//       [--models=gpt-10m,gpt-deep-20m] [--modes=FULL_SHARD,DDP] [--world=2]
//       [--batch=8] [--seq=N] [--steps=3] [--optimizer=adamw] [--param_dtype=f32|bf16] [--gemm_shapes]
//       [--widen_bf16_attention] [--bf16_gemm=onednn|widened] [--unfused_bias]
//       [--forward_prefetch]
//
// Each configuration trains `world` ranks as threads of this process (local
// backend, one GEMM thread per rank when the ranks fill the cores: Trainer's
// default), one warm-up step, then `steps` measured steps. Every op goes
// through a timing decorator registered as the CPU op backend: it forwards
// each op to the real CPU backend and charges the calling thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID: robust to other jobs on a shared machine) and the
// op's declared FLOPs (runtime/ops/cost.h) to the op's name. Attention's GEMMs
// run inside the attention op and are charged to it; "gemm" is the Linear
// layers and the LM head; --gemm_shapes splits it into one row per shape
// ("gemm MxNxK" and N/T for op(A), op(B)), so a slow shape is visible. Casts
// the dispatcher makes to stage another op's 16-bit operands through f32
// (a backend without 16-bit kernels for that op) are charged to
// "f32_staging_cast", not counted as calls of that op.
//
// Printed per configuration: the step's wall time and process CPU time, the
// model-FLOPs utilisation (model FLOPs over process CPU-seconds against one
// thread's peak, and over wall time against all threads' peak), then a row per
// op: calls, CPU ms per step (summed over ranks), share of the step's process
// CPU time, GFLOP per CPU-second and that as a fraction of one thread's peak.
// bf16 runs also give the step's model FLOPs per CPU-second against the
// measured bf16 dot-product peak (peak.h: MeasureBf16DotPeak).
// "(not in ops)" is the rest of the process CPU time: collectives, FSDP/DDP
// machinery, the framework and idle spinning. --widen_bf16_attention runs
// bf16 attention on operands widened to f32 (the path without AVX512-BF16)
// instead of bf16 dot products (kernels.h: NativeBf16Attention), for an A/B
// of that choice in one run; the header line says which path ran.
// --bf16_gemm=onednn|widened overrides the CPU backend's choice for bf16
// GEMMs (kernels.h: NativeBf16Gemm): oneDNN's bf16 matmul, or operands
// widened to f32 and the f32 GEMM; the header line says which ran.
// --unfused_bias runs each linear layer's bias as its own op (written into
// the output, the GEMM accumulating onto it: what a backend without a fused
// bias runs) instead of inside the bf16 GEMM (ops.h: GemmBias), the A/B of
// that choice; the header line says "bias unfused" when it is.
// --seq sets the sequence length (default: the model's own); --models also
// takes a Hugging Face directory with a config.json (llama_compare.py's).
// --forward_prefetch turns on FSDP's forward prefetch (docs/fsdp.md) for the
// FULL_SHARD runs.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "benchmarks/micro/peak.h"
#include "tools/cli_flags.h"
#include "runtime/comm/local_backend.h"
#include "runtime/ops/backend.h"
#include "runtime/ops/cpu/cpu_backend.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/ops.h"
#include "runtime/train/local_session.h"

namespace sk {
namespace {

using bench::CpuSeconds;

struct OpStats {
  int64_t calls = 0;
  double cpu_s = 0;
  double flops = 0;
};

// Forwards every op to `inner` and charges its thread CPU time to the name
// of the cost the dispatcher accounted just before (same thread).
class TimingBackend final : public ops::OpBackend {
 public:
  explicit TimingBackend(ops::OpBackend* inner) : inner_(inner) {}
  void SetUnfusedBias(bool on) { unfused_bias_ = on; }
  const char* name() const override { return inner_->name(); }
  bool executes() const override { return true; }

  Status Account(const ops::OpContext& ctx, const ops::OpCost& cost) override {
    current_name_ = cost.name;
    current_flops_ = cost.flops;
    return inner_->Account(ctx, cost);
  }

  // What the dispatcher asks the backend about 16-bit operands: the inner
  // backend's answers, so ops are staged (or not) as without the decorator.
  bool GemmStores16Bit(const ops::GemmParams& p) const override {
    return inner_->GemmStores16Bit(p);
  }
  bool Native16Bit(std::string_view op) const override { return inner_->Native16Bit(op); }
  bool GemmAddsBias(const ops::GemmParams& p, DType ab, DType bias, DType c) const override {
    return !unfused_bias_ && inner_->GemmAddsBias(p, ab, bias, c);
  }
  // The fused epilogues are the inner backend's too (each adds the bias, so
  // --unfused_bias turns them off with it): without these answers every
  // GPT block's GEMMs were timed unfused.
  bool GemmAddsResidual(const ops::GemmParams& p, DType ab, DType bias, DType residual,
                        DType c) const override {
    return !unfused_bias_ && inner_->GemmAddsResidual(p, ab, bias, residual, c);
  }
  bool GemmFusesGelu(const ops::GemmParams& p, DType ab, DType bias, DType pre, DType c) const override {
    return !unfused_bias_ && inner_->GemmFusesGelu(p, ab, bias, pre, c);
  }

  void SetEnabled(bool on) { enabled_.store(on); }
  // Charges each GEMM shape to its own row instead of one "gemm" row.
  void SetGemmShapes(bool on) { gemm_shapes_ = on; }
  std::map<std::string, OpStats> TakeStats() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(stats_, {});
  }

  // A GEMM under "gemm", or with --gemm_shapes under one row per shape:
  // "gemm MxNxK NT" (op(A) transposed or not, op(B)) and `suffix`.
  template <typename Fn>
  Status TimedGemm(const ops::GemmParams& p, const char* suffix, Fn run) {
    char name[96];
    if (gemm_shapes_) {
      std::snprintf(name, sizeof(name), "gemm %lldx%lldx%lld %c%c%s", static_cast<long long>(p.m),
                    static_cast<long long>(p.n), static_cast<long long>(p.k),
                    p.trans_a ? 'T' : 'N', p.trans_b ? 'T' : 'N', suffix);
    }
    const double flops = current_flops_;
    const double t0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
    Status result = run();
    Record(gemm_shapes_ ? name : current_name_, flops, CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - t0);
    return result;
  }

#define SK_TIMED(call)                                               \
  do {                                                               \
    const char* name = current_name_;                                \
    const double flops = current_flops_;                             \
    const double t0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);           \
    auto result = (call);                                            \
    Record(name, flops, CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - t0);   \
    return result;                                                   \
  } while (0)

  Status Gemm(const ops::OpContext& c, const ops::GemmParams& p, const ops::MatrixRef& a,
              const ops::MatrixRef& b, const ops::MatrixRef& m) override {
    return TimedGemm(p, "", [&] { return inner_->Gemm(c, p, a, b, m); });
  }
  Status GemmBias(const ops::OpContext& c, const ops::GemmParams& p, const ops::MatrixRef& a,
                  const ops::MatrixRef& b, const Tensor& bias, const ops::MatrixRef& m) override {
    return TimedGemm(p, " +bias", [&] { return inner_->GemmBias(c, p, a, b, bias, m); });
  }
  Status GemmBiasResidual(const ops::OpContext& c, const ops::GemmParams& p, const ops::MatrixRef& a,
                          const ops::MatrixRef& b, const Tensor& bias, const Tensor& residual,
                          const ops::MatrixRef& m) override {
    return TimedGemm(p, " +bias+residual", [&] { return inner_->GemmBiasResidual(c, p, a, b, bias, residual, m); });
  }
  Status GemmBiasGelu(const ops::OpContext& c, const ops::GemmParams& p, const ops::MatrixRef& a,
                      const ops::MatrixRef& b, const Tensor& bias, const Tensor& pre,
                      const Tensor& out) override {
    return TimedGemm(p, " +bias+gelu", [&] { return inner_->GemmBiasGelu(c, p, a, b, bias, pre, out); });
  }
  Status GemmGeluBackward(const ops::OpContext& c, const ops::GemmParams& p, const ops::MatrixRef& a,
                          const ops::MatrixRef& b, const Tensor& pre, const ops::MatrixRef& m) override {
    return TimedGemm(p, " *gelu'", [&] { return inner_->GemmGeluBackward(c, p, a, b, pre, m); });
  }
  Status Copy(const ops::OpContext& c, const Tensor& s, const Tensor& d) override {
    SK_TIMED(inner_->Copy(c, s, d));
  }
  Status Cast(const ops::OpContext& c, const Tensor& s, const Tensor& d) override {
    if (std::strcmp(current_name_, "cast") != 0) {
      // The dispatcher staging another op's 16-bit operand through f32
      // (dispatch.h: F32Staging): its own row, not another call of that op.
      const double t0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
      Status result = inner_->Cast(c, s, d);
      Record("f32_staging_cast", 0.0, CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - t0);
      return result;
    }
    SK_TIMED(inner_->Cast(c, s, d));
  }
  Status RoundToDType(const ops::OpContext& c, const Tensor& x, DType t) override {
    SK_TIMED(inner_->RoundToDType(c, x, t));
  }
  Status Scale(const ops::OpContext& c, const Tensor& x, float a) override {
    SK_TIMED(inner_->Scale(c, x, a));
  }
  Status Axpy(const ops::OpContext& c, float a, const Tensor& x, const Tensor& y) override {
    SK_TIMED(inner_->Axpy(c, a, x, y));
  }
  Status Fill(const ops::OpContext& c, const Tensor& x, float v) override {
    SK_TIMED(inner_->Fill(c, x, v));
  }
  Status InitPhilox(const ops::OpContext& c, const Initializer& init, uint64_t seed,
                    uint64_t id, int64_t begin, const Tensor& out) override {
    SK_TIMED(inner_->InitPhilox(c, init, seed, id, begin, out));
  }
  Status BroadcastRows(const ops::OpContext& c, const Tensor& s, const Tensor& d) override {
    SK_TIMED(inner_->BroadcastRows(c, s, d));
  }
  Status BiasAdd(const ops::OpContext& c, const Tensor& b, const Tensor& y) override {
    SK_TIMED(inner_->BiasAdd(c, b, y));
  }
  Status BiasGrad(const ops::OpContext& c, const Tensor& dy, const Tensor& db) override {
    SK_TIMED(inner_->BiasGrad(c, dy, db));
  }
  Status GeluForward(const ops::OpContext& c, const Tensor& x, const Tensor& y) override {
    SK_TIMED(inner_->GeluForward(c, x, y));
  }
  Status GeluBackward(const ops::OpContext& c, const Tensor& x, const Tensor& dy,
                      const Tensor& dx) override {
    SK_TIMED(inner_->GeluBackward(c, x, dy, dx));
  }
  Status LayerNormForward(const ops::OpContext& c, const Tensor& x, const Tensor& g,
                          const Tensor& b, const Tensor& y, const Tensor& m,
                          const Tensor& r) override {
    SK_TIMED(inner_->LayerNormForward(c, x, g, b, y, m, r));
  }
  Status LayerNormBackward(const ops::OpContext& c, const Tensor& x, const Tensor& g,
                           const Tensor& dy, const Tensor& m, const Tensor& r, const Tensor& dx,
                           const Tensor& dg, const Tensor& db) override {
    SK_TIMED(inner_->LayerNormBackward(c, x, g, dy, m, r, dx, dg, db));
  }
  Status AttentionForward(const ops::OpContext& c, const ops::AttentionShape& s,
                          const ops::MatrixRef& q, const ops::MatrixRef& k,
                          const ops::MatrixRef& v, const Tensor& p,
                          const ops::MatrixRef& o) override {
    SK_TIMED(inner_->AttentionForward(c, s, q, k, v, p, o));
  }
  Status AttentionBackward(const ops::OpContext& c, const ops::AttentionShape& s,
                           const ops::MatrixRef& q, const ops::MatrixRef& k,
                           const ops::MatrixRef& v, const Tensor& p, const ops::MatrixRef& dout,
                           const ops::MatrixRef& dq, const ops::MatrixRef& dk,
                           const ops::MatrixRef& dv, const Tensor& scratch) override {
    SK_TIMED(inner_->AttentionBackward(c, s, q, k, v, p, dout, dq, dk, dv, scratch));
  }
  // The Llama family's ops (without them a Llama step failed here as not
  // implemented) and the linear-memory attention every Llama runs.
  Status RmsNormForward(const ops::OpContext& c, const Tensor& x, const Tensor& g, float eps,
                        const Tensor& y, const Tensor& r) override {
    SK_TIMED(inner_->RmsNormForward(c, x, g, eps, y, r));
  }
  Status RmsNormBackward(const ops::OpContext& c, const Tensor& x, const Tensor& g,
                         const Tensor& dy, const Tensor& r, const Tensor& dx,
                         const Tensor& dg) override {
    SK_TIMED(inner_->RmsNormBackward(c, x, g, dy, r, dx, dg));
  }
  Status Rope(const ops::OpContext& c, const Tensor& x, int64_t seq_len, int64_t heads,
              int64_t head_dim, float theta, const RopeScaling& scaling, bool inverse,
              const Tensor& y, const Tensor& positions) override {
    SK_TIMED(inner_->Rope(c, x, seq_len, heads, head_dim, theta, scaling, inverse, y, positions));
  }
  Status SwiGluForward(const ops::OpContext& c, const Tensor& g, const Tensor& u,
                       const Tensor& y) override {
    SK_TIMED(inner_->SwiGluForward(c, g, u, y));
  }
  Status SwiGluBackward(const ops::OpContext& c, const Tensor& g, const Tensor& u,
                        const Tensor& dy, const Tensor& dg, const Tensor& du) override {
    SK_TIMED(inner_->SwiGluBackward(c, g, u, dy, dg, du));
  }
  bool PrefersFlashAttention(const ops::AttentionShape& s, DType t) const override {
    return inner_->PrefersFlashAttention(s, t);
  }
  Status FlashAttentionForward(const ops::OpContext& c, const ops::AttentionShape& s,
                               const ops::MatrixRef& q, const ops::MatrixRef& k,
                               const ops::MatrixRef& v, const ops::MatrixRef& o,
                               const Tensor& lse) override {
    SK_TIMED(inner_->FlashAttentionForward(c, s, q, k, v, o, lse));
  }
  Status FlashAttentionBackward(const ops::OpContext& c, const ops::AttentionShape& s,
                                const ops::MatrixRef& q, const ops::MatrixRef& k,
                                const ops::MatrixRef& v, const ops::MatrixRef& o,
                                const ops::MatrixRef& dout, const Tensor& lse,
                                const ops::MatrixRef& dq, const ops::MatrixRef& dk,
                                const ops::MatrixRef& dv, const Tensor& w) override {
    SK_TIMED(inner_->FlashAttentionBackward(c, s, q, k, v, o, dout, lse, dq, dk, dv, w));
  }
  Status EmbeddingForward(const ops::OpContext& c, const Tensor& t, const Tensor& ids,
                          const Tensor& o) override {
    SK_TIMED(inner_->EmbeddingForward(c, t, ids, o));
  }
  Status EmbeddingBackward(const ops::OpContext& c, const Tensor& ids, const Tensor& d,
                           const Tensor& dt) override {
    SK_TIMED(inner_->EmbeddingBackward(c, ids, d, dt));
  }
  Status CrossEntropyForward(const ops::OpContext& c, const Tensor& l, const Tensor& t,
                             const Tensor& loss) override {
    SK_TIMED(inner_->CrossEntropyForward(c, l, t, loss));
  }
  Status CrossEntropyBackward(const ops::OpContext& c, const Tensor& l, const Tensor& t,
                              const Tensor& dl, float scale) override {
    SK_TIMED(inner_->CrossEntropyBackward(c, l, t, dl, scale));
  }
  Status CrossEntropyRowLosses(const ops::OpContext& c, const Tensor& l, const Tensor& t,
                               const Tensor& rows) override {
    SK_TIMED(inner_->CrossEntropyRowLosses(c, l, t, rows));
  }
  Status CrossEntropyMean(const ops::OpContext& c, const Tensor& rows, const Tensor& t,
                          const Tensor& loss) override {
    SK_TIMED(inner_->CrossEntropyMean(c, rows, t, loss));
  }
  Status SumOfSquares(const ops::OpContext& c, const Tensor& x, const Tensor& a) override {
    SK_TIMED(inner_->SumOfSquares(c, x, a));
  }
  Status MaxAbs(const ops::OpContext& c, const Tensor& x, const Tensor& a) override {
    SK_TIMED(inner_->MaxAbs(c, x, a));
  }
  Status SgdUpdate(const ops::OpContext& c, const SgdHyper& h, const Tensor& p, const Tensor& g,
                   const Tensor& m) override {
    SK_TIMED(inner_->SgdUpdate(c, h, p, g, m));
  }
  Status AdamUpdate(const ops::OpContext& c, const AdamHyper& h, const Tensor& p,
                    const Tensor& g, const Tensor& m, const Tensor& v) override {
    SK_TIMED(inner_->AdamUpdate(c, h, p, g, m, v));
  }
  StatusOr<double> ReadScalar(const ops::OpContext& c, const Tensor& t) override {
    SK_TIMED(inner_->ReadScalar(c, t));
  }
  Status ReadValues(const ops::OpContext& c, const Tensor& t, double* out) override {
    SK_TIMED(inner_->ReadValues(c, t, out));
  }
#undef SK_TIMED

 private:
  void Record(const std::string& name, double flops, double cpu_s) {
    if (!enabled_.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(mu_);
    OpStats& s = stats_[name];
    ++s.calls;
    s.cpu_s += cpu_s;
    s.flops += flops;
  }

  ops::OpBackend* inner_;
  std::atomic<bool> enabled_{false};
  bool gemm_shapes_ = false;  // set before any rank runs
  bool unfused_bias_ = false;  // set before any rank runs
  std::mutex mu_;
  std::map<std::string, OpStats> stats_;
  static thread_local const char* current_name_;
  static thread_local double current_flops_;
};

thread_local const char* TimingBackend::current_name_ = "unknown";
thread_local double TimingBackend::current_flops_ = 0;

// The reporting groups.
const char* Group(const std::string& op) {
  if (op.rfind("gemm", 0) == 0) return "GEMM";
  if (op.rfind("attention", 0) == 0) return "attention";
  if (op.rfind("layer_norm", 0) == 0) return "LayerNorm";
  if (op.rfind("gelu", 0) == 0) return "GELU";
  if (op.rfind("cross_entropy", 0) == 0) return "cross-entropy";
  if (op == "adamw_update" || op == "adam_update" || op == "sgd_update") return "optimizer";
  if (op == "copy" || op == "cast" || op == "round_to_dtype" || op == "f32_staging_cast") {
    return "copies/casts";
  }
  if (op.rfind("bias", 0) == 0 || op == "axpy" || op == "scale") return "bias/residual/scale";
  if (op.rfind("embedding", 0) == 0) return "embedding";
  return "other ops";
}

struct Flags {
  std::vector<std::string> models = {"gpt-10m", "gpt-deep-20m"};
  std::vector<std::string> modes = {"FULL_SHARD", "DDP"};
  int world = 2;
  int64_t batch = 8;
  int steps = 3;
  std::string optimizer = "adamw";
  bool gemm_shapes = false;
  DType param_dtype = DType::kF32;
  bool widen_bf16_attention = false;
  std::string bf16_gemm;  // "", "onednn" or "widened"
  int64_t seq = 0;        // 0: the model's
  bool unfused_bias = false;
  bool forward_prefetch = false;
};

Status RunOne(TimingBackend& timing, const Flags& f, const std::string& model,
              const std::string& mode, const bench::PeakResult& peak,
              const bench::PeakResult& bf16_peak) {
  TrainerOptions o;
  o.model = model;
  o.batch_size = f.batch;
  if (f.seq > 0) o.seq_len = f.seq;
  if (mode == "DDP") {
    o.parallelism = Parallelism::kDdp;
  } else if (mode == "FULL_SHARD") {
    o.parallelism = Parallelism::kFsdp;
    o.fsdp.strategy = ShardingStrategy::kFullShard;
  } else {
    return InvalidArgumentError("--modes: unknown mode '" + mode + "' (FULL_SHARD or DDP)");
  }
  if (f.optimizer == "adamw") {
    o.optimizer.kind = OptimizerKind::kAdamW;
  } else if (f.optimizer == "sgd") {
    o.optimizer.kind = OptimizerKind::kSgd;
  } else {
    return InvalidArgumentError("--optimizer: adamw or sgd, got '" + f.optimizer + "'");
  }
  // Mixed precision as gpu_train's: the model computes in param_dtype, the
  // reduction and the master weights stay f32 (DDP reads the FSDP options'
  // mixed precision too).
  o.fsdp.mixed_precision.param_dtype = f.param_dtype;
  o.fsdp.mixed_precision.reduce_dtype = DType::kF32;
  o.fsdp.forward_prefetch = f.forward_prefetch;
  SK_ASSIGN_OR_RETURN(auto groups, comm::LocalProcessGroup::Create(f.world));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<LocalSession> session,
                      LocalSession::Create(o, LocalSession::Share(std::move(groups))));
  auto step = [&] { return session->Step().status(); };
  SK_RETURN_IF_ERROR(step());  // warm-up: primitives, optimizer state, allocator
  timing.TakeStats();
  timing.SetEnabled(true);
  double model_flops = 0;  // all ranks, all measured steps
  const double cpu0 = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < f.steps; ++i) {
    SK_RETURN_IF_ERROR(step());
    for (const StepMetrics& m : session->last_metrics()) {
      model_flops += m.model_tflops_per_rank * 1e12 * m.step_seconds;
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / f.steps;
  const double cpu = (CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0) / f.steps;
  timing.SetEnabled(false);
  std::map<std::string, OpStats> stats = timing.TakeStats();
  session.reset();
  model_flops /= f.steps;

  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  const char* attention = f.param_dtype != DType::kBF16 ? ""
                          : NativeBf16Attention()      ? ", bf16 attention on dot products"
                                                       : ", bf16 attention widened to f32";
  const std::string bias = std::string(f.param_dtype != DType::kBF16 ? ""
                                       : NativeBf16Gemm()          ? ", bf16 GEMMs in oneDNN"
                                                                   : ", bf16 GEMMs widened to f32") +
                           (f.unfused_bias ? ", bias unfused" : "") +
                           (f.forward_prefetch && mode != "DDP" ? ", forward prefetch" : "");
  std::printf("\n== %s %s world %d, batch %lld/rank, %s, %s compute%s%s, %d measured steps (load average %.2f) ==\n",
              model.c_str(), mode.c_str(), f.world, static_cast<long long>(f.batch), f.optimizer.c_str(),
              std::string(DTypeName(f.param_dtype)).c_str(), attention, bias.c_str(), f.steps, load[0]);
  std::printf("step: %.1f ms wall, %.1f ms process CPU; model %.2f GFLOP/step; "
              "cpu_MFU %.1f%% (model FLOP per CPU-s / one thread's peak), wall MFU %.1f%% (/ %d threads' peak)\n",
              1e3 * wall, 1e3 * cpu, model_flops / 1e9, 100.0 * model_flops / cpu / peak.per_thread,
              100.0 * model_flops / wall / peak.wall, f.world);
  if (f.param_dtype == DType::kBF16 && bf16_peak.per_thread > 0.0) {
    std::printf("bf16: cpu_MFU %.1f%% of the bf16 dot-product peak (%.1f GFLOP per CPU-second, %s%s)\n",
                100.0 * model_flops / cpu / bf16_peak.per_thread, bf16_peak.per_thread / 1e9,
                bf16_peak.isa,
                bench::HasAmxBf16() ? "; this CPU has AMX, where oneDNN's bf16 GEMMs run above that peak"
                                    : "");
  }
  struct Row {
    std::string name;
    OpStats s;
  };
  std::vector<Row> rows;
  std::map<std::string, OpStats> groups_sum;
  double in_ops = 0;
  for (const auto& [name, s] : stats) {
    rows.push_back({name, s});
    OpStats& g = groups_sum[Group(name)];
    g.calls += s.calls;
    g.cpu_s += s.cpu_s;
    g.flops += s.flops;
    in_ops += s.cpu_s;
  }
  auto print = [&](const std::string& label, const OpStats& s) {
    const double ms = 1e3 * s.cpu_s / f.steps;
    const double rate = s.cpu_s > 0 ? s.flops / s.cpu_s : 0;
    std::printf("  %-26s %8.1f %10.2f %7.1f%% %9.1f %7.1f%%\n", label.c_str(),
                static_cast<double>(s.calls) / f.steps, ms, 100.0 * s.cpu_s / f.steps / cpu, rate / 1e9,
                100.0 * rate / peak.per_thread);
  };
  std::printf("  %-26s %8s %10s %8s %9s %8s\n", "op", "calls", "CPU ms", "of step", "GFLOP/s", "of peak");
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.s.cpu_s > b.s.cpu_s; });
  for (const Row& r : rows) print(r.name, r.s);
  OpStats rest;
  rest.cpu_s = std::max(0.0, cpu * f.steps - in_ops);
  print("(not in ops)", rest);
  std::printf("  -- by group --\n");
  std::vector<Row> grouped;
  for (const auto& [name, s] : groups_sum) grouped.push_back({name, s});
  std::sort(grouped.begin(), grouped.end(), [](const Row& a, const Row& b) { return a.s.cpu_s > b.s.cpu_s; });
  for (const Row& r : grouped) print(r.name, r.s);
  std::fflush(stdout);
  return OkStatus();
}

// A whole decimal number in [lo, hi] (atoi read "4294967297" as 1 and
// "abc" as 0), or an error naming the flag.
StatusOr<int64_t> IntFlag(const char* name, const char* v, int64_t lo, int64_t hi) {
  uint64_t x = 0;
  if (!cli::ParseCount(v, static_cast<uint64_t>(lo), static_cast<uint64_t>(hi), &x)) {
    return InvalidArgumentError(std::string("--") + name + "='" + v + "' is not a whole number in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int64_t>(x);
}

int Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = value("--models=")) {
      f.models = cli::SplitList(v);
    } else if (const char* v = value("--modes=")) {
      f.modes = cli::SplitList(v);
    } else if (const char* v = value("--world=")) {
      StatusOr<int64_t> n = IntFlag("world", v, 1, 1024);
      if (!n.ok()) {
        std::fprintf(stderr, "step_breakdown: %s\n", n.status().ToString().c_str());
        return 1;
      }
      f.world = static_cast<int>(*n);
    } else if (const char* v = value("--batch=")) {
      StatusOr<int64_t> n = IntFlag("batch", v, 1, int64_t{1} << 20);
      if (!n.ok()) {
        std::fprintf(stderr, "step_breakdown: %s\n", n.status().ToString().c_str());
        return 1;
      }
      f.batch = *n;
    } else if (const char* v = value("--steps=")) {
      StatusOr<int64_t> n = IntFlag("steps", v, 1, 100000);
      if (!n.ok()) {
        std::fprintf(stderr, "step_breakdown: %s\n", n.status().ToString().c_str());
        return 1;
      }
      f.steps = static_cast<int>(*n);
    } else if (const char* v = value("--optimizer=")) {
      f.optimizer = v;
    } else if (const char* v = value("--param_dtype=")) {
      StatusOr<DType> d = ParseDType(v);
      if (!d.ok()) {
        std::fprintf(stderr, "step_breakdown: --param_dtype: %s\n", d.status().ToString().c_str());
        return 1;
      }
      f.param_dtype = *d;
    } else if (a == "--gemm_shapes") {
      f.gemm_shapes = true;
    } else if (a == "--widen_bf16_attention") {
      f.widen_bf16_attention = true;
    } else if (a.rfind("--seq=", 0) == 0) {
      f.seq = std::atoll(a.c_str() + 6);
      if (f.seq < 1) {
        std::fprintf(stderr, "step_breakdown: --seq must be >= 1, got '%s'\n", a.c_str() + 6);
        return 1;
      }
    } else if (a.rfind("--bf16_gemm=", 0) == 0) {
      f.bf16_gemm = a.substr(12);
      if (f.bf16_gemm != "onednn" && f.bf16_gemm != "widened") {
        std::fprintf(stderr, "step_breakdown: --bf16_gemm takes onednn or widened, got '%s'\n",
                     f.bf16_gemm.c_str());
        return 1;
      }
    } else if (a == "--unfused_bias") {
      f.unfused_bias = true;
    } else if (a == "--forward_prefetch") {
      f.forward_prefetch = true;
    } else {
      std::fprintf(stderr,
                   "usage: step_breakdown [--models=gpt-10m,gpt-deep-20m] [--modes=FULL_SHARD,DDP] "
                   "[--world=2] [--batch=8] [--seq=N] [--steps=3] [--optimizer=adamw|sgd] [--param_dtype=f32|bf16] "
                   "[--gemm_shapes] [--widen_bf16_attention] [--bf16_gemm=onednn|widened] [--unfused_bias] "
                   "[--forward_prefetch]\n");
      return a == "--help" ? 0 : 1;
    }
  }
  if (f.world < 1 || f.batch < 1 || f.steps < 1) {
    std::fprintf(stderr, "step_breakdown: --world, --batch and --steps must be >= 1\n");
    return 1;
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bench::PeakResult peak = bench::MeasureFmaPeak(std::min(f.world, cores));
  std::printf("f32 FMA peak (%s): %.1f GFLOP per CPU-second of one thread, %.1f GFLOP/s on %d threads\n",
              peak.isa, peak.per_thread / 1e9, peak.wall / 1e9, std::min(f.world, cores));
  // bf16 runs also report against the bf16 dot-product peak (twice the FMA
  // peak where vdpbf16ps issues as often as an FMA; measured, not assumed).
  const bench::PeakResult bf16_peak =
      f.param_dtype == DType::kBF16 ? bench::MeasureBf16DotPeak(std::min(f.world, cores)) : bench::PeakResult{};
  if (f.param_dtype == DType::kBF16) {
    std::printf("bf16 dot-product peak (%s): %.1f GFLOP per CPU-second of one thread%s\n", bf16_peak.isa,
                bf16_peak.per_thread / 1e9,
                bench::HasAmxBf16() ? " (not the ceiling here: AMX tiles run oneDNN's bf16 GEMMs)" : "");
  }
  if (f.widen_bf16_attention) SetNativeBf16Attention(false);
  if (!f.bf16_gemm.empty()) SetNativeBf16Gemm(f.bf16_gemm == "onednn");
  auto* timing = new TimingBackend(ops::CpuOpBackend());  // outlives every op: never freed
  timing->SetGemmShapes(f.gemm_shapes);
  timing->SetUnfusedBias(f.unfused_bias);
  ops::RegisterOpBackend(DeviceKind::kCpu, timing);
  for (const std::string& model : f.models) {
    for (const std::string& mode : f.modes) {
      Status s = RunOne(*timing, f, model, mode, peak, bf16_peak);
      if (!s.ok()) {
        std::fprintf(stderr, "step_breakdown: %s %s: %s\n", model.c_str(), mode.c_str(), s.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) { return sk::Main(argc, argv); }
