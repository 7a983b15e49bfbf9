// Random bytes into every entry point that parses caller input: names
// (strategy, prefetch, dtype, model), network-model specs, option structs
// (any struct_size, any field values; also through the memory estimator),
// model specs (names, shapes, initialisers), checkpoint directories (a
// fuzzed index.json and shard file loaded into a trainer) and state dict
// files in every layout, and plans (sk_plan) of fuzzed unit-table models
// and simulator profiles. Every call must
// return a status; a crash, hang, leak or sanitizer report is a bug.
//
// LLVMFuzzerTestOneInput is libFuzzer's entry: build it with clang's
// -fsanitize=fuzzer (see capi/fuzz/README.md), or run it under the
// standalone driver fuzz_replay.cc (corpus + random inputs) in the tests.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "shardkit/shardkit.h"

namespace {

// Every outcome is acceptable here except a crash: statuses are ignored on
// purpose (gcc does not let (void) silence warn_unused_result).
void Ignore(sk_status_t) {}

// Consumes the input front to back; past the end it yields zeros.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  template <typename T>
  T Value() {
    T v{};
    const size_t n = std::min(sizeof(T), size_ - pos_);
    std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  // The next `n` bytes (fewer at the end), NULs included.
  std::string Raw(size_t n) {
    n = std::min(n, size_ - pos_);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  std::string Rest() { return Raw(size_ - pos_); }
  // A NUL-terminated string of up to `max` bytes.
  std::string String(size_t max) {
    const size_t want = U8() % (max + 1);  // before size_ - pos_: U8 advances pos_
    const size_t n = std::min(want, size_ - pos_);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return std::string(s.c_str());  // stop at an embedded NUL
  }
  // Raw bytes for a struct; the rest of the buffer stays zero.
  void Fill(void* out, size_t n) {
    const size_t k = std::min(n, size_ - pos_);
    std::memcpy(out, data_ + pos_, k);
    pos_ += k;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The memory cap keeps a fuzzed size from allocating the machine away.
constexpr uint64_t kCapBytes = 64 << 20;

// A struct of type T from fuzz bytes, with a fuzzed struct_size that stays
// within the buffer actually provided (a caller's struct_size is trusted to
// describe its memory).
template <typename T>
struct FuzzStruct {
  alignas(16) unsigned char buffer[sizeof(T) + 64] = {};
  T* Make(Bytes& in) {
    in.Fill(buffer, sizeof(buffer));
    T* t = reinterpret_cast<T*>(buffer);
    t->struct_size = in.U8() % 4 == 0 ? in.Value<uint8_t>() % sizeof(buffer) : sizeof(T);
    return t;
  }
};

void FuzzNames(Bytes& in) {
  const std::string s = in.String(40);
  sk_sharding_strategy_t st;
  sk_backward_prefetch_t bp;
  sk_dtype_t dt;
  int64_t n;
  Ignore(sk_parse_sharding_strategy(s.c_str(), &st));
  Ignore(sk_parse_backward_prefetch(s.c_str(), &bp));
  Ignore(sk_parse_dtype(s.c_str(), &dt));
  Ignore(sk_model_num_parameters(s.c_str(), &n));
}

void FuzzNetworkModel(Bytes& in) {
  const int world = 1 + in.U8() % 3;
  const std::string spec = in.String(60);
  sk_process_group* groups[3] = {};
  if (sk_process_group_create_local(world, spec.c_str(), groups) == SK_STATUS_OK) {
    for (int r = 0; r < world; ++r) sk_process_group_destroy(groups[r]);
  }
}

// Fuzzed device options (or NULL), with pointers and sizes from us: a
// profile name from a short list or fuzzed, a simulated world of at most
// 1023 ranks.
sk_device_options* FuzzDevice(Bytes& in, FuzzStruct<sk_device_options>& d, std::string& profile) {
  sk_device_options* device = d.Make(in);
  const uint8_t pick = in.U8() % 4;
  profile = pick == 0 ? "a100-80g" : pick == 1 ? "h100-80g" : in.String(12);
  device->sim_profile = in.U8() % 2 ? profile.c_str() : nullptr;
  device->sim_world_size = device->sim_world_size % 1024;
  device->sim_gpus_per_node = device->sim_gpus_per_node % 16;
  return in.U8() % 2 ? device : nullptr;
}

void FuzzTrainerOptions(Bytes& in) {
  FuzzStruct<sk_device_options> d;
  std::string profile;
  FuzzStruct<sk_fsdp_options> f;
  FuzzStruct<sk_optimizer_options> o;
  FuzzStruct<sk_trainer_options> t;
  sk_fsdp_options* fsdp = f.Make(in);
  sk_optimizer_options* opt = o.Make(in);
  sk_trainer_options* options = t.Make(in);
  // Pointers and sizes come from us: a model name (fuzzed), tiny sizes.
  const std::string model = in.U8() % 2 ? "gpt-tiny" : in.String(12);
  options->model = model.c_str();
  options->fsdp = in.U8() % 2 ? fsdp : nullptr;
  options->optimizer = in.U8() % 2 ? opt : nullptr;
  options->data_path = nullptr;
  options->memory_cap_bytes = kCapBytes;
  options->batch_size = options->batch_size % 3;
  options->grad_accum_steps = options->grad_accum_steps % 3;
  options->seq_len = options->seq_len % 9;
  options->source_len = options->source_len % 9;
  options->data_tokens = options->data_tokens % 256;
  options->ddp_bucket_bytes = options->ddp_bucket_bytes % (1 << 20);
  options->device = FuzzDevice(in, d, profile);
  fsdp->timeout_ms = 2000;  // a world of one never waits, but bound it anyway
  sk_memory_estimate estimate = SK_MEMORY_ESTIMATE_INIT;
  Ignore(sk_estimate_memory(options, static_cast<int8_t>(in.U8()), &estimate));
  sk_process_group* g = nullptr;
  if (sk_process_group_create_local(1, nullptr, &g) != SK_STATUS_OK) return;
  sk_trainer* trainer = nullptr;
  // The simulator simulates its own world when given no group.
  if (sk_trainer_create(options, in.U8() % 4 == 0 ? nullptr : g, &trainer) == SK_STATUS_OK) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    Ignore(sk_trainer_step(trainer, &m));
    sk_trainer_destroy(trainer);
  }
  sk_process_group_destroy(g);
}

void FuzzModelSpec(Bytes& in) {
  sk_model_spec* spec = nullptr;
  if (sk_model_spec_create(&spec) != SK_STATUS_OK) return;
  const int units = in.U8() % 3;
  for (int u = 0; u < units; ++u) {
    const std::string name = in.String(8);
    int32_t index = -1;
    if (sk_model_spec_add_unit(spec, name.c_str(), &index) != SK_STATUS_OK) continue;
    const int params = in.U8() % 3;
    for (int p = 0; p < params; ++p) {
      FuzzStruct<sk_param_spec> ps;
      sk_param_spec* param = ps.Make(in);
      const std::string pname = in.String(8);
      int64_t shape[SK_MAX_DIMS + 2];
      for (int64_t& d : shape) d = static_cast<int8_t>(in.U8()) % 9;  // small, maybe negative
      param->name = pname.c_str();
      param->shape = in.U8() % 8 ? shape : nullptr;
      param->ndim = param->ndim % (SK_MAX_DIMS + 3);
      Ignore(sk_model_spec_add_param(spec, index, param, nullptr));
    }
  }
  FuzzStruct<sk_engine_options> eo;
  sk_engine_options* options = eo.Make(in);
  FuzzStruct<sk_fsdp_options> f;
  sk_fsdp_options* fsdp = f.Make(in);
  fsdp->timeout_ms = 2000;
  options->fsdp = in.U8() % 2 ? fsdp : nullptr;
  options->optimizer = nullptr;
  options->memory_cap_bytes = kCapBytes;
  FuzzStruct<sk_device_options> d;
  std::string profile;
  options->device = FuzzDevice(in, d, profile);
  sk_process_group* g = nullptr;
  if (sk_process_group_create_local(1, nullptr, &g) == SK_STATUS_OK) {
    sk_engine* engine = nullptr;
    if (sk_engine_create(spec, g, options, &engine) == SK_STATUS_OK) {
      // Drive a fuzzed sequence of lifecycle calls: order errors are fine.
      for (int i = 0; i < 6; ++i) {
        const uint8_t op = in.U8();
        const int32_t unit = op >> 4;
        sk_tensor_view v = SK_TENSOR_VIEW_INIT;
        switch (op % 7) {
          case 0: Ignore(sk_engine_pre_forward(engine, unit)); break;
          case 1: Ignore(sk_engine_post_forward(engine, unit)); break;
          case 2: Ignore(sk_engine_pre_backward(engine, unit)); break;
          case 3: Ignore(sk_engine_post_backward(engine, unit)); break;
          case 4: Ignore(sk_engine_param(engine, unit, op & 1, &v)); break;
          case 5: Ignore(sk_engine_grad(engine, unit, op & 1, &v)); break;
          case 6: Ignore(sk_engine_finish_backward(engine)); break;
        }
      }
      sk_engine_destroy(engine);
    }
    sk_process_group_destroy(g);
  }
  sk_model_spec_destroy(spec);
}

// This process's scratch file or directory for one kind of fuzzed input,
// in the test's temporary directory (or /tmp): shardkit_fuzz_<kind>_<pid><ext>.
std::filesystem::path ScratchPath(const std::string& kind, const std::string& ext) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::filesystem::path(tmp != nullptr ? tmp : "/tmp") /
         ("shardkit_fuzz_" + kind + "_" + std::to_string(getpid()) + ext);
}

// A checkpoint directory of a fuzzed index.json (length-prefixed, 16 bits)
// and a fuzzed rank-00000.safetensors (the rest), loaded into a gpt-tiny
// trainer. corpus/checkpoint_gpt_tiny is a real checkpoint in this layout.
void FuzzCheckpoint(Bytes& in) {
  const size_t index_size = in.Value<uint16_t>();
  const std::string index = in.Raw(index_size);
  const std::string shard = in.Rest();
  const std::filesystem::path dir = ScratchPath("ckpt", "");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return;
  std::ofstream(dir / "index.json", std::ios::binary) << index;
  std::ofstream(dir / "rank-00000.safetensors", std::ios::binary) << shard;
  sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
  options.model = "gpt-tiny";
  options.data_tokens = 64;
  options.memory_cap_bytes = kCapBytes;
  sk_process_group* g = nullptr;
  if (sk_process_group_create_local(1, nullptr, &g) == SK_STATUS_OK) {
    sk_trainer* trainer = nullptr;
    if (sk_trainer_create(&options, g, &trainer) == SK_STATUS_OK) {
      int64_t step = 0;
      Ignore(sk_trainer_load_checkpoint(trainer, dir.c_str(), &step));
      sk_trainer_destroy(trainer);
    }
    sk_process_group_destroy(g);
  }
  std::filesystem::remove_all(dir, ec);
}

// A fuzzed state dict file (everything after the layout byte) loaded into a
// gpt-tiny trainer in a fuzzed layout (0..3, and 4: unknown).
// corpus/state_dict_gpt_tiny is a real one in the shardkit layout.
void FuzzStateDict(Bytes& in) {
  const auto layout = static_cast<sk_weight_layout_t>(in.U8() % 5);
  const std::string file = in.Rest();
  const std::filesystem::path path = ScratchPath("sd", ".safetensors");
  std::ofstream(path, std::ios::binary) << file;
  sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
  options.model = "gpt-tiny";
  options.data_tokens = 64;
  options.memory_cap_bytes = kCapBytes;
  sk_process_group* g = nullptr;
  if (sk_process_group_create_local(1, nullptr, &g) == SK_STATUS_OK) {
    sk_trainer* trainer = nullptr;
    if (sk_trainer_create(&options, g, &trainer) == SK_STATUS_OK) {
      int64_t step = 0;
      Ignore(sk_trainer_load_state_dict(trainer, path.c_str(), layout, &step));
      sk_trainer_destroy(trainer);
    }
    sk_process_group_destroy(g);
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

// A fuzzed JSON file (16-bit length prefix) planned with sk_plan: as a
// unit-table model (its path as the model) on a named profile, or as a
// simulator profile for gpt-tiny; also counted by sk_model_num_parameters.
// The rest of the request is fuzzed too, within bounds that keep one call
// short: at most 16 simulated GPUs and one strategy and one dtype pair at a
// time (a fuzzed list is taken as it is). A table with bit 2 of the first
// byte set also trains a step. corpus/plan_unit_table is the
// small table of docs/architecture.md, corpus/plan_profile the a100-80g
// profile.
void FuzzPlan(Bytes& in) {
  const uint8_t what = in.U8();
  const size_t size = in.Value<uint16_t>();
  const std::string json = in.Raw(size);
  const std::filesystem::path path = ScratchPath("plan", ".json");
  std::ofstream(path, std::ios::binary) << json;
  const std::string file = path.string();
  static const char* const kStrategies[] = {"DDP", "FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"};
  static const char* const kDtypes[] = {"f32", "bf16", "bf16/f32"};
  const bool as_profile = (what & 1) != 0;
  sk_plan_request request = SK_PLAN_REQUEST_INIT;
  request.model = as_profile ? "gpt-tiny" : file.c_str();
  request.profile = as_profile ? file.c_str() : (what & 2) != 0 ? "cpu-local" : nullptr;
  request.gpus = 1 + in.U8() % 16;
  request.gpus_per_node = in.U8() % 9;
  request.batch_size = in.U8() % 5;
  if (in.U8() % 8 == 0) request.seq_len = in.Value<int64_t>();
  if (in.U8() % 8 == 0) request.source_len = in.Value<int64_t>();
  const std::string strategies = in.U8() % 4 == 0 ? in.String(24) : kStrategies[in.U8() % 4];
  const std::string dtypes = in.U8() % 4 == 0 ? in.String(16) : kDtypes[in.U8() % 3];
  request.strategies = strategies.c_str();
  request.dtypes = dtypes.c_str();
  request.activation_checkpointing = 1 + in.U8() % 2;
  request.cpu_offload = in.U8() % 8 == 0 ? in.Value<int32_t>() : 1;
  sk_plan_result* result = nullptr;
  if (sk_plan(&request, &result) == SK_STATUS_OK) {
    sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
    Ignore(sk_plan_result_candidate(result, 0, &c));
    Ignore(sk_plan_result_candidate(result, result->num_candidates, &c));
    sk_plan_result_free(result);
  }
  int64_t n = 0;
  Ignore(sk_model_num_parameters(file.c_str(), &n));
  // Half the tables also train one step (the conv lowering, the gathers)
  // under the memory cap, which bounds the parameters and activations.
  if (!as_profile && (what & 4) != 0) {
    sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
    options.model = file.c_str();
    options.batch_size = 1 + in.U8() % 2;
    options.memory_cap_bytes = kCapBytes;
    sk_process_group* g = nullptr;
    if (sk_process_group_create_local(1, nullptr, &g) == SK_STATUS_OK) {
      sk_trainer* trainer = nullptr;
      if (sk_trainer_create(&options, g, &trainer) == SK_STATUS_OK) {
        sk_step_metrics m = SK_STEP_METRICS_INIT;
        Ignore(sk_trainer_step(trainer, &m));
        sk_trainer_destroy(trainer);
      }
      sk_process_group_destroy(g);
    }
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  switch (in.U8() % 7) {
    case 0: FuzzNames(in); break;
    case 1: FuzzNetworkModel(in); break;
    case 2: FuzzTrainerOptions(in); break;
    case 3: FuzzModelSpec(in); break;
    case 4: FuzzCheckpoint(in); break;
    case 5: FuzzStateDict(in); break;
    case 6: FuzzPlan(in); break;
  }
  return 0;
}
