// The high level: trainers, the memory estimate, and the local session.
#include "capi/abi.h"

#include <cmath>

#include "runtime/comm/local_backend.h"
#include "runtime/fsdp/memory_estimator.h"
#include "runtime/nn/configs.h"

using namespace sk::capi;  // NOLINT: the entry points below are this file's only code
using sk::Status;

namespace {

// Runs fn(rank, trainer) on every rank of the session, each on its own
// thread (collectives need them all at once); the lowest failing rank's error.
template <typename Fn>
Status OnEveryRank(sk_local_session* session, Fn fn) {
  const int n = static_cast<int>(session->trainers.size());
  return sk::comm::RunRankThreads(n, [&](int r) -> Status { return fn(r, *session->trainers[r]); });
}

}  // namespace

extern "C" {

// --- trainer -----------------------------------------------------------------

SK_EXPORT sk_status_t sk_trainer_create(const sk_trainer_options* options, sk_process_group* group,
                                        sk_trainer** out_trainer) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_trainer, "out_trainer"));
  SK_USE_OPTIONAL_HANDLE(group, "group");
  SK_ASSIGN_OR_FAIL(sk::TrainerOptions o,
                    ToTrainerOptions(options, group != nullptr ? group->group.get() : nullptr));
  // The simulator may simulate its own world (group NULL).
  if (group == nullptr && o.device.kind != sk::DeviceKind::kSim) {
    return Fail(NullHandleError<sk_process_group>("group"));
  }
  auto h = std::make_unique<sk_trainer>();
  if (group != nullptr) h->group = group->group;
  SK_ASSIGN_OR_FAIL(h->trainer, sk::Trainer::Create(o, h->group.get()));
  *out_trainer = Register(std::move(h));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_trainer_destroy(sk_trainer* trainer) {
  SK_API_VOID_BEGIN
  Destroy(trainer);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_trainer_step(sk_trainer* trainer, sk_step_metrics* out_metrics) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  if (out_metrics != nullptr) SK_CHECK(CheckOutStruct(out_metrics, "out_metrics"));
  SK_ASSIGN_OR_FAIL(sk::StepMetrics m, trainer->trainer->Step());
  if (out_metrics != nullptr) WriteStruct(out_metrics, ToStepMetrics(m, trainer->trainer->rank()));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_set_lr(sk_trainer* trainer, float lr) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(trainer->trainer->set_lr(lr));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_get_lr(const sk_trainer* trainer, float* out_lr) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckOut(out_lr, "out_lr"));
  *out_lr = trainer->trainer->lr();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_evaluate(sk_trainer* trainer, int32_t batches, float* out_loss) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckOut(out_loss, "out_loss"));
  SK_ASSIGN_OR_FAIL(float loss, trainer->trainer->Evaluate(batches));
  *out_loss = loss;
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_num_parameters(const sk_trainer* trainer, int64_t* out_count) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckOut(out_count, "out_count"));
  *out_count = trainer->trainer->model().num_parameters();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_model_num_parameters(const char* model, int64_t* out_count) {
  SK_API_BEGIN
  SK_CHECK(CheckString(model, "model"));
  SK_CHECK(CheckOut(out_count, "out_count"));
  SK_ASSIGN_OR_FAIL(std::unique_ptr<sk::Model> m, sk::CreateModel(std::string(model)));
  *out_count = m->num_parameters();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_save_checkpoint(sk_trainer* trainer, const char* dir) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckString(dir, "dir"));
  SK_CHECK(trainer->trainer->SaveCheckpoint(dir));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_load_checkpoint(sk_trainer* trainer, const char* dir,
                                                 int64_t* out_step) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckString(dir, "dir"));
  SK_CHECK(trainer->trainer->LoadCheckpoint(dir));
  if (out_step != nullptr) *out_step = trainer->trainer->steps();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_save_state_dict(sk_trainer* trainer, const char* path,
                                                 sk_weight_layout_t layout) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckString(path, "path"));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, ToWeightLayout(layout));
  SK_CHECK(trainer->trainer->SaveFullStateDict(path, l));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_load_state_dict(sk_trainer* trainer, const char* path,
                                                 sk_weight_layout_t layout, int64_t* out_step) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckString(path, "path"));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, ToWeightLayout(layout));
  SK_CHECK(trainer->trainer->LoadFullStateDict(path, l));
  if (out_step != nullptr) *out_step = trainer->trainer->steps();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_estimate_memory(const sk_trainer_options* options, int32_t world_size,
                                         sk_memory_estimate* out) {
  SK_API_BEGIN
  SK_CHECK(CheckOutStruct(out, "out"));
  SK_ASSIGN_OR_FAIL(sk::TrainerOptions o, ToTrainerOptions(options));
  SK_CHECK(sk::ValidateTrainerOptions(o));
  sk::MemoryEstimateRequest r;
  r.ddp = o.parallelism == sk::Parallelism::kDdp;
  SK_ASSIGN_OR_FAIL(r.model, sk::FindModelConfig(o.model));
  r.fsdp = o.fsdp;
  // The node size the trainers of this process would shard a hybrid within.
  if (r.fsdp.ranks_per_node == 0) r.fsdp.ranks_per_node = sk::LocalWorldSizeFromEnvironment();
  r.optimizer = o.optimizer;
  r.world_size = world_size;
  r.batch_size = o.batch_size;
  r.seq_len = o.seq_len;
  r.source_len = o.source_len;
  r.activation_checkpointing = o.activation_checkpointing;
  r.checkpointing = o.checkpointing;
  r.recompute_attention = o.recompute_attention;
  r.device = o.device.kind;
  SK_ASSIGN_OR_FAIL(sk::MemoryEstimate e, sk::EstimatePeakMemory(r));
  WriteStruct(out, ToMemoryEstimate(e));
  return SK_STATUS_OK;
  SK_API_END
}

// --- local session -----------------------------------------------------------

SK_EXPORT sk_status_t sk_local_session_create(const sk_trainer_options* options, int32_t world_size,
                                              const char* network_model,
                                              sk_local_session** out_session) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_session, "out_session"));
  SK_ASSIGN_OR_FAIL(sk::TrainerOptions o, ToTrainerOptions(options));
  auto h = std::make_unique<sk_local_session>();
  SK_ASSIGN_OR_FAIL(h->groups, CreateLocalGroups(world_size, network_model));
  // Validation is the same on every rank, so a bad option fails all ranks
  // before any of them waits in a collective.
  SK_CHECK(sk::ValidateTrainerOptions(o));
  SK_CHECK(sk::ValidateFsdpOptions(o.fsdp, world_size));
  h->trainers.resize(static_cast<size_t>(world_size));
  SK_CHECK(sk::comm::RunRankThreads(world_size, [&](int r) -> Status {
    SK_ASSIGN_OR_RETURN(h->trainers[r], sk::Trainer::Create(o, h->groups[r].get()));
    return sk::OkStatus();
  }));
  *out_session = Register(std::move(h));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_local_session_destroy(sk_local_session* session) {
  SK_API_VOID_BEGIN
  Destroy(session);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_local_session_step(sk_local_session* session, sk_step_metrics* out_rank0) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  if (out_rank0 != nullptr) SK_CHECK(CheckOutStruct(out_rank0, "out_rank0"));
  std::vector<sk::StepMetrics> metrics(session->trainers.size());
  SK_CHECK(OnEveryRank(session, [&](int r, sk::Trainer& t) -> Status {
    SK_ASSIGN_OR_RETURN(metrics[r], t.Step());
    return sk::OkStatus();
  }));
  session->last_metrics = std::move(metrics);
  if (out_rank0 != nullptr) WriteStruct(out_rank0, ToStepMetrics(session->last_metrics[0], 0));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_metrics(const sk_local_session* session, int32_t rank,
                                               sk_step_metrics* out_metrics) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckOutStruct(out_metrics, "out_metrics"));
  const int n = static_cast<int>(session->trainers.size());
  if (rank < 0 || rank >= n) {
    return Fail(SK_STATUS_OUT_OF_RANGE,
                "rank " + std::to_string(rank) + " out of range (world size " + std::to_string(n) + ")");
  }
  if (session->last_metrics.empty()) {
    return Fail(SK_STATUS_FAILED_PRECONDITION, "no step has completed yet (call sk_local_session_step)");
  }
  WriteStruct(out_metrics, ToStepMetrics(session->last_metrics[rank], rank));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_set_lr(sk_local_session* session, float lr) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  // Checked once, so that no rank changes when the rate is bad.
  if (!std::isfinite(lr) || lr < 0) {
    return Fail(SK_STATUS_INVALID_ARGUMENT, "learning rate must be finite and >= 0, not " + std::to_string(lr));
  }
  for (auto& t : session->trainers) SK_CHECK(t->set_lr(lr));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_evaluate(sk_local_session* session, int32_t batches,
                                                float* out_loss) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckOut(out_loss, "out_loss"));
  const int n = static_cast<int>(session->trainers.size());
  std::vector<float> losses(static_cast<size_t>(n));
  SK_CHECK(OnEveryRank(session, [&](int r, sk::Trainer& t) -> Status {
    SK_ASSIGN_OR_RETURN(losses[r], t.Evaluate(batches));
    return sk::OkStatus();
  }));
  double sum = 0;
  for (float l : losses) sum += l;  // rank order: the same bits every run
  *out_loss = static_cast<float>(sum / n);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_world_size(const sk_local_session* session,
                                                  int32_t* out_world_size) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckOut(out_world_size, "out_world_size"));
  *out_world_size = static_cast<int32_t>(session->trainers.size());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_save_checkpoint(sk_local_session* session, const char* dir) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckString(dir, "dir"));
  const std::string path = dir;
  SK_CHECK(OnEveryRank(session, [&](int, sk::Trainer& t) { return t.SaveCheckpoint(path); }));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_load_checkpoint(sk_local_session* session, const char* dir,
                                                       int64_t* out_step) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckString(dir, "dir"));
  const std::string path = dir;
  SK_CHECK(OnEveryRank(session, [&](int, sk::Trainer& t) { return t.LoadCheckpoint(path); }));
  if (out_step != nullptr) *out_step = session->trainers[0]->steps();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_save_state_dict(sk_local_session* session, const char* path,
                                                       sk_weight_layout_t layout) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckString(path, "path"));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, ToWeightLayout(layout));
  const std::string p = path;
  SK_CHECK(OnEveryRank(session, [&](int, sk::Trainer& t) { return t.SaveFullStateDict(p, l); }));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_load_state_dict(sk_local_session* session, const char* path,
                                                       sk_weight_layout_t layout, int64_t* out_step) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckString(path, "path"));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, ToWeightLayout(layout));
  const std::string p = path;
  SK_CHECK(OnEveryRank(session, [&](int, sk::Trainer& t) { return t.LoadFullStateDict(p, l); }));
  if (out_step != nullptr) *out_step = session->trainers[0]->steps();
  return SK_STATUS_OK;
  SK_API_END
}

}  // extern "C"
