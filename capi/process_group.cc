// Process groups: local ranks as threads, gloo processes, and
// sk_run_local_ranks.
#include "capi/abi.h"

#include <optional>

#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/local_backend.h"
#include "runtime/comm/network_model.h"
#include "runtime/comm/store.h"
#ifdef SHARDKIT_WITH_CUDA
#include "runtime/comm/nccl_backend.h"
#endif

namespace sk::capi {

constexpr int32_t kMaxLocalWorld = 4096;

StatusOr<std::vector<std::shared_ptr<sk::comm::ProcessGroup>>> CreateLocalGroups(
    int32_t world_size, const char* network_model) {
  if (world_size < 1 || world_size > kMaxLocalWorld) {
    return sk::InvalidArgumentError("world_size must be in [1, " + std::to_string(kMaxLocalWorld) +
                                    "], not " + std::to_string(world_size));
  }
  std::optional<sk::comm::LinkModel> link;
  if (network_model != nullptr) {
    SK_ASSIGN_OR_RETURN(link, sk::comm::LinkModel::Parse(network_model));
  }
  SK_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<sk::comm::ProcessGroup>> ranks,
                      sk::comm::LocalProcessGroup::Create(world_size));
  std::vector<std::shared_ptr<sk::comm::ProcessGroup>> out;
  for (auto& r : ranks) {
    if (link) {
      SK_ASSIGN_OR_RETURN(std::unique_ptr<sk::comm::NetworkModelProcessGroup> w,
                          sk::comm::NetworkModelProcessGroup::Wrap(std::move(r), *link));
      out.push_back(std::move(w));
    } else {
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace sk::capi

namespace {

std::unique_ptr<sk_process_group> MakeGroupHandle(std::shared_ptr<sk::comm::ProcessGroup> g,
                                                  sk::Duration timeout = sk::kDefaultTimeout) {
  auto h = std::make_unique<sk_process_group>();
  h->label = g->label();
  h->group = std::move(g);
  h->timeout = timeout;
  return h;
}

// The group's caller collectives, made on first use.
sk::StatusOr<sk::comm::CallerCollectives*> Collectives(sk_process_group* group) {
  if (!group->collectives) {
    SK_ASSIGN_OR_RETURN(group->collectives,
                        sk::comm::CallerCollectives::Create(group->group.get(), group->timeout));
  }
  return group->collectives.get();
}

// The caller collectives' dtypes and ops are the ABI's numbers (f64, i32
// and i64 are not the runtime DType's: no model tensor holds them).
static_assert(SK_DTYPE_F32 == static_cast<int>(sk::comm::CallerDType::kF32) &&
              SK_DTYPE_F16 == static_cast<int>(sk::comm::CallerDType::kF16) &&
              SK_DTYPE_F64 == static_cast<int>(sk::comm::CallerDType::kF64) &&
              SK_DTYPE_I32 == static_cast<int>(sk::comm::CallerDType::kI32) &&
              SK_DTYPE_I64 == static_cast<int>(sk::comm::CallerDType::kI64));
static_assert(SK_REDUCE_MAX == static_cast<int>(sk::comm::CallerReduceOp::kMax) &&
              SK_REDUCE_MIN == static_cast<int>(sk::comm::CallerReduceOp::kMin));

sk::StatusOr<sk::comm::CallerDType> CollectiveDType(sk_dtype_t dtype) {
  SK_RETURN_IF_ERROR(sk::capi::CheckEnum(dtype, SK_DTYPE_I64, "dtype"));
  return dtype == SK_DTYPE_DEFAULT ? sk::comm::CallerDType::kF32 : static_cast<sk::comm::CallerDType>(dtype);
}

// Runs body(rank) on `n` new threads and waits for all. The lowest failing
}  // namespace

using namespace sk::capi;  // NOLINT: the entry points below are this file's only code
using sk::Status;

extern "C" {

// --- process groups ----------------------------------------------------------

SK_EXPORT sk_status_t sk_process_group_create_local(int32_t world_size, const char* network_model,
                                                    sk_process_group** out_groups) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_groups, "out_groups"));
  SK_ASSIGN_OR_FAIL(auto groups, CreateLocalGroups(world_size, network_model));
  std::vector<std::unique_ptr<sk_process_group>> handles;
  for (auto& g : groups) handles.push_back(MakeGroupHandle(std::move(g)));
  for (size_t r = 0; r < handles.size(); ++r) out_groups[r] = Register(std::move(handles[r]));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_create_gloo(const sk_gloo_options* options,
                                                   sk_process_group** out_group) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_group, "out_group"));
  sk_gloo_options c;
  SK_CHECK(ReadStruct(options, "sk_gloo_options", &c));
  sk::comm::GlooOptions go;
  if (c.hostname != nullptr) go.hostname = c.hostname;
  SK_ASSIGN_OR_FAIL(go.timeout, TimeoutFrom(c.timeout_ms, "sk_gloo_options.timeout_ms"));
  go.check_desync = c.check_desync != 0;
  std::optional<sk::comm::LinkModel> link;
  if (c.network_model != nullptr) {
    SK_ASSIGN_OR_FAIL(link, sk::comm::LinkModel::Parse(c.network_model));
  }
  std::unique_ptr<sk::comm::ProcessGroup> group;
  if (c.world_size == 0) {
    SK_ASSIGN_OR_FAIL(group, sk::comm::GlooProcessGroup::CreateFromEnvironment(go));
  } else {
    if (c.world_size < 0 || c.rank < 0 || c.rank >= c.world_size) {
      return Fail(SK_STATUS_INVALID_ARGUMENT,
                  "sk_gloo_options: rank " + std::to_string(c.rank) + " is not in [0, world_size " +
                      std::to_string(c.world_size) + ")");
    }
    if (c.master_addr == nullptr || c.master_port <= 0 || c.master_port > 65535) {
      return Fail(SK_STATUS_INVALID_ARGUMENT,
                  "sk_gloo_options: master_addr and master_port (1..65535) are required when "
                  "world_size is set");
    }
    SK_ASSIGN_OR_FAIL(std::unique_ptr<sk::comm::TcpStore> store,
                      sk::comm::TcpStore::Create(c.master_addr, c.master_port, c.rank == 0, go.timeout));
    SK_ASSIGN_OR_FAIL(group, sk::comm::GlooProcessGroup::Create(
                                 std::shared_ptr<sk::comm::Store>(std::move(store)), "world", c.rank,
                                 c.world_size, go));
  }
  if (link) {
    SK_ASSIGN_OR_FAIL(group, sk::comm::NetworkModelProcessGroup::Wrap(std::move(group), *link));
  }
  *out_group = Register(MakeGroupHandle(std::move(group), go.timeout));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_create_nccl(const sk_nccl_options* options,
                                                   sk_process_group** out_group) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_group, "out_group"));
  sk_nccl_options c;
  SK_CHECK(ReadStruct(options, "sk_nccl_options", &c));
  sk::Duration timeout;
  SK_ASSIGN_OR_FAIL(timeout, TimeoutFrom(c.timeout_ms, "sk_nccl_options.timeout_ms"));
  if (c.use_device != 0 && c.device < 0) {
    return Fail(SK_STATUS_INVALID_ARGUMENT,
                "sk_nccl_options.device must be >= 0 when use_device is set, not " + std::to_string(c.device));
  }
  if (c.world_size != 0) {
    if (c.world_size < 0 || c.rank < 0 || c.rank >= c.world_size) {
      return Fail(SK_STATUS_INVALID_ARGUMENT,
                  "sk_nccl_options: rank " + std::to_string(c.rank) + " is not in [0, world_size " +
                      std::to_string(c.world_size) + ")");
    }
    if (c.master_addr == nullptr || c.master_port <= 0 || c.master_port > 65535) {
      return Fail(SK_STATUS_INVALID_ARGUMENT,
                  "sk_nccl_options: master_addr and master_port (1..65535) are required when "
                  "world_size is set");
    }
  }
#ifndef SHARDKIT_WITH_CUDA
  (void)timeout;
  return Fail(SK_STATUS_UNAVAILABLE,
              "sk_process_group_create_nccl: this libshardkit was built without CUDA (build it with "
              "--config=cuda on a machine with CUDA 13 and NCCL in /usr/local/cuda); use "
              "sk_process_group_create_gloo for CPU processes");
#else
  sk::comm::NcclOptions no;
  no.timeout = timeout;
  no.check_calls = c.skip_call_check == 0;
  std::unique_ptr<sk::comm::ProcessGroup> group;
  if (c.world_size == 0) {
    SK_ASSIGN_OR_FAIL(group, sk::comm::NcclProcessGroup::CreateFromEnvironment(
                                 no, c.use_device != 0 ? c.device : -1));
  } else {
    int device = c.device;
    if (c.use_device == 0) {
      SK_ASSIGN_OR_FAIL(device, sk::comm::DefaultCudaDeviceFromEnvironment());
    }
    SK_ASSIGN_OR_FAIL(std::unique_ptr<sk::comm::TcpStore> store,
                      sk::comm::TcpStore::Create(c.master_addr, c.master_port, c.rank == 0, timeout));
    SK_ASSIGN_OR_FAIL(group, sk::comm::NcclProcessGroup::Create(
                                 std::shared_ptr<sk::comm::Store>(std::move(store)), "nccl_world", c.rank,
                                 c.world_size, device, no));
  }
  *out_group = Register(MakeGroupHandle(std::move(group), timeout));
  return SK_STATUS_OK;
#endif
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_all_reduce(sk_process_group* group, void* data, int64_t count,
                                                  sk_dtype_t dtype, sk_reduce_op_t op) {
  SK_API_BEGIN
  SK_USE_HANDLE(group, "group");
  SK_ASSIGN_OR_FAIL(sk::comm::CallerDType dt, CollectiveDType(dtype));
  SK_CHECK(CheckEnum(op, SK_REDUCE_MIN, "op"));
  const auto o = op == SK_REDUCE_DEFAULT ? sk::comm::CallerReduceOp::kSum : static_cast<sk::comm::CallerReduceOp>(op);
  SK_ASSIGN_OR_FAIL(sk::comm::CallerCollectives * c, Collectives(group));
  SK_CHECK(c->AllReduce(data, count, dt, o));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_broadcast(sk_process_group* group, void* data, int64_t count,
                                                 sk_dtype_t dtype, int32_t root) {
  SK_API_BEGIN
  SK_USE_HANDLE(group, "group");
  SK_ASSIGN_OR_FAIL(sk::comm::CallerDType dt, CollectiveDType(dtype));
  SK_ASSIGN_OR_FAIL(sk::comm::CallerCollectives * c, Collectives(group));
  SK_CHECK(c->Broadcast(data, count, dt, root));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_all_gather(sk_process_group* group, const void* input, void* output,
                                                  int64_t count, sk_dtype_t dtype) {
  SK_API_BEGIN
  SK_USE_HANDLE(group, "group");
  SK_ASSIGN_OR_FAIL(sk::comm::CallerDType dt, CollectiveDType(dtype));
  SK_ASSIGN_OR_FAIL(sk::comm::CallerCollectives * c, Collectives(group));
  SK_CHECK(c->AllGather(input, output, count, dt));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_barrier(sk_process_group* group) {
  SK_API_BEGIN
  SK_USE_HANDLE(group, "group");
  SK_ASSIGN_OR_FAIL(sk::comm::CallerCollectives * c, Collectives(group));
  SK_CHECK(c->Barrier());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_process_group_destroy(sk_process_group* group) {
  SK_API_VOID_BEGIN
  Destroy(group);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_process_group_rank(const sk_process_group* group, int32_t* out_rank) {
  SK_API_BEGIN
  SK_SHARE_HANDLE(group, "group");
  SK_CHECK(CheckOut(out_rank, "out_rank"));
  *out_rank = group->group->rank();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_size(const sk_process_group* group, int32_t* out_size) {
  SK_API_BEGIN
  SK_SHARE_HANDLE(group, "group");
  SK_CHECK(CheckOut(out_size, "out_size"));
  *out_size = group->group->size();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_label(const sk_process_group* group, const char** out_label) {
  SK_API_BEGIN
  SK_SHARE_HANDLE(group, "group");
  SK_CHECK(CheckOut(out_label, "out_label"));
  *out_label = group->label.c_str();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_run_local_ranks(int32_t world_size, const char* network_model,
                                         sk_rank_fn fn, void* user_data) {
  SK_API_BEGIN
  if (fn == nullptr) return Fail(SK_STATUS_INVALID_ARGUMENT, "fn is NULL");
  SK_ASSIGN_OR_FAIL(auto groups, CreateLocalGroups(world_size, network_model));
  std::vector<sk_process_group*> handles;
  for (auto& g : groups) handles.push_back(Register(MakeGroupHandle(std::move(g))));
  Status s = sk::comm::RunRankThreads(
      world_size,
      [&](int r) -> Status {
        sk_status_t code = fn(r, handles[r], user_data);
        if (code == SK_STATUS_OK) return sk::OkStatus();
        return Status(static_cast<sk::StatusCode>(code),
                      std::string("callback returned ") + sk_status_name(code) +
                          (t_last_error.empty() ? "" : ": " + t_last_error));
      },
      nullptr,
      // Peers waiting for a rank whose callback failed fail now, naming it.
      [&](int r, const Status& error) { sk::comm::FailPeersOnExit(*handles[r]->group, r, error); });
  for (sk_process_group* h : handles) Destroy(h);
  SK_CHECK(s);
  return SK_STATUS_OK;
  SK_API_END
}

}  // extern "C"
