// Parameter groups: per-parameter overrides of the optimizer's weight decay
// and learning rate, chosen by name pattern or by the usual "no decay" rule
// (torch.optim's param_groups, as the common GPT recipes build them).
//
// A parameter's full name is "<unit>.<param>". The first group that selects
// it decides its values; a parameter no group selects uses the optimizer's.
// A whole unit is selected by "<unit>.*".
#ifndef SHARDKIT_RUNTIME_OPTIM_PARAM_GROUPS_H_
#define SHARDKIT_RUNTIME_OPTIM_PARAM_GROUPS_H_

#include <string>
#include <vector>

#include "runtime/core/status.h"

namespace sk {

// The "no weight decay" rules a group can select by (values are the C
// ABI's sk_no_decay_t: never renumbered).
enum class NoDecay : int {
  kNone = 0,
  // Hugging Face Trainer's (get_decay_parameter_names): biases and norm
  // weights, i.e. parameters of fewer than two dimensions (LayerNorm and
  // RMSNorm gains and biases, every projection's bias); embeddings and a
  // head tied to them are decayed. The rule to use by default.
  kBiasesAndNorms = 1,
  // The above and embedding tables (a unit or parameter name containing
  // "emb", "wte" or "wpe"): what norms_biases_embeddings selects, shardkit's
  // only rule before 0.8.0.
  kNormsBiasesEmbeddings = 2,
};

// "none", "biases_and_norms", "norms_biases_embeddings".
const char* NoDecayName(NoDecay rule);

struct ParamGroup {
  // A glob on the full name: '*' matches any run of characters, '?' one
  // character, everything else itself. Empty: selects nothing by name.
  std::string pattern;
  // Also selects what decay should skip: parameters of fewer than two
  // dimensions (biases, LayerNorm/RMSNorm gains) and embedding tables
  // (a unit or parameter name containing "emb", "wte" or "wpe"); the same as
  // no_decay = NoDecay::kNormsBiasesEmbeddings.
  bool norms_biases_embeddings = false;
  // Also selects the parameters of this rule (kBiasesAndNorms: Hugging
  // Face Trainer's). With norms_biases_embeddings set it must be kNone or
  // kNormsBiasesEmbeddings.
  NoDecay no_decay = NoDecay::kNone;
  // The group's weight decay; negative: the optimizer's.
  float weight_decay = -1;
  // The group's learning rate is the optimizer's (or the schedule's) times
  // this; >= 0.
  float lr_multiplier = 1;
};

// InvalidArgument naming the group: a non-finite value, a multiplier < 0, a
// group that selects nothing (empty pattern, flag off, no rule), an unknown
// no_decay value, or norms_biases_embeddings with another rule.
Status ValidateParamGroups(const std::vector<ParamGroup>& groups);

// True if '*'/'?' glob `pattern` matches all of `name`.
bool GlobMatch(const std::string& pattern, const std::string& name);

// The index of the first group selecting parameter `param` of unit `unit`
// with `ndim` dimensions, or -1.
int SelectParamGroup(const std::vector<ParamGroup>& groups, const std::string& unit,
                     const std::string& param, int ndim);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPTIM_PARAM_GROUPS_H_
