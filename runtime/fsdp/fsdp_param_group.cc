// FsdpParamGroup (fsdp_param_group.h): one unit's flat parameter and
// gradient, and the transitions of its state.
#include "runtime/fsdp/fsdp_param_group.h"

#include "runtime/ops/ops.h"

namespace sk::fsdp_internal {
namespace {

// The view of parameter `param` inside `flat` (the unsharded parameter or
// gradient, laid out by `layout`), in flat's dtype.
StatusOr<Tensor> ViewOfParam(const Tensor& flat, const FlatParamLayout& layout, int param) {
  const DType dtype = flat.dtype();
  const auto& p = layout.params()[param];
  return flat.View(static_cast<size_t>(p.offset) * DTypeSize(dtype), dtype, p.shape);
}

// Every parameter's view inside `flat`, in layout order.
StatusOr<std::vector<Tensor>> ViewsOfParams(const Tensor& flat, const FlatParamLayout& layout) {
  std::vector<Tensor> views;
  views.reserve(layout.params().size());
  for (int p = 0; p < static_cast<int>(layout.params().size()); ++p) {
    SK_ASSIGN_OR_RETURN(Tensor v, ViewOfParam(flat, layout, p));
    views.push_back(std::move(v));
  }
  return views;
}

}  // namespace

StatusOr<FsdpParamGroup> FsdpParamGroup::Create(FlatParamLayout layout, Allocator& shard_allocator,
                                                const ops::OpContext& shard_context) {
  FsdpParamGroup group(std::move(layout));
  const Shape shard{group.layout_.shard_numel()};
  SK_ASSIGN_OR_RETURN(group.master_, shard_allocator.Empty(DType::kF32, shard));
  SK_RETURN_IF_ERROR(ops::Fill(shard_context, group.master_, 0.f));
  return group;
}

Status FsdpParamGroup::AllocateGrad(Allocator& allocator) {
  SK_ASSIGN_OR_RETURN(grad_, allocator.Empty(DType::kF32, Shape{layout_.shard_numel()}));
  return OkStatus();
}

Status FsdpParamGroup::ZeroGrad(Allocator& allocator, const ops::OpContext& context) {
  SK_ASSIGN_OR_RETURN(Tensor grad, allocator.Empty(DType::kF32, Shape{layout_.shard_numel()}));
  SK_RETURN_IF_ERROR(ops::Fill(context, grad, 0.f));
  grad_ = std::move(grad);
  return OkStatus();
}

void FsdpParamGroup::RecordAllGather(Tensor unsharded, std::shared_ptr<comm::Work> work) {
  unsharded_ = std::move(unsharded);
  all_gather_ = std::move(work);
  in_flight_ = true;
}

void FsdpParamGroup::Reshard() {
  in_flight_ = false;
  unsharded_ = Tensor();
  all_gather_.reset();
}

Status FsdpParamGroup::WaitForAllGather(Duration timeout) {
  if (!all_gather_) return OkStatus();
  Status s = all_gather_->wait(timeout);
  if (!s.ok()) return s;
  all_gather_.reset();
  return OkStatus();
}

std::shared_ptr<comm::Work> FsdpParamGroup::TakeAllGather() { return std::move(all_gather_); }

StatusOr<std::vector<Tensor>> FsdpParamGroup::ParamViews() const {
  return ViewsOfParams(unsharded_, layout_);
}

Status FsdpParamGroup::MakeFullGrad(DType dtype, const ops::OpContext& context) {
  SK_ASSIGN_OR_RETURN(Tensor full_grad, context.alloc->Empty(dtype, Shape{layout_.padded_numel()}));
  SK_RETURN_IF_ERROR(ops::Fill(context, full_grad, 0.f));
  full_grad_ = std::move(full_grad);
  return OkStatus();
}

StatusOr<Tensor> FsdpParamGroup::GradView(int param) const {
  return ViewOfParam(full_grad_, layout_, param);
}

StatusOr<std::vector<Tensor>> FsdpParamGroup::GradViews() const {
  return ViewsOfParams(full_grad_, layout_);
}

void FsdpParamGroup::Abandon(bool keep_unsharded) {
  state_ = UnitState::kIdle;
  in_flight_ = false;
  if (!keep_unsharded) Reshard();
  full_grad_ = Tensor();
}

}  // namespace sk::fsdp_internal
