#include "runtime/optim/param_groups.h"

#include <cmath>

namespace sk {

Status ValidateParamGroups(const std::vector<ParamGroup>& groups) {
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    const std::string what = "param_groups[" + std::to_string(i) + "]";
    if (g.pattern.empty() && !g.norms_biases_embeddings) {
      return InvalidArgumentError(what + " selects nothing: give a pattern or norms_biases_embeddings");
    }
    if (!std::isfinite(g.weight_decay)) return InvalidArgumentError(what + ".weight_decay is not finite");
    if (!std::isfinite(g.lr_multiplier) || g.lr_multiplier < 0) {
      return InvalidArgumentError(what + ".lr_multiplier must be finite and >= 0, not " +
                                  std::to_string(g.lr_multiplier));
    }
  }
  return OkStatus();
}

bool GlobMatch(const std::string& pattern, const std::string& name) {
  // Iterative glob with one backtrack point (the last '*').
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

namespace {
bool IsEmbeddingName(const std::string& s) {
  return s.find("emb") != std::string::npos || s.find("wte") != std::string::npos ||
         s.find("wpe") != std::string::npos;
}
}  // namespace

int SelectParamGroup(const std::vector<ParamGroup>& groups, const std::string& unit,
                     const std::string& param, int ndim) {
  const std::string full = unit + "." + param;
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    if (!g.pattern.empty() && GlobMatch(g.pattern, full)) return static_cast<int>(i);
    if (g.norms_biases_embeddings && (ndim < 2 || IsEmbeddingName(unit) || IsEmbeddingName(param))) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace sk
