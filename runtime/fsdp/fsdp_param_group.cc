// FsdpParamGroup (fsdp_param_group.h): one unit's flat parameter and
// gradient, and the transitions of its state.
#include "runtime/fsdp/fsdp_param_group.h"

#include "runtime/ops/ops.h"

namespace sk::fsdp_internal {


StatusOr<FsdpParamGroup> FsdpParamGroup::Create(FlatParamLayout layout, Allocator& shard_allocator,
                                                const ops::OpContext& shard_context) {
  FsdpParamGroup group(std::move(layout));
  const Shape shard{group.layout_.shard_numel()};
  SK_ASSIGN_OR_RETURN(group.master_, shard_allocator.Empty(DType::kF32, shard));
  SK_ASSIGN_OR_RETURN(group.grad_, shard_allocator.Empty(DType::kF32, shard));
  SK_RETURN_IF_ERROR(ops::Fill(shard_context, group.master_, 0.f));
  SK_RETURN_IF_ERROR(group.ZeroGrad(shard_context));
  return group;
}

Status FsdpParamGroup::ZeroGrad(const ops::OpContext& context) {
  SK_RETURN_IF_ERROR(ops::Fill(context, grad_, 0.f));
  grad_zero_ = true;
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
  const DType dtype = unsharded_.dtype();
  std::vector<Tensor> views;
  for (const auto& p : layout_.params()) {
    SK_ASSIGN_OR_RETURN(Tensor v, unsharded_.View(static_cast<size_t>(p.offset) * DTypeSize(dtype), dtype, p.shape));
    views.push_back(std::move(v));
  }
  return views;
}

Status FsdpParamGroup::MakeFullGrad(DType dtype, const ops::OpContext& context) {
  SK_ASSIGN_OR_RETURN(Tensor full_grad, context.alloc->Empty(dtype, Shape{layout_.padded_numel()}));
  SK_RETURN_IF_ERROR(ops::Fill(context, full_grad, 0.f));
  full_grad_ = std::move(full_grad);
  return OkStatus();
}

StatusOr<Tensor> FsdpParamGroup::GradView(int param) const {
  const DType dtype = full_grad_.dtype();
  const auto& p = layout_.params()[param];
  return full_grad_.View(static_cast<size_t>(p.offset) * DTypeSize(dtype), dtype, p.shape);
}

StatusOr<std::vector<Tensor>> FsdpParamGroup::GradViews() const {
  std::vector<Tensor> views;
  for (int p = 0; p < static_cast<int>(layout_.params().size()); ++p) {
    SK_ASSIGN_OR_RETURN(Tensor v, GradView(p));
    views.push_back(std::move(v));
  }
  return views;
}

void FsdpParamGroup::Abandon(bool keep_unsharded) {
  state_ = UnitState::kIdle;
  in_flight_ = false;
  if (!keep_unsharded) Reshard();
  full_grad_ = Tensor();
}

}  // namespace sk::fsdp_internal
