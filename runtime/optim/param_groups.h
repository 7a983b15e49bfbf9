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

struct ParamGroup {
  // A glob on the full name: '*' matches any run of characters, '?' one
  // character, everything else itself. Empty: selects nothing by name.
  std::string pattern;
  // Also selects what decay should skip: parameters of fewer than two
  // dimensions (biases, LayerNorm/RMSNorm gains) and embedding tables
  // (a unit or parameter name containing "emb", "wte" or "wpe").
  bool norms_biases_embeddings = false;
  // The group's weight decay; negative: the optimizer's.
  float weight_decay = -1;
  // The group's learning rate is the optimizer's (or the schedule's) times
  // this; >= 0.
  float lr_multiplier = 1;
};

// InvalidArgument naming the group: a non-finite value, a multiplier < 0, a
// group that selects nothing (empty pattern, flag off).
Status ValidateParamGroups(const std::vector<ParamGroup>& groups);

// True if '*'/'?' glob `pattern` matches all of `name`.
bool GlobMatch(const std::string& pattern, const std::string& name);

// The index of the first group selecting parameter `param` of unit `unit`
// with `ndim` dimensions, or -1.
int SelectParamGroup(const std::vector<ParamGroup>& groups, const std::string& unit,
                     const std::string& param, int ndim);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPTIM_PARAM_GROUPS_H_
