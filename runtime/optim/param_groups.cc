#include "runtime/optim/param_groups.h"

#include <cmath>

namespace sk {

Status ValidateParamGroups(const std::vector<ParamGroup>& groups) {
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    const std::string what = "param_groups[" + std::to_string(i) + "]";
    const int rule = static_cast<int>(g.no_decay);
    if (rule < 0 || rule > static_cast<int>(NoDecay::kNormsBiasesEmbeddings)) {
      return InvalidArgumentError(what + ".no_decay is " + std::to_string(rule) +
                                  ", not a rule (0 none, 1 biases_and_norms, 2 norms_biases_embeddings)");
    }
    if (g.norms_biases_embeddings && g.no_decay == NoDecay::kBiasesAndNorms) {
      return InvalidArgumentError(what + " sets both norms_biases_embeddings and no_decay " +
                                  NoDecayName(g.no_decay) + ": they select different parameters");
    }
    if (g.pattern.empty() && !g.norms_biases_embeddings && g.no_decay == NoDecay::kNone) {
      return InvalidArgumentError(what + " selects nothing: give a pattern, no_decay or norms_biases_embeddings");
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

const char* NoDecayName(NoDecay rule) {
  switch (rule) {
    case NoDecay::kNone: return "none";
    case NoDecay::kBiasesAndNorms: return "biases_and_norms";
    case NoDecay::kNormsBiasesEmbeddings: return "norms_biases_embeddings";
  }
  return "invalid";
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
    const NoDecay rule = g.norms_biases_embeddings ? NoDecay::kNormsBiasesEmbeddings : g.no_decay;
    if (rule == NoDecay::kBiasesAndNorms && ndim < 2) return static_cast<int>(i);
    if (rule == NoDecay::kNormsBiasesEmbeddings &&
        (ndim < 2 || IsEmbeddingName(unit) || IsEmbeddingName(param))) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace sk
