#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include "runtime/ops/ops.h"

namespace sk {

namespace {
bool Finite(float x) { return std::isfinite(x); }
}  // namespace

namespace {
// A custom rule's name or state name: it becomes part of tensor names and
// of checkpoint indexes.
Status CheckCustomName(const std::string& name, const std::string& what) {
  if (name.empty() || name.size() > 64) {
    return InvalidArgumentError(what + " '" + name + "' must have 1 to 64 characters");
  }
  for (unsigned char c : name) {
    if (!std::isalnum(c) && c != '_' && c != '-') {
      return InvalidArgumentError(what + " '" + name + "' may hold only letters, digits, '_' and '-'");
    }
  }
  return OkStatus();
}
}  // namespace

Status ValidateOptimizerOptions(const OptimizerOptions& o) {
  if (!o.custom_name.empty() || !o.custom_state_names.empty()) {
    SK_RETURN_IF_ERROR(CheckCustomName(o.custom_name, "the custom optimizer's name"));
    for (const std::string& n : {std::string("SGD"), std::string("ADAM"), std::string("ADAMW")}) {
      std::string upper;
      for (unsigned char c : o.custom_name) upper += static_cast<char>(std::toupper(c));
      if (upper == n) {
        return InvalidArgumentError("the custom optimizer's name '" + o.custom_name +
                                    "' is a built-in kind's: name the rule itself (\"lion\", \"lamb\")");
      }
    }
    if (o.custom_state_names.size() > 16) {
      return InvalidArgumentError("the custom optimizer declares " + std::to_string(o.custom_state_names.size()) +
                                  " state tensors; at most 16");
    }
    for (size_t i = 0; i < o.custom_state_names.size(); ++i) {
      SK_RETURN_IF_ERROR(CheckCustomName(o.custom_state_names[i],
                                         "custom optimizer state name " + std::to_string(i)));
      for (size_t j = 0; j < i; ++j) {
        if (o.custom_state_names[j] == o.custom_state_names[i]) {
          return InvalidArgumentError("custom optimizer state name '" + o.custom_state_names[i] +
                                      "' is declared twice (" + std::to_string(j) + " and " + std::to_string(i) + ")");
        }
      }
    }
  }
  switch (o.kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      break;
    default:
      return InvalidArgumentError("unknown optimizer kind " +
                                  std::to_string(static_cast<int>(o.kind)) +
                                  " (expected sgd=1, adam=2, adamw=3)");
  }
  if (!Finite(o.lr) || o.lr < 0) return InvalidArgumentError("optimizer lr must be finite and >= 0");
  if (!Finite(o.weight_decay) || o.weight_decay < 0) {
    return InvalidArgumentError("optimizer weight_decay must be finite and >= 0");
  }
  SK_RETURN_IF_ERROR(ValidateParamGroups(o.param_groups));
  if (o.kind == OptimizerKind::kSgd) {
    if (!Finite(o.momentum) || o.momentum < 0) return InvalidArgumentError("SGD momentum must be >= 0");
    if (!Finite(o.dampening) || o.dampening < 0 || o.dampening > 1) {
      return InvalidArgumentError("SGD dampening must be in [0, 1]");
    }
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
      return InvalidArgumentError("SGD Nesterov momentum needs momentum > 0 and zero dampening");
    }
  } else {
    if (!(o.beta1 >= 0 && o.beta1 < 1)) return InvalidArgumentError("Adam beta1 must be in [0, 1)");
    if (!(o.beta2 >= 0 && o.beta2 < 1)) return InvalidArgumentError("Adam beta2 must be in [0, 1)");
    if (!Finite(o.eps) || o.eps <= 0) return InvalidArgumentError("Adam eps must be finite and > 0");
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerOptions& options,
                                                       Allocator* allocator) {
  SK_RETURN_IF_ERROR(ValidateOptimizerOptions(options));
  if (allocator == nullptr) return InvalidArgumentError("optimizer needs an allocator");
  return std::unique_ptr<Optimizer>(new Optimizer(options, allocator));
}

std::string Optimizer::Name() const {
  if (custom()) return options_.custom_name;
  switch (options_.kind) {
    case OptimizerKind::kSgd: return "SGD";
    case OptimizerKind::kAdam: return "ADAM";
    case OptimizerKind::kAdamW: return "ADAMW";
  }
  return "UNKNOWN";
}

std::vector<std::string> Optimizer::StateNames() const {
  if (custom()) return options_.custom_state_names;
  if (options_.kind == OptimizerKind::kSgd) {
    if (options_.momentum == 0.f) return {};
    return {"momentum"};
  }
  return {"exp_avg", "exp_avg_sq"};
}

StatusOr<Optimizer::Slot*> Optimizer::GetOrCreateSlot(const ops::OpContext& ctx, int slot, int64_t n) {
  auto it = slots_.find(slot);
  if (it != slots_.end()) {
    if (it->second.n != n) {
      return InvalidArgumentError("optimizer slot " + std::to_string(slot) + " has " +
                                  std::to_string(it->second.n) + " elements, step gave " +
                                  std::to_string(n));
    }
    return &it->second;
  }
  Slot s;
  s.n = n;
  for (size_t i = 0; i < StateNames().size(); ++i) {
    SK_ASSIGN_OR_RETURN(Tensor t, allocator_->Empty(DType::kF32, Shape{n}));
    SK_RETURN_IF_ERROR(ops::Fill(ctx, t, 0.f));
    s.state.push_back(std::move(t));
  }
  return &slots_.emplace(slot, std::move(s)).first->second;
}

StatusOr<std::vector<ShardRef>> ShardRefsFor(const std::vector<Tensor>& params,
                                             const std::vector<Tensor>& grads) {
  if (params.size() != grads.size()) {
    return InvalidArgumentError("optimizer: " + std::to_string(params.size()) + " parameters but " +
                                std::to_string(grads.size()) + " gradients");
  }
  std::vector<ShardRef> refs;
  for (size_t i = 0; i < params.size(); ++i) refs.push_back({static_cast<int>(i), params[i], grads[i]});
  return refs;
}

Status Optimizer::Step(const ops::OpContext& ctx, const std::vector<ShardRef>& shards) {
  // Validate everything and create all state before touching any parameter, so
  // an error leaves parameters and state as they were.
  if (ctx.device == nullptr || ctx.alloc == nullptr) {
    return InvalidArgumentError("optimizer step: the op context needs a device and an allocator");
  }
  if (custom()) {
    return FailedPreconditionError("the optimizer '" + options_.custom_name +
                                   "' is the caller's own rule: step it with a custom step "
                                   "(BeginCustomStep .. EndCustomStep)");
  }
  const DeviceKind kind = ctx.device->id().kind;
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardRef& r = shards[i];
    const std::string what = "optimizer slot " + std::to_string(r.slot);
    if (!r.param.defined() || !r.grad.defined()) {
      return InvalidArgumentError(what + ": undefined parameter or gradient tensor");
    }
    if (r.param.dtype() != DType::kF32 || r.grad.dtype() != DType::kF32) {
      return InvalidArgumentError(what + ": parameter and gradient must be f32, got " +
                                  r.param.ToString() + " and " + r.grad.ToString());
    }
    if (r.param.device().kind != kind || r.grad.device().kind != kind) {
      return InvalidArgumentError(what + ": parameter " + r.param.ToString() + " and gradient " +
                                  r.grad.ToString() + " must be on the step's device kind (" +
                                  ctx.device->id().ToString() + ")");
    }
    if (r.param.numel() != r.grad.numel()) {
      return InvalidArgumentError(what + ": parameter " + r.param.ToString() + " and gradient " +
                                  r.grad.ToString() + " differ in size");
    }
    for (size_t j = 0; j < i; ++j) {
      if (shards[j].slot == r.slot) return InvalidArgumentError(what + " appears twice in one step");
    }
    auto it = slots_.find(r.slot);
    if (it != slots_.end() && it->second.n != r.param.numel()) {
      return InvalidArgumentError(what + " has " + std::to_string(it->second.n) +
                                  " elements, step gave " + std::to_string(r.param.numel()));
    }
  }
  std::vector<Slot*> slots;
  for (const ShardRef& r : shards) {
    SK_ASSIGN_OR_RETURN(Slot * s, GetOrCreateSlot(ctx, r.slot, r.param.numel()));
    slots.push_back(s);
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    auto seg = segments_.find(shards[i].slot);
    if (seg != segments_.end() && !seg->second.empty() &&
        seg->second.back().end > shards[i].param.numel()) {
      return InvalidArgumentError("optimizer slot " + std::to_string(shards[i].slot) +
                                  ": a parameter group segment ends at element " +
                                  std::to_string(seg->second.back().end) + " of " +
                                  std::to_string(shards[i].param.numel()));
    }
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardRef& r = shards[i];
    Slot& s = *slots[i];
    ++s.step;
    auto seg = segments_.find(r.slot);
    if (seg == segments_.end() || seg->second.empty()) {
      SK_RETURN_IF_ERROR(Update(ctx, s.step, options_.lr, options_.weight_decay, r.param, r.grad, s.state));
      continue;
    }
    // The slot in pieces: each segment with its values, the gaps between
    // them with the options'.
    auto piece = [&](int64_t begin, int64_t end, float lr, float wd) -> Status {
      if (end <= begin) return OkStatus();
      const size_t off = static_cast<size_t>(begin) * sizeof(float);
      const Shape shape{end - begin};
      SK_ASSIGN_OR_RETURN(Tensor p, r.param.View(off, DType::kF32, shape));
      SK_ASSIGN_OR_RETURN(Tensor g, r.grad.View(off, DType::kF32, shape));
      std::vector<Tensor> st;
      for (const Tensor& t : s.state) {
        SK_ASSIGN_OR_RETURN(Tensor v, t.View(off, DType::kF32, shape));
        st.push_back(std::move(v));
      }
      return Update(ctx, s.step, lr, wd, p, g, st);
    };
    int64_t at = 0;
    for (const HyperSegment& h : seg->second) {
      SK_RETURN_IF_ERROR(piece(at, h.begin, options_.lr, options_.weight_decay));
      SK_RETURN_IF_ERROR(piece(h.begin, h.end, options_.lr * h.lr_multiplier, h.weight_decay));
      at = h.end;
    }
    SK_RETURN_IF_ERROR(piece(at, r.param.numel(), options_.lr, options_.weight_decay));
  }
  return OkStatus();
}

Status Optimizer::Update(const ops::OpContext& ctx, int64_t step, float lr, float weight_decay,
                         const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state) {
  if (options_.kind == OptimizerKind::kSgd) {
    SgdHyper h{lr, options_.momentum, options_.dampening, weight_decay, options_.nesterov, step == 1};
    return ops::SgdUpdate(ctx, h, param, grad, state.empty() ? Tensor() : state[0]);
  }
  const double t = static_cast<double>(step);
  AdamHyper h{lr,
              options_.beta1,
              options_.beta2,
              options_.eps,
              weight_decay,
              options_.kind == OptimizerKind::kAdamW,
              static_cast<float>(1.0 - std::pow(static_cast<double>(options_.beta1), t)),
              static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(options_.beta2), t)))};
  return ops::AdamUpdate(ctx, h, param, grad, state[0], state[1]);
}

Status Optimizer::SetSegments(int slot, std::vector<HyperSegment> segments) {
  std::sort(segments.begin(), segments.end(),
            [](const HyperSegment& a, const HyperSegment& b) { return a.begin < b.begin; });
  int64_t prev_end = 0;
  for (const HyperSegment& h : segments) {
    const std::string what = "optimizer slot " + std::to_string(slot) + " segment [" +
                             std::to_string(h.begin) + ", " + std::to_string(h.end) + ")";
    if (h.begin < prev_end || h.end <= h.begin) {
      return InvalidArgumentError(what + " is empty, negative or overlaps another");
    }
    if (!Finite(h.weight_decay) || h.weight_decay < 0 || !Finite(h.lr_multiplier) || h.lr_multiplier < 0) {
      return InvalidArgumentError(what + ": weight_decay and lr_multiplier must be finite and >= 0");
    }
    prev_end = h.end;
  }
  segments_[slot] = std::move(segments);
  return OkStatus();
}

StatusOr<const std::vector<Tensor>*> Optimizer::SlotState(const ops::OpContext& ctx, int slot, int64_t n) {
  SK_ASSIGN_OR_RETURN(Slot * s, GetOrCreateSlot(ctx, slot, n));
  return &s->state;
}

void Optimizer::CountStep(int slot) {
  auto it = slots_.find(slot);
  if (it != slots_.end()) ++it->second.step;
}

int64_t Optimizer::step_count(int slot) const {
  auto it = slots_.find(slot);
  return it == slots_.end() ? 0 : it->second.step;
}

void Optimizer::ReleaseUnsteppedState() {
  for (auto it = slots_.begin(); it != slots_.end();) {
    it = it->second.step == 0 ? slots_.erase(it) : std::next(it);
  }
}

StatusOr<Tensor> Optimizer::State(int slot, const std::string& name) const {
  auto it = slots_.find(slot);
  if (it == slots_.end()) return NotFoundError("optimizer slot " + std::to_string(slot) + " has no state");
  std::vector<std::string> names = StateNames();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return it->second.state[i];
  }
  return NotFoundError("optimizer has no state named '" + name + "'");
}

Status Optimizer::LoadState(const ops::OpContext& ctx, int slot, int64_t n, int64_t step,
                            const std::vector<Tensor>& state) {
  std::vector<std::string> names = StateNames();
  if (state.size() != names.size()) {
    return InvalidArgumentError("optimizer state for slot " + std::to_string(slot) + " has " +
                                std::to_string(state.size()) + " tensors, expected " +
                                std::to_string(names.size()));
  }
  if (n < 0 || step < 0) return InvalidArgumentError("negative size or step in optimizer state");
  for (size_t i = 0; i < state.size(); ++i) {
    if (state[i].dtype() != DType::kF32 || state[i].numel() != n) {
      return InvalidArgumentError("optimizer state '" + names[i] + "' of slot " +
                                  std::to_string(slot) + " must be f32 with " + std::to_string(n) +
                                  " elements, got " + state[i].ToString());
    }
  }
  Slot s;
  s.n = n;
  s.step = step;
  for (size_t i = 0; i < state.size(); ++i) {
    SK_ASSIGN_OR_RETURN(Tensor t, allocator_->Empty(DType::kF32, Shape{n}));
    SK_RETURN_IF_ERROR(ops::Copy(ctx, state[i], t));
    s.state.push_back(std::move(t));
  }
  slots_[slot] = std::move(s);
  return OkStatus();
}

size_t Optimizer::StateBytes() const {
  size_t total = 0;
  for (const auto& [id, s] : slots_) {
    for (const Tensor& t : s.state) total += t.nbytes();
  }
  return total;
}

namespace {

Status CheckGrads(const std::vector<Tensor>& grads, const char* what) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined() || grads[i].dtype() != DType::kF32) {
      return InvalidArgumentError(std::string(what) + ": gradient " + std::to_string(i) +
                                  " must be a defined f32 tensor, got " + grads[i].ToString());
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<double> LocalGradNormPartial(const ops::OpContext& ctx, const std::vector<Tensor>& grads,
                                      NormType type) {
  SK_RETURN_IF_ERROR(CheckGrads(grads, "gradient norm"));
  if (ctx.alloc == nullptr) return InvalidArgumentError("gradient norm: the op context has no allocator");
  // One f64 accumulator for all tensors, so the sum runs in element order
  // across them exactly as one loop would. Zeroed by a copy from the host.
  double zero = 0.0;
  SK_ASSIGN_OR_RETURN(Tensor host_zero, Tensor::Wrap(&zero, DType::kF64, Shape{1}));
  SK_ASSIGN_OR_RETURN(Tensor acc, ctx.alloc->Empty(DType::kF64, Shape{1}));
  SK_RETURN_IF_ERROR(ops::Copy(ctx, host_zero, acc));
  for (const Tensor& t : grads) {
    SK_RETURN_IF_ERROR(type == NormType::kL2 ? ops::SumOfSquares(ctx, t, acc) : ops::MaxAbs(ctx, t, acc));
  }
  return ops::ReadScalar(ctx, acc);
}

double FinishGradNorm(double combined_partial, NormType type) {
  return type == NormType::kL2 ? std::sqrt(combined_partial) : combined_partial;
}

StatusOr<float> ClipGradientsToNorm(const ops::OpContext& ctx, const std::vector<Tensor>& grads,
                                    double total_norm, double max_norm) {
  SK_RETURN_IF_ERROR(CheckGrads(grads, "gradient clipping"));
  double coef = max_norm / (total_norm + 1e-6);
  if (coef >= 1.0) return 1.f;
  float c = static_cast<float>(coef);
  for (const Tensor& t : grads) SK_RETURN_IF_ERROR(ops::Scale(ctx, t, c));
  return c;
}

Status ScaleGradients(const ops::OpContext& ctx, const std::vector<Tensor>& grads, float factor) {
  if (!std::isfinite(factor)) return InvalidArgumentError("gradient scale factor must be finite");
  SK_RETURN_IF_ERROR(CheckGrads(grads, "gradient scaling"));
  for (const Tensor& t : grads) SK_RETURN_IF_ERROR(ops::Scale(ctx, t, factor));
  return OkStatus();
}

}  // namespace sk
