// The high level: trainers, the memory estimate, and the local session.
#include "capi/abi.h"

#include <algorithm>

#include "runtime/nn/configs.h"
#include "runtime/train/memory_estimate.h"

using namespace sk::capi;  // NOLINT: the entry points below are this file's only code

namespace {

// The caller's micro-batch `b` as a TokenBatch: SK_IGNORE_INDEX targets and
// loss_mask zeros become kIgnoreTarget; `name` names it in errors. The
// model's own checks (ids within the vocabulary, positions, segment ids)
// come later, in the step. The shape is checked against the trainer's
// maxima (`max_batch`, `max_seq`) before any array is read: a seq_len
// beyond the maximum would otherwise read past arrays sized for it.
sk::StatusOr<sk::TokenBatch> ToTokenBatch(const sk_batch* in, const std::string& name, int64_t max_batch,
                                          int64_t max_seq) {
  if (in == nullptr) return sk::InvalidArgumentError(name + " is NULL");
  sk_batch b;
  SK_RETURN_IF_ERROR(ReadStruct(in, name.c_str(), &b));
  if (b.batch_size < 1 || b.seq_len < 1 || b.batch_size > (int64_t{1} << 31) / b.seq_len) {
    return sk::InvalidArgumentError(name + ": batch_size " + std::to_string(b.batch_size) + " x seq_len " +
                                    std::to_string(b.seq_len) +
                                    " must both be positive, with fewer than 2^31 tokens");
  }
  if (b.batch_size > max_batch) {
    return sk::InvalidArgumentError(name + ": batch_size " + std::to_string(b.batch_size) + " is outside [1, " +
                                    std::to_string(max_batch) + "] (the trainer's batch_size)");
  }
  if (b.seq_len > max_seq) {
    return sk::InvalidArgumentError(name + ": seq_len " + std::to_string(b.seq_len) + " is outside [1, " +
                                    std::to_string(max_seq) + "] (the trainer's seq_len)");
  }
  if (b.input_ids == nullptr) return sk::InvalidArgumentError(name + ".input_ids is NULL");
  if (b.targets == nullptr) return sk::InvalidArgumentError(name + ".targets is NULL");
  const size_t n = static_cast<size_t>(b.batch_size * b.seq_len);
  sk::TokenBatch t;
  t.batch_size = b.batch_size;
  t.seq_len = b.seq_len;
  t.inputs.assign(b.input_ids, b.input_ids + n);
  t.targets.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t v = b.targets[i];
    if (v == SK_IGNORE_INDEX || (b.loss_mask != nullptr && b.loss_mask[i] == 0)) {
      t.targets[i] = sk::kIgnoreTarget;
    } else if (v < 0) {
      return sk::InvalidArgumentError(name + ".targets[" + std::to_string(i) + "] = " + std::to_string(v) +
                                      " is neither a token id nor SK_IGNORE_INDEX (-100)");
    } else {
      t.targets[i] = v;
    }
    if (b.loss_mask != nullptr && b.loss_mask[i] > 1) {
      return sk::InvalidArgumentError(name + ".loss_mask[" + std::to_string(i) + "] = " +
                                      std::to_string(b.loss_mask[i]) + " is neither 0 nor 1");
    }
  }
  if (b.position_ids != nullptr) t.positions.assign(b.position_ids, b.position_ids + n);
  if (b.segment_ids != nullptr) t.segment_ids.assign(b.segment_ids, b.segment_ids + n);
  return t;
}

// `count` micro-batches from `batches` (an array of pointers), named
// "<prefix>[i]".
sk::StatusOr<std::vector<sk::TokenBatch>> ToTokenBatches(const sk_batch* const* batches, int32_t count,
                                                         const sk::TrainerOptions& limits, const char* what,
                                                         int64_t first = 0) {
  if (batches == nullptr) return sk::InvalidArgumentError(std::string(what) + " is NULL");
  std::vector<sk::TokenBatch> out;
  for (int32_t i = 0; i < count; ++i) {
    SK_ASSIGN_OR_RETURN(sk::TokenBatch t,
                        ToTokenBatch(batches[i], std::string(what) + "[" + std::to_string(first + i) + "]",
                                     limits.batch_size, limits.seq_len));
    out.push_back(std::move(t));
  }
  return out;
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
  if (group == nullptr && !sk::KindCapabilities(o.device.kind).virtual_time) {
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

SK_EXPORT sk_status_t sk_trainer_step_batches(sk_trainer* trainer, const sk_batch* const* micro_batches,
                                              int32_t num_micro_batches, sk_step_metrics* out_metrics) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  if (out_metrics != nullptr) SK_CHECK(CheckOutStruct(out_metrics, "out_metrics"));
  const int64_t want = trainer->trainer->options().grad_accum_steps;
  if (num_micro_batches != want) {
    return Fail(sk::InvalidArgumentError("num_micro_batches is " + std::to_string(num_micro_batches) +
                                         "; a step takes grad_accum_steps = " + std::to_string(want)));
  }
  SK_ASSIGN_OR_FAIL(std::vector<sk::TokenBatch> batches,
                    ToTokenBatches(micro_batches, num_micro_batches, trainer->trainer->options(), "micro_batches"));
  SK_ASSIGN_OR_FAIL(sk::StepMetrics m, trainer->trainer->StepOnBatches(batches));
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

SK_EXPORT sk_status_t sk_trainer_data_position(const sk_trainer* trainer, int64_t* out_samples_consumed,
                                               int64_t* out_samples_per_epoch) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  const sk::data::Dataset* dataset = trainer->trainer->dataset();
  if (dataset == nullptr) {
    return Fail(SK_STATUS_FAILED_PRECONDITION, "sk_trainer_data_position: the trainer reads no dataset");
  }
  if (out_samples_consumed != nullptr) *out_samples_consumed = trainer->trainer->samples_consumed();
  if (out_samples_per_epoch != nullptr) *out_samples_per_epoch = dataset->num_samples();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_last_sample_ids(const sk_trainer* trainer, int64_t* out_ids, int64_t capacity,
                                                 int64_t* out_count) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckOut(out_count, "out_count"));
  const std::vector<int64_t>& ids = trainer->trainer->last_sample_ids();
  const int64_t n = static_cast<int64_t>(ids.size());
  if (out_ids != nullptr && capacity < n) {
    return Fail(SK_STATUS_OUT_OF_RANGE, "sk_trainer_last_sample_ids: capacity " + std::to_string(capacity) +
                                            " is less than the " + std::to_string(n) + " ids of the last step");
  }
  if (out_ids != nullptr) std::copy(ids.begin(), ids.end(), out_ids);
  *out_count = n;
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

SK_EXPORT sk_status_t sk_trainer_save_checkpoint_rotating(sk_trainer* trainer, const char* dir_root,
                                                          int32_t keep) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckString(dir_root, "dir_root"));
  SK_CHECK(trainer->trainer->SaveCheckpointRotating(dir_root, keep));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_resume_latest(sk_trainer* trainer, const char* dir_root, int64_t* out_step) {
  SK_API_BEGIN
  SK_USE_HANDLE(trainer, "trainer");
  SK_CHECK(CheckString(dir_root, "dir_root"));
  SK_ASSIGN_OR_FAIL(bool resumed, trainer->trainer->ResumeLatest(dir_root));
  (void)resumed;
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
  SK_ASSIGN_OR_FAIL(sk::MemoryEstimate e, sk::EstimateTrainerMemory(o, world_size));
  WriteStruct(out, ToMemoryEstimate(e));
  return SK_STATUS_OK;
  SK_API_END
}

// --- local session (runtime/train/local_session.h) -----------------------------

SK_EXPORT sk_status_t sk_local_session_create(const sk_trainer_options* options, int32_t world_size,
                                              const char* network_model,
                                              sk_local_session** out_session) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_session, "out_session"));
  SK_ASSIGN_OR_FAIL(sk::TrainerOptions o, ToTrainerOptions(options));
  SK_ASSIGN_OR_FAIL(auto groups, CreateLocalGroups(world_size, network_model));
  auto h = std::make_unique<sk_local_session>();
  SK_ASSIGN_OR_FAIL(h->session, sk::LocalSession::Create(o, std::move(groups)));
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
  SK_ASSIGN_OR_FAIL(std::vector<sk::StepMetrics> metrics, session->session->Step());
  if (out_rank0 != nullptr) WriteStruct(out_rank0, ToStepMetrics(metrics[0], 0));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_step_batches(sk_local_session* session, const sk_batch* const* batches,
                                                    int32_t num_batches, sk_step_metrics* out_rank0) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  if (out_rank0 != nullptr) SK_CHECK(CheckOutStruct(out_rank0, "out_rank0"));
  const int world = session->session->world_size();
  const int64_t per_rank = session->session->trainer(0).options().grad_accum_steps;
  if (num_batches != world * per_rank) {
    return Fail(sk::InvalidArgumentError("num_batches is " + std::to_string(num_batches) + "; a step takes " +
                                         std::to_string(world) + " ranks x grad_accum_steps " +
                                         std::to_string(per_rank) + " = " + std::to_string(world * per_rank)));
  }
  std::vector<std::vector<sk::TokenBatch>> per(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    SK_ASSIGN_OR_FAIL(per[r], ToTokenBatches(batches == nullptr ? nullptr : batches + r * per_rank,
                                             static_cast<int32_t>(per_rank), session->session->trainer(r).options(),
                                             "batches", r * per_rank));
    // The model's checks too, before any rank starts.
    for (size_t m = 0; m < per[r].size(); ++m) {
      SK_CHECK(session->session->trainer(r).model().ValidateBatch(per[r][m]).WithContext(
          "rank " + std::to_string(r) + " micro-batch " + std::to_string(m)));
    }
  }
  SK_ASSIGN_OR_FAIL(std::vector<sk::StepMetrics> metrics, session->session->StepOnBatches(per));
  if (out_rank0 != nullptr) WriteStruct(out_rank0, ToStepMetrics(metrics[0], 0));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_metrics(const sk_local_session* session, int32_t rank,
                                               sk_step_metrics* out_metrics) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckOutStruct(out_metrics, "out_metrics"));
  const int n = session->session->world_size();
  if (rank < 0 || rank >= n) {
    return Fail(SK_STATUS_OUT_OF_RANGE,
                "rank " + std::to_string(rank) + " out of range (world size " + std::to_string(n) + ")");
  }
  const std::vector<sk::StepMetrics>& last = session->session->last_metrics();
  if (last.empty()) {
    return Fail(SK_STATUS_FAILED_PRECONDITION, "no step has completed yet (call sk_local_session_step)");
  }
  WriteStruct(out_metrics, ToStepMetrics(last[rank], rank));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_set_lr(sk_local_session* session, float lr) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(session->session->SetLr(lr));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_evaluate(sk_local_session* session, int32_t batches,
                                                float* out_loss) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckOut(out_loss, "out_loss"));
  SK_ASSIGN_OR_FAIL(float loss, session->session->Evaluate(batches));
  *out_loss = loss;
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_world_size(const sk_local_session* session,
                                                  int32_t* out_world_size) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckOut(out_world_size, "out_world_size"));
  *out_world_size = static_cast<int32_t>(session->session->world_size());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_save_checkpoint(sk_local_session* session, const char* dir) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckString(dir, "dir"));
  SK_CHECK(session->session->SaveCheckpoint(dir));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_load_checkpoint(sk_local_session* session, const char* dir,
                                                       int64_t* out_step) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckString(dir, "dir"));
  SK_CHECK(session->session->LoadCheckpoint(dir));
  if (out_step != nullptr) *out_step = session->session->steps();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_save_state_dict(sk_local_session* session, const char* path,
                                                       sk_weight_layout_t layout) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckString(path, "path"));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, ToWeightLayout(layout));
  SK_CHECK(session->session->SaveFullStateDict(path, l));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_load_state_dict(sk_local_session* session, const char* path,
                                                       sk_weight_layout_t layout, int64_t* out_step) {
  SK_API_BEGIN
  SK_USE_HANDLE(session, "session");
  SK_CHECK(CheckString(path, "path"));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, ToWeightLayout(layout));
  SK_CHECK(session->session->LoadFullStateDict(path, l));
  if (out_step != nullptr) *out_step = session->session->steps();
  return SK_STATUS_OK;
  SK_API_END
}

}  // extern "C"
