// Model: the contract between the reference models and whatever owns their
// parameters (OwnedParameters here; FSDP and DDP from outside).
//
// A model is a sequence of UNITS: one for the embeddings, one per transformer
// block, and one for the head (T5 adds one for the encoder's final norm). Each
// unit declares an ordered list of ParamSpecs. The model never owns parameter
// memory: ForwardBackward asks a UnitHooks object for each unit's parameters
// right before the unit computes and tells it when the unit is done, so a
// wrapper can all-gather shards before a unit and free them after, and can
// reduce-scatter a unit's gradients as soon as they are final.
//
// The call sequence of one ForwardBackward over units 0..U-1 is exactly
//   PreForward(0) PostForward(0) ... PreForward(U-1) PostForward(U-1)
//   PreBackward(U-1) PostBackward(U-1) ... PreBackward(0) PostBackward(0)
// with no other hook calls in between; a hook returning an error stops the
// step and the error is returned (with the unit named). After any error the
// step is abandoned where it stood: the unit that was running gets no Post
// call, so hooks that track state must be reset by their owner. Forward()
// makes only the forward half. Units run in index order, so the order above is also the
// recorded execution order FSDP prefetches by.
//
// Activations and temporaries come from the Allocator passed to each call, so
// a caching allocator's statistics and cap cover them. Every computation is an
// op (runtime/ops/ops.h) on the allocator's device, ordered on the hooks'
// compute_stream(): the models never read tensor data on the host, so they run
// on every device kind with an op backend (cpu, cuda, the simulator). Token
// ids reach the device through the copy op; the loss comes back through
// ops::ReadScalar (NaN on a device that does not execute).
//
// Thread safety: a Model is immutable after construction; concurrent calls
// with distinct hooks and allocators are safe.
#ifndef SHARDKIT_RUNTIME_NN_MODEL_H_
#define SHARDKIT_RUNTIME_NN_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/device/device.h"
#include "runtime/ops/backend.h"  // kIgnoreTarget
#include "runtime/ops/init.h"

namespace sk {

// One parameter of a unit. `name` is unique within its unit; the parameter's
// full name is "<unit name>.<name>" and its id ParamIdFromName(full name).
struct ParamSpec {
  std::string name;
  Shape shape;
  Initializer init;
};

// A parameter that a unit uses but an EARLIER unit owns: a tied parameter,
// as GPT-2's output head reads the token embedding ("embed.wte"). It is one
// parameter: initialised, sharded, optimised, checkpointed and counted once,
// as its owner's. The using unit sees it as an extra tensor after its own
// (see UnitHooks), so the unit's forward and backward read it and add their
// gradient into it like any of their own parameters; the owner's gradient
// is then the sum of both uses. The owner must come first in execution
// order, so its gradient is final only after the later unit's backward has
// added to it (ResolveTiedParams checks this).
struct TiedParamSpec {
  std::string name;   // within the using unit ("lm_head.w"): messages only
  std::string owner;  // the owner's full name, "<unit>.<param>" ("embed.wte")
  Shape shape;        // must equal the owner's shape
};

struct UnitSpec {
  std::string name;
  std::vector<ParamSpec> params;       // owned by this unit
  std::vector<TiedParamSpec> tied;     // owned by earlier units, used here too

  // Total elements over params (tied parameters count with their owner).
  int64_t numel() const;
  // params.size() + tied.size(): the tensors the hooks hand this unit.
  size_t num_tensors() const { return params.size() + tied.size(); }
};

// Where a tied parameter lives: parameter `param` of unit `unit`.
struct ParamRef {
  int unit = -1;
  int param = -1;
};

// For each unit, the owner of each of its tied parameters (same order as
// UnitSpec::tied). InvalidArgument naming the unit and parameter when an
// owner does not exist, is not in an earlier unit, or has another shape,
// when a name is empty or repeated within its unit, or when two units
// declare the same owned full name.
StatusOr<std::vector<std::vector<ParamRef>>> ResolveTiedParams(const std::vector<UnitSpec>& units);

// "<unit>.<param>": the name checkpoints and initialisation use.
std::string FullParamName(const UnitSpec& unit, const ParamSpec& param);

// Tensor `i` of the tensors the hooks hand `unit` (i < unit.num_tensors()):
// its own parameters, then its tied ones. "<unit>.<name>" and the shape.
std::string UnitTensorName(const UnitSpec& unit, size_t i);
const Shape& UnitTensorShape(const UnitSpec& unit, size_t i);

// Elements over all units.
int64_t CountParameters(const std::vector<UnitSpec>& units);

// What PreBackward hands the model: the unit's parameters again and one
// gradient tensor per ParamSpec that the model ADDS its gradient into.
struct UnitBackwardBuffers {
  std::vector<Tensor> params;
  std::vector<Tensor> grads;
};

using ops::kIgnoreTarget;

// Implemented by FSDP, DDP and OwnedParameters. Parameter tensors must be
// tensors of f32, bf16 or f16 with the ParamSpec's shape on the device of the
// allocator passed to the model (its kind is checked), valid until the
// matching Post call; gradient tensors likewise, and the model only adds
// into them (never reads them otherwise, never zeroes).
// A unit with tied parameters gets UnitSpec::num_tensors() tensors: its own
// (params order), then one per UnitSpec::tied entry holding the owner's
// current value, and as gradients buffers whose additions reach the owner's
// gradient (the owner's own buffer, or one the hooks add into it before the
// owner's gradient is final). The owner is not otherwise in use meanwhile:
// the hooks gather it for this use and release it after.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // The stream the model's ops run on (the owner's compute stream). nullptr:
  // the calling thread, which is allowed on cpu only. Default nullptr.
  virtual Stream* compute_stream() { return nullptr; }
  // Before unit `unit` computes forward: its parameters, one per ParamSpec.
  virtual StatusOr<std::vector<Tensor>> PreForward(int unit) = 0;
  // The unit's forward is done; its parameter tensors are no longer used.
  virtual Status PostForward(int unit) = 0;
  // Before unit `unit` computes backward (including any recomputation).
  virtual StatusOr<UnitBackwardBuffers> PreBackward(int unit) = 0;
  // The gradients of unit `unit` are final for this step.
  virtual Status PostBackward(int unit) = 0;
};

// A batch of token ids. Decoder-only models read inputs/targets; the
// encoder-decoder also reads source (its encoder input). targets hold the
// next token per input position, or kIgnoreTarget (-1) to leave it out of the
// loss. The loss is the mean cross-entropy over the non-ignored targets.
struct TokenBatch {
  int64_t batch_size = 0;
  int64_t seq_len = 0;            // decoder positions per sequence
  std::vector<int32_t> inputs;    // [batch_size, seq_len]
  std::vector<int32_t> targets;   // [batch_size, seq_len]
  int64_t source_len = 0;         // encoder positions (encoder-decoder only)
  std::vector<int32_t> source;    // [batch_size, source_len]
  // Packed documents (decoder-only models). Each is empty (absent) or
  // [batch_size, seq_len]. positions: the position id of each token (what
  // its learned or rotary position embedding uses); absent = 0..seq_len-1 in
  // every row. segment_ids: the document of each token, non-decreasing
  // along a row; a query attends only to earlier keys of its own document
  // (block-diagonal causal attention); absent = one document per row. GPT
  // and the Llama family honour both in forward and backward (positions
  // in [0, max_seq_len)), on every device kind; a model that cannot
  // honour one refuses the batch (the encoder-decoder, the unit-table
  // models), never ignores it.
  std::vector<int32_t> positions;
  std::vector<int32_t> segment_ids;
  // What the gradient of ForwardBackward normalises by. 0 (the default):
  // the batch's own count of counted targets, so the gradient is that of
  // the mean loss it returns. D > 0: the gradient is that of (the sum of
  // the counted targets' cross-entropies) / D, while the returned loss stays
  // the batch's mean: how a trainer makes one mean over several
  // micro-batches and ranks (runtime/train/loss_normalization.h). Finite
  // and >= 0, else InvalidArgument.
  double loss_denominator = 0;

  int64_t num_target_tokens() const { return batch_size * seq_len; }
};

// What each transformer block keeps from its forward for its backward.
enum class ActivationCheckpointing {
  // Everything the backward reads.
  kNone = 0,
  // Only the block's input; the whole block runs again during backward
  // (after PreBackward, with the parameters it returns).
  kFull = 1,
  // The GEMM outputs (q/k/v, attention, MLP up/gate projections, the
  // residual stream) and the attention's output and state (unless
  // recompute_attention, below); the cheap ops whose
  // outputs the backward reads (norms, GELU / SiLU-mul) run again during
  // backward from those, per block, just before its backward.
  kSelective = 2,
  // Selective, and every other GEMM of the block recomputed as well
  // (torchtitan's op-level selective policy: counting a block's matmuls in
  // forward order, the odd ones' outputs are kept and the even ones'
  // recomputed, the attention's output and state kept). For a Llama block
  // (q, k, v, o, gate, up, down) it keeps q, v, gate and drops k, the
  // attention residual x2 (o's output) and up, which run again before the
  // block's backward from the kept tensors. Llama family only.
  kSelectiveMatmuls = 3,
};

// "off", "on" (full), "selective" or "selective_matmuls".
const char* ActivationCheckpointingName(ActivationCheckpointing c);

// The policy a command line names: "off" (or "false", "0"), "on" ("true",
// "1", "full"), "selective" or "selective_matmuls"; InvalidArgument naming
// `flag` and the spellings otherwise. What train and plan's --checkpointing read.
StatusOr<ActivationCheckpointing> ParseActivationCheckpointing(const std::string& text,
                                                               const std::string& flag);

struct ModelOptions {
  // f32, or bf16 / f16: parameters and activations held at that precision
  // with f32 arithmetic and accumulation (on the CPU each activation is
  // rounded where a GPU kernel would store it). Independently of this, hooks
  // may hand out parameters and gradient buffers in any of the three dtypes.
  DType compute_dtype = DType::kF32;
  // The older spelling of checkpointing = kFull, kept for its callers: true
  // means whole-block checkpointing whatever `checkpointing` says (except
  // the selective policies, a conflict: InvalidArgument at model creation).
  bool activation_checkpointing = false;
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  // With kSelective only: also drop each attention's output and the state
  // its backward reads (probabilities or log-sum-exp) and recompute the
  // attention from the kept q/k/v before the block's backward (its two
  // products count as recomputed flops). Otherwise InvalidArgument.
  bool recompute_attention = false;

  // The policy the two fields above resolve to.
  ActivationCheckpointing checkpointing_policy() const {
    return activation_checkpointing ? ActivationCheckpointing::kFull : checkpointing;
  }
  bool full_checkpointing() const {
    return checkpointing_policy() == ActivationCheckpointing::kFull;
  }
  bool selective_checkpointing() const {
    return checkpointing_policy() == ActivationCheckpointing::kSelective;
  }
  bool selective_matmul_checkpointing() const {
    return checkpointing_policy() == ActivationCheckpointing::kSelectiveMatmuls;
  }
};

// InvalidArgument naming `model` when the options ask for something
// contradictory (activation_checkpointing with a selective policy,
// recompute_attention without kSelective),
// an enum value out of range, or a selective policy from a model that
// does not implement it (supports_selective, supports_selective_matmuls false).
Status ValidateCheckpointing(const ModelOptions& options, bool supports_selective,
                             const std::string& model, bool supports_selective_matmuls = false);

// Floating-point operations of one training step (forward + backward).
// model_flops counts each dense matmul as 2 flops per multiply-add in
// forward and twice that in backward (6 per parameter per token) plus the
// attention score and value products (12 L T d per token over fwd+bwd), never
// recomputation; hardware_flops adds the forward that checkpointing repeats:
// the whole block's GEMMs for full checkpointing; for selective, the ops it
// recomputes (norms, activations), which are not GEMMs and are counted at
// their elementwise cost (runtime/ops/cost.h: kLayerNormForwardFlops etc.).
// Elementwise ops, norms and softmax run once are not counted (O(d) per token).
struct StepFlops {
  double model_flops = 0.0;
  double hardware_flops = 0.0;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const std::string& name() const = 0;
  virtual const ModelOptions& options() const = 0;

  // The units in execution order, with their parameters.
  virtual const std::vector<UnitSpec>& units() const = 0;

  // InvalidArgument naming the field unless the batch fits the model
  // (sizes, sequence lengths within the maximum, token ids within the vocab).
  virtual Status ValidateBatch(const TokenBatch& batch) const = 0;

  // Forward and backward of one batch: gradients added through the hooks.
  // Returns the mean loss. Errors: the batch's, the hooks' (with the unit
  // named), the allocator's ResourceExhausted.
  virtual StatusOr<float> ForwardBackward(const TokenBatch& batch, UnitHooks& hooks,
                                          Allocator& alloc) const = 0;

  // Forward only (evaluation): PreForward/PostForward per unit, returns the loss.
  virtual StatusOr<float> Forward(const TokenBatch& batch, UnitHooks& hooks,
                                  Allocator& alloc) const = 0;

  // FLOPs of one ForwardBackward over a batch of this shape.
  virtual StepFlops Flops(int64_t batch_size, int64_t seq_len, int64_t source_len) const = 0;

  // Peak bytes that one ForwardBackward over a batch of this shape on a
  // device of kind `device` requests from its Allocator (saved activations,
  // temporaries and, for bf16 compute, the f32 widening of the running
  // unit's parameters), given f32 gradient buffers from the hooks.
  // Parameters and gradients the hooks own are not included. An analytic
  // count of what the code allocates, for FSDP's memory estimator; tests
  // hold it within 10% of the measured peak. The device decides which
  // attention runs (ops::PrefersFlashAttention: a log-sum-exp per row kept
  // instead of the probabilities), so the count asks the same predicate.
  virtual int64_t PeakActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                                      DeviceKind device) const = 0;
  // The most bytes of the same kind the model holds from the backward of
  // its first unit after the input (a decoder's first block) to the end of
  // backward: when the hooks have reduced nearly every unit's gradient.
  // What FSDP's memory estimator adds to every gradient shard for the peak
  // at the end of backward. Default: PeakActivationBytes (an upper bound).
  virtual int64_t BackwardEndActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                                             DeviceKind device) const {
    return PeakActivationBytes(batch_size, seq_len, source_len, device);
  }
  // The most bytes of the same kind the model holds while none of its
  // units' backwards is computing, before its first unit after the input:
  // from the backward's start through the hooks' PreBackward and
  // PostBackward of the head and the later blocks, when the finished
  // unit's saved activations and temporaries are gone and the next unit's
  // are not yet made. FSDP's memory estimator counts it beside the
  // buffers of those moments (a unit's gradient reduction, the next
  // unit's gather) instead of the activations' peak, which only a unit's
  // backward computation reaches. Default: PeakActivationBytes (an upper
  // bound).
  virtual int64_t BetweenBackwardsActivationBytes(int64_t batch_size, int64_t seq_len,
                                                  int64_t source_len, DeviceKind device) const {
    return PeakActivationBytes(batch_size, seq_len, source_len, device);
  }
  // What one attention call over packed documents (TokenBatch::segment_ids)
  // allocates on `device` beyond the counts above, freed when it returns:
  // on CUDA, where the model runs the linear-memory attention, that op's
  // composed fallback (cuDNN's SDPA has no block-diagonal mask) holds every
  // pair's probabilities (ops::ComposedAttentionTemporaryBytes, its peak);
  // 0 elsewhere (the CPU and the simulator run packed rows in the ops
  // counted, the composed op keeps its probabilities anyway) and for models
  // that refuse packed batches (the default).
  virtual int64_t PackedAttentionTemporaryBytes(int64_t /*batch_size*/, int64_t /*seq_len*/,
                                                DeviceKind /*device*/) const {
    return 0;
  }

  int64_t num_parameters() const { return CountParameters(units()); }
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_MODEL_H_
