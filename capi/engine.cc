// The low level: model specs and the FSDP engine around caller-computed
// units (runtime/train/engine.h does the work).
#include "capi/abi.h"

namespace {

using sk::Status;

// A view of `t` as `shape`, which must live as long as the view.
sk_tensor_view ViewOf(const sk::Tensor& t, const sk::Shape& shape) {
  sk_tensor_view v;
  std::memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  v.data = t.data();
  v.dtype = static_cast<sk_dtype_t>(t.dtype());
  v.ndim = shape.rank();
  v.shape = shape.dims().data();
  v.numel = t.numel();
  return v;
}

// A view of a tensor the engine keeps (a shard or optimizer state) in its
// own shape, which has the tensor's lifetime.
sk_tensor_view FlatViewOf(const sk::Tensor& t) { return ViewOf(t, t.shape()); }

// A view requested outside its window names the window in the ABI's terms.
sk::StatusOr<const sk::Tensor*> InAbiTerms(sk::StatusOr<const sk::Tensor*> r, const char* window) {
  if (r.ok() || r.status().code() != sk::StatusCode::kFailedPrecondition) return r;
  return sk::FailedPreconditionError(std::string(r.status().message()) + " (in this API: " +
                                     window + ")");
}

}  // namespace

using namespace sk::capi;  // NOLINT: the entry points below are this file's only code

namespace {

// The four unit hooks differ only in the FsdpEngine method they call.
sk_status_t UnitHook(sk_engine* engine, int32_t unit, sk::Status (sk::FsdpEngine::*hook)(int)) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(((*engine->engine).*hook)(unit));
  return SK_STATUS_OK;
  SK_API_END
}

// Keeps `engine` this thread's while the engine is in a custom step: the
// claim spans sk_engine_begin_custom_step .. sk_engine_end_custom_step, so
// another thread's call in between (an optimizer step, a hook, a view) is
// refused naming the custom step, while this thread's views go ahead. It
// follows the engine's own state: a begin or end that failed changed
// nothing. Called by the thread that holds `engine` exclusively.
void HoldDuringCustomStep(const sk_engine* engine) {
  if (engine->engine->in_custom_step()) {
    HandleRegistry::Get().OpenSpan(engine, "a custom step (sk_engine_begin_custom_step .. sk_engine_end_custom_step)");
  } else {
    HandleRegistry::Get().CloseSpan(engine);
  }
}

// The device of `engine`, for its caller streams.
sk::StatusOr<sk::Device*> EngineDevice(sk_engine* engine) {
  const sk::DeviceId id = engine->engine->allocator().device();
  if (sk::KindCapabilities(id.kind).virtual_time) {
    return sk::InvalidArgumentError("caller streams on " + id.ToString() +
                                    ": the simulator prices its own streams (use a cpu or cuda engine)");
  }
  return sk::Device::Get(id);
}

// The caller's cudaStream_t as a Stream of the device rank `rank` resolves
// to under `device` (the engine's, before the engine exists).
sk::StatusOr<std::shared_ptr<sk::Stream>> WrapCudaStream(const sk::DeviceOptions& device, int rank,
                                                         void* cuda_stream) {
  SK_ASSIGN_OR_RETURN(sk::Device * d, sk::ResolveRankDevice(device, rank));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<sk::Stream> s, d->WrapNativeStream(cuda_stream, "caller"));
  return std::shared_ptr<sk::Stream>(std::move(s));
}

}  // namespace

extern "C" {

// --- caller streams ----------------------------------------------------------

SK_EXPORT sk_status_t sk_stream_create(sk_engine* engine, sk_stream** out_stream) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOut(out_stream, "out_stream"));
  SK_ASSIGN_OR_FAIL(sk::Device * device, EngineDevice(engine));
  SK_ASSIGN_OR_FAIL(std::unique_ptr<sk::Stream> s, device->CreateStream("caller"));
  auto h = std::make_unique<sk_stream>();
  h->stream = std::move(s);
  *out_stream = Register(std::move(h));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_stream_wrap_cuda(sk_engine* engine, void* cuda_stream, sk_stream** out_stream) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOut(out_stream, "out_stream"));
  SK_ASSIGN_OR_FAIL(sk::Device * device, EngineDevice(engine));
  if (!device->capabilities().native_streams) {
    return Fail(SK_STATUS_INVALID_ARGUMENT,
                "sk_stream_wrap_cuda on a " + device->id().ToString() +
                    " engine: a cudaStream_t needs a cuda engine (sk_stream_create makes a cpu "
                    "engine's stream)");
  }
  if (cuda_stream == nullptr) {
    return Fail(SK_STATUS_INVALID_ARGUMENT,
                "cuda_stream is NULL (the legacy default stream, which synchronises with every "
                "other stream): pass a stream from cudaStreamCreate");
  }
  SK_ASSIGN_OR_FAIL(std::unique_ptr<sk::Stream> s, device->WrapNativeStream(cuda_stream, "caller"));
  auto h = std::make_unique<sk_stream>();
  h->stream = std::move(s);
  *out_stream = Register(std::move(h));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_stream_enqueue(sk_stream* stream, sk_stream_fn fn, void* user_data) {
  SK_API_BEGIN
  SK_SHARE_HANDLE(stream, "stream");  // thread-safe (shardkit.h), as the runtime's streams are
  if (fn == nullptr) return Fail(SK_STATUS_INVALID_ARGUMENT, "fn is NULL (expected a function to enqueue)");
  SK_CHECK(stream->stream->Enqueue([fn, user_data]() {
    fn(user_data);
    return sk::OkStatus();
  }));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_stream_synchronize(sk_stream* stream) {
  SK_API_BEGIN
  SK_SHARE_HANDLE(stream, "stream");  // thread-safe (shardkit.h), as the runtime's streams are
  SK_CHECK(stream->stream->Synchronize());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_stream_destroy(sk_stream* stream) {
  SK_API_VOID_BEGIN
  Destroy(stream);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_engine_set_stream(sk_engine* engine, sk_stream* stream) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_SHARE_OPTIONAL_HANDLE(stream, "stream");
  SK_CHECK(engine->engine->SetStream(stream != nullptr ? stream->stream : nullptr));
  return SK_STATUS_OK;
  SK_API_END
}

// --- model spec --------------------------------------------------------------

SK_EXPORT sk_status_t sk_model_spec_create(sk_model_spec** out_spec) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_spec, "out_spec"));
  *out_spec = Register(std::make_unique<sk_model_spec>());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_model_spec_destroy(sk_model_spec* spec) {
  SK_API_VOID_BEGIN
  Destroy(spec);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_model_spec_add_unit(sk_model_spec* spec, const char* name, int32_t* out_unit) {
  SK_API_BEGIN
  SK_USE_HANDLE(spec, "spec");
  SK_CHECK(CheckString(name, "name"));
  SK_ASSIGN_OR_FAIL(int unit, spec->builder.AddUnit(name));
  if (out_unit != nullptr) *out_unit = static_cast<int32_t>(unit);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_model_spec_add_param(sk_model_spec* spec, int32_t unit,
                                              const sk_param_spec* param, int32_t* out_param) {
  SK_API_BEGIN
  SK_USE_HANDLE(spec, "spec");
  SK_CHECK(spec->builder.CheckUnit(unit));
  if (param == nullptr) return Fail(SK_STATUS_INVALID_ARGUMENT, "param is NULL (use SK_PARAM_SPEC_INIT)");
  sk_param_spec c;
  SK_CHECK(ReadStruct(param, "sk_param_spec", &c));
  const std::string& unit_name = spec->builder.units()[unit].name;
  if (c.name == nullptr) {
    return Fail(SK_STATUS_INVALID_ARGUMENT, "sk_param_spec.name is NULL (unit '" + unit_name + "')");
  }
  const std::string where = "parameter '" + unit_name + "." + c.name + "': ";
  if (c.ndim < 0 || c.ndim > SK_MAX_DIMS) {
    return Fail(SK_STATUS_INVALID_ARGUMENT, where + "ndim " + std::to_string(c.ndim) +
                                                " is not in [0, " + std::to_string(SK_MAX_DIMS) + "]");
  }
  if (c.ndim > 0 && c.shape == nullptr) {
    return Fail(SK_STATUS_INVALID_ARGUMENT, where + "shape is NULL while ndim is " + std::to_string(c.ndim));
  }
  SK_CHECK(CheckEnum(c.dtype, SK_DTYPE_F16, "sk_param_spec.dtype"));
  // The struct has a dtype for growth; the runtime's parameters have none.
  if (c.dtype != SK_DTYPE_DEFAULT && c.dtype != SK_DTYPE_F32) {
    return Fail(SK_STATUS_INVALID_ARGUMENT,
                where + "dtype must be f32: master parameters are always f32 (choose the compute "
                        "precision with sk_fsdp_options.param_dtype)");
  }
  SK_CHECK(CheckEnum(c.init, SK_INIT_UNIFORM, "sk_param_spec.init"));
  std::vector<int64_t> dims(c.shape, c.shape + c.ndim);
  auto shape = sk::Shape::Make(dims);
  if (!shape.ok()) return Fail(shape.status().WithContext(where + "shape"));
  sk::ParamSpec p;
  p.name = c.name;
  p.shape = *shape;
  p.init.kind = c.init == SK_INIT_DEFAULT ? sk::InitKind::kZeros : static_cast<sk::InitKind>(c.init);
  p.init.a = c.init_a;
  p.init.b = c.init_b;
  SK_ASSIGN_OR_FAIL(int index, spec->builder.AddParam(unit, std::move(p)));
  if (out_param != nullptr) *out_param = static_cast<int32_t>(index);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_model_spec_add_tied_param(sk_model_spec* spec, int32_t unit, const char* name,
                                                   int32_t owner_unit, int32_t owner_param, int32_t* out_param) {
  SK_API_BEGIN
  SK_USE_HANDLE(spec, "spec");
  SK_CHECK(CheckString(name, "name"));
  SK_ASSIGN_OR_FAIL(int index, spec->builder.AddTiedParam(unit, name, owner_unit, owner_param));
  if (out_param != nullptr) *out_param = static_cast<int32_t>(index);
  return SK_STATUS_OK;
  SK_API_END
}

// --- engine ------------------------------------------------------------------

SK_EXPORT sk_status_t sk_engine_create(const sk_model_spec* spec, sk_process_group* group,
                                       const sk_engine_options* options, sk_engine** out_engine) {
  SK_API_BEGIN
  // Shared: every rank's thread creates its engine from the one spec at
  // once (and each then waits in collectives for the others).
  SK_SHARE_HANDLE(spec, "spec");
  SK_USE_OPTIONAL_HANDLE(group, "group");
  SK_CHECK(CheckOut(out_engine, "out_engine"));
  sk_engine_options c;
  SK_CHECK(ReadStruct(options, "sk_engine_options", &c));
  sk::FsdpEngineOptions o;
  SK_ASSIGN_OR_FAIL(o.fsdp, ToFsdpOptions(c.fsdp));
  // The engine runs no micro-batches of its own: its caller accumulates
  // with sk_engine_set_gradient_sync, so a choice here would be ignored.
  if (o.fsdp.grad_accumulation != sk::GradAccumulation::kDefault) {
    return Fail(SK_STATUS_INVALID_ARGUMENT,
                std::string("sk_fsdp_options.grad_accumulation = ") +
                    sk::GradAccumulationName(o.fsdp.grad_accumulation) +
                    " applies to trainers; an engine's caller accumulates with sk_engine_set_gradient_sync "
                    "(leave it 0, DEFAULT)");
  }
  SK_ASSIGN_OR_FAIL(o.optimizer, ToOptimizerOptions(c.optimizer));
  o.memory_cap_bytes = static_cast<size_t>(c.memory_cap_bytes);
  if (c.custom_optimizer == nullptr && (c.num_custom_states != 0 || c.custom_state_names != nullptr)) {
    return Fail(SK_STATUS_INVALID_ARGUMENT,
                "sk_engine_options.num_custom_states/custom_state_names are set but custom_optimizer is NULL "
                "(name the rule whose state they are)");
  }
  if (c.custom_optimizer != nullptr) {
    if (c.num_custom_states < 0 || c.num_custom_states > 16) {
      return Fail(SK_STATUS_INVALID_ARGUMENT, "sk_engine_options.num_custom_states is " +
                                                  std::to_string(c.num_custom_states) + ", not in [0, 16]");
    }
    if (c.num_custom_states > 0 && c.custom_state_names == nullptr) {
      return Fail(SK_STATUS_INVALID_ARGUMENT, "sk_engine_options.custom_state_names is NULL while num_custom_states is " +
                                                  std::to_string(c.num_custom_states));
    }
    o.optimizer.custom_name = c.custom_optimizer;
    for (int32_t i = 0; i < c.num_custom_states; ++i) {
      if (c.custom_state_names[i] == nullptr) {
        return Fail(SK_STATUS_INVALID_ARGUMENT,
                    "sk_engine_options.custom_state_names[" + std::to_string(i) + "] is NULL");
      }
      o.optimizer.custom_state_names.push_back(c.custom_state_names[i]);
    }
    SK_CHECK(sk::ValidateOptimizerOptions(o.optimizer).WithContext("sk_engine_options.custom_optimizer"));
  }
  SK_ASSIGN_OR_FAIL(o.device, ToDeviceOptions(c.device, group != nullptr ? group->group.get() : nullptr));
  // The simulator may simulate its own world (group NULL).
  if (group == nullptr && !sk::KindCapabilities(o.device.kind).virtual_time) {
    return Fail(NullHandleError<sk_process_group>("group"));
  }
  auto h = std::make_unique<sk_engine>();
  if (group != nullptr) h->group = group->group;
  if (c.cuda_stream != nullptr) {
    if (!sk::KindCapabilities(o.device.kind).native_streams) {
      return Fail(SK_STATUS_INVALID_ARGUMENT,
                  std::string("sk_engine_options.cuda_stream is set on a ") +
                      sk::DeviceKindName(o.device.kind) +
                      " engine: a cudaStream_t needs device kind cuda (cpu engines take a stream "
                      "from sk_stream_create through sk_engine_set_stream)");
    }
    SK_ASSIGN_OR_FAIL(o.stream, WrapCudaStream(o.device, h->group ? h->group->rank() : 0,
                                               c.cuda_stream));
  }
  SK_ASSIGN_OR_FAIL(h->engine, sk::FsdpEngine::Create(spec->builder.units(), h->group.get(), o));
  *out_engine = Register(std::move(h));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_engine_destroy(sk_engine* engine) {
  SK_API_VOID_BEGIN
  Destroy(engine);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_engine_num_units(const sk_engine* engine, int32_t* out_units) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOut(out_units, "out_units"));
  *out_units = static_cast<int32_t>(engine->engine->num_units());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_pre_forward(sk_engine* engine, int32_t unit) {
  return UnitHook(engine, unit, &sk::FsdpEngine::PreForward);
}

SK_EXPORT sk_status_t sk_engine_post_forward(sk_engine* engine, int32_t unit) {
  return UnitHook(engine, unit, &sk::FsdpEngine::PostForward);
}

SK_EXPORT sk_status_t sk_engine_pre_backward(sk_engine* engine, int32_t unit) {
  return UnitHook(engine, unit, &sk::FsdpEngine::PreBackward);
}

SK_EXPORT sk_status_t sk_engine_post_backward(sk_engine* engine, int32_t unit) {
  return UnitHook(engine, unit, &sk::FsdpEngine::PostBackward);
}

SK_EXPORT sk_status_t sk_engine_param(sk_engine* engine, int32_t unit, int32_t param,
                                      sk_tensor_view* out_view) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOutStruct(out_view, "out_view"));
  SK_ASSIGN_OR_FAIL(const sk::Tensor* t,
                    InAbiTerms(engine->engine->Param(unit, param),
                               "sk_engine_pre_forward .. sk_engine_post_forward, "
                               "sk_engine_pre_backward .. sk_engine_post_backward"));
  WriteStruct(out_view, ViewOf(*t, sk::UnitTensorShape(engine->engine->units()[unit], static_cast<size_t>(param))));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_grad(sk_engine* engine, int32_t unit, int32_t param,
                                     sk_tensor_view* out_view) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOutStruct(out_view, "out_view"));
  SK_ASSIGN_OR_FAIL(const sk::Tensor* t,
                    InAbiTerms(engine->engine->Grad(unit, param),
                               "sk_engine_pre_backward .. sk_engine_post_backward"));
  WriteStruct(out_view, ViewOf(*t, sk::UnitTensorShape(engine->engine->units()[unit], static_cast<size_t>(param))));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_set_gradient_sync(sk_engine* engine, int32_t enabled) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(engine->engine->set_gradient_sync(enabled != 0));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_finish_backward(sk_engine* engine) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(engine->engine->FinishBackward());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_clip_grad_norm(sk_engine* engine, double max_norm, double* out_norm) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_ASSIGN_OR_FAIL(double norm, engine->engine->ClipGradNorm(max_norm));
  if (out_norm != nullptr) *out_norm = norm;
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_optimizer_step(sk_engine* engine) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(engine->engine->OptimizerStep());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_zero_grad(sk_engine* engine) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(engine->engine->ZeroGrad());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_read_param(sk_engine* engine, int32_t unit, int32_t param, float* out,
                                           int64_t count) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(engine->engine->ReadParam(unit, param, out, count));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_begin_custom_step(sk_engine* engine) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  const Status s = engine->engine->BeginCustomStep();
  HoldDuringCustomStep(engine);
  SK_CHECK(s);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_shard_layout(sk_engine* engine, int32_t unit, int32_t* out_shard_index,
                                             int32_t* out_num_shards, int32_t* out_num_pieces) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_ASSIGN_OR_FAIL(const sk::FsdpEngine::ShardLayout* l, engine->engine->GetShardLayout(unit));
  if (out_shard_index != nullptr) *out_shard_index = l->shard_index;
  if (out_num_shards != nullptr) *out_num_shards = l->num_shards;
  if (out_num_pieces != nullptr) *out_num_pieces = static_cast<int32_t>(l->pieces.size());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_shard_piece(sk_engine* engine, int32_t unit, int32_t index,
                                            sk_shard_piece* out_piece) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOutStruct(out_piece, "out_piece"));
  SK_ASSIGN_OR_FAIL(const sk::FsdpEngine::ShardLayout* l, engine->engine->GetShardLayout(unit));
  if (index < 0 || static_cast<size_t>(index) >= l->pieces.size()) {
    return Fail(SK_STATUS_OUT_OF_RANGE, "piece " + std::to_string(index) + " out of range: unit " +
                                            std::to_string(unit) + "'s shard holds " +
                                            std::to_string(l->pieces.size()) + " pieces");
  }
  const sk::FsdpEngine::ShardPiece& p = l->pieces[static_cast<size_t>(index)];
  sk_shard_piece v;
  std::memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  v.name = p.name.c_str();
  v.param = p.param;
  v.ndim = p.shape.rank();
  v.shape = p.shape.dims().data();
  v.shard_offset = p.shard_offset;
  v.numel = p.numel;
  v.param_offset = p.param_offset;
  v.param_group = p.param_group;
  v.weight_decay = p.weight_decay;
  v.lr_multiplier = p.lr_multiplier;
  WriteStruct(out_piece, v);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_end_custom_step(sk_engine* engine) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  const Status s = engine->engine->EndCustomStep();
  HoldDuringCustomStep(engine);
  SK_CHECK(s);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_master_shard(sk_engine* engine, int32_t unit, sk_tensor_view* out_view) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOutStruct(out_view, "out_view"));
  SK_ASSIGN_OR_FAIL(const sk::Tensor* t, engine->engine->MasterShard(unit));
  WriteStruct(out_view, FlatViewOf(*t));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_grad_shard(sk_engine* engine, int32_t unit, sk_tensor_view* out_view) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOutStruct(out_view, "out_view"));
  SK_ASSIGN_OR_FAIL(const sk::Tensor* t, engine->engine->GradShard(unit));
  WriteStruct(out_view, FlatViewOf(*t));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_optimizer_state(sk_engine* engine, int32_t unit, int32_t index,
                                                sk_tensor_view* out_view) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOutStruct(out_view, "out_view"));
  SK_ASSIGN_OR_FAIL(const sk::Tensor* t, engine->engine->OptimizerState(unit, index));
  WriteStruct(out_view, FlatViewOf(*t));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_write_param(sk_engine* engine, int32_t unit, int32_t param, const float* values,
                                            int64_t count) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(engine->engine->WriteParam(unit, param, values, count));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_set_lr(sk_engine* engine, float lr) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(engine->engine->set_lr(lr));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_get_lr(const sk_engine* engine, float* out_lr) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOut(out_lr, "out_lr"));
  *out_lr = engine->engine->lr();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_set_loss_tokens(sk_engine* engine, int64_t tokens, int64_t* out_global_tokens) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_ASSIGN_OR_FAIL(int64_t global, engine->engine->SetLossTokens(tokens));
  if (out_global_tokens != nullptr) *out_global_tokens = global;
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_steps(const sk_engine* engine, int64_t* out_steps) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckOut(out_steps, "out_steps"));
  *out_steps = engine->engine->steps();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_save_checkpoint(sk_engine* engine, const char* dir) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckString(dir, "dir"));
  SK_CHECK(engine->engine->SaveCheckpoint(dir));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_load_checkpoint(sk_engine* engine, const char* dir, int64_t* out_step) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckString(dir, "dir"));
  SK_CHECK(engine->engine->LoadCheckpoint(dir));
  if (out_step != nullptr) *out_step = engine->engine->steps();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_save_state_dict(sk_engine* engine, const char* path,
                                                sk_weight_layout_t layout) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckString(path, "path"));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, ToWeightLayout(layout));
  SK_CHECK(engine->engine->SaveFullStateDict(path, l));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_load_state_dict(sk_engine* engine, const char* path,
                                                sk_weight_layout_t layout) {
  SK_API_BEGIN
  SK_USE_HANDLE(engine, "engine");
  SK_CHECK(CheckString(path, "path"));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, ToWeightLayout(layout));
  SK_CHECK(engine->engine->LoadFullStateDict(path, l));
  return SK_STATUS_OK;
  SK_API_END
}

}  // extern "C"
