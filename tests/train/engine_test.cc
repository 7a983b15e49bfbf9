// FsdpEngine's call order (issue 14, item 3): every call made in every
// reachable state of a step either is valid and succeeds, or is
// FailedPrecondition naming the call and what was expected, changes nothing,
// and leaves the engine able to finish a correct step. The whole matrix runs
// in a child process, so a crash (the old `PreBackward; ZeroGrad;
// PostBackward` segfault) fails this test and not the run.
#include "runtime/train/engine.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"

namespace sk {
namespace {

// The calls of one step, on the engine's only unit.
enum Call { kPreF, kPostF, kPreB, kPostB, kFinish, kClip, kStep, kZero, kSync, kNumCalls };
const char* const kCallNames[] = {"PreForward", "PostForward",  "PreBackward",
                                  "PostBackward", "FinishBackward", "ClipGradNorm",
                                  "OptimizerStep", "ZeroGrad",     "set_gradient_sync"};

// The reference model of the contract in engine.h: the unit's state and the
// step's phase.
enum Unit { kIdle, kFwd, kFwdDone, kBwd };
enum Phase { kNoBackward, kBackwardRan, kFinished };
struct State {
  Unit unit = kIdle;
  Phase phase = kNoBackward;
  bool operator<(const State& o) const {
    return std::make_pair(unit, phase) < std::make_pair(o.unit, o.phase);
  }
  std::string ToString() const {
    static const char* u[] = {"idle", "forward", "forward-done", "backward"};
    static const char* p[] = {"no-backward", "backward-ran", "finished"};
    return std::string("{unit ") + u[unit] + ", " + p[phase] + "}";
  }
};

// The state after `c` from `s`, or false when `c` is out of order there.
bool Next(State s, Call c, State* out) {
  const bool window_open = s.unit == kFwd || s.unit == kBwd;
  switch (c) {
    case kPreF:
      if (s.unit != kIdle && s.unit != kFwdDone) return false;
      s.unit = kFwd;
      break;
    case kPostF:
      if (s.unit != kFwd) return false;
      s.unit = kFwdDone;
      break;
    case kPreB:
      if (s.unit != kFwdDone) return false;
      s.unit = kBwd;
      break;
    case kPostB:
      if (s.unit != kBwd) return false;
      s.unit = kIdle;
      s.phase = kBackwardRan;
      break;
    case kFinish:
      if (window_open || s.phase != kBackwardRan) return false;
      s.phase = kFinished;
      break;
    case kClip:
      if (window_open || s.phase != kFinished) return false;
      break;
    case kStep:
      if (window_open || s.phase != kFinished) return false;
      s.phase = kNoBackward;
      s.unit = kIdle;  // a forward-only pass's parameters are refreshed
      break;
    case kZero:
      if (window_open || s.phase == kBackwardRan) return false;
      s.phase = kNoBackward;
      break;
    case kSync:
      if (window_open) return false;
      break;
    default:
      return false;
  }
  *out = s;
  return true;
}

Status Do(FsdpEngine& e, Call c) {
  switch (c) {
    case kPreF: return e.PreForward(0);
    case kPostF: return e.PostForward(0);
    case kPreB: {
      SK_RETURN_IF_ERROR(e.PreBackward(0));
      // The caller's gradient: every element 1.
      SK_ASSIGN_OR_RETURN(const Tensor* g, e.Grad(0, 0));
      float* d = const_cast<float*>(static_cast<const float*>(g->data()));
      for (int64_t i = 0; i < g->numel(); ++i) d[i] += 1.f;
      return OkStatus();
    }
    case kPostB: return e.PostBackward(0);
    case kFinish: return e.FinishBackward();
    case kClip: return e.ClipGradNorm(0).status();
    case kStep: return e.OptimizerStep();
    case kZero: return e.ZeroGrad();
    case kSync: return e.set_gradient_sync(true);
    default: return InternalError("no such call");
  }
}

// Every reachable state with a shortest valid call sequence reaching it.
std::map<State, std::vector<Call>> ReachableStates() {
  std::map<State, std::vector<Call>> paths{{State{}, {}}};
  std::vector<State> frontier{State{}};
  while (!frontier.empty()) {
    std::vector<State> next_frontier;
    for (const State& s : frontier) {
      for (int c = 0; c < kNumCalls; ++c) {
        State n;
        if (!Next(s, static_cast<Call>(c), &n) || paths.count(n)) continue;
        paths[n] = paths[s];
        paths[n].push_back(static_cast<Call>(c));
        next_frontier.push_back(n);
      }
    }
    frontier = std::move(next_frontier);
  }
  return paths;
}

// Valid calls from `s` to the end of a full step and through one more.
std::vector<Call> Completion(State s) {
  std::vector<Call> calls;
  auto push = [&](Call c) {
    State n;
    if (Next(s, c, &n)) {
      calls.push_back(c);
      s = n;
    }
  };
  push(kPostF);
  push(kPostB);
  push(kFinish);
  push(kStep);  // from finished
  for (Call c : {kZero, kSync, kPreF, kPostF, kPreB, kPostB, kFinish, kClip, kStep}) push(c);
  return calls;
}

// Runs the matrix; returns one line per violation of the contract.
std::vector<std::string> RunMatrix() {
  std::vector<std::string> problems;
  Status s = comm::RunLocalRanks(1, [&](int, comm::ProcessGroup* world) -> Status {
    UnitSpec unit;
    unit.name = "fc";
    ParamSpec w;
    w.name = "w";
    w.shape = Shape{3};
    w.init.kind = InitKind::kOnes;
    unit.params.push_back(w);
    FsdpEngineOptions options;
    options.optimizer.kind = OptimizerKind::kSgd;
    options.optimizer.lr = 0.5f;
    options.fsdp.timeout = Duration(30'000);
    for (const auto& [state, path] : ReachableStates()) {
      for (int ci = 0; ci < kNumCalls; ++ci) {
        const Call c = static_cast<Call>(ci);
        std::string where = state.ToString() + " then " + kCallNames[c];
        StatusOr<std::unique_ptr<FsdpEngine>> e = FsdpEngine::Create({unit}, world, options);
        if (!e.ok()) return e.status();
        bool setup_ok = true;
        for (Call p : path) {
          Status ps = Do(**e, p);
          if (!ps.ok()) {
            problems.push_back(where + ": reaching the state, " + kCallNames[p] + " failed: " + ps.ToString());
            setup_ok = false;
            break;
          }
        }
        if (!setup_ok) continue;
        State after;
        const bool valid = Next(state, c, &after);
        Status r = Do(**e, c);
        if (valid && !r.ok()) {
          problems.push_back(where + ": valid but failed: " + r.ToString());
          continue;
        }
        if (!valid) {
          after = state;
          if (r.code() != StatusCode::kFailedPrecondition) {
            problems.push_back(where + ": out of order but returned " + r.ToString());
            continue;
          }
          const std::string m(r.message());
          // Name the call made (FSDP's hooks name it too) and what was expected.
          if (m.find(kCallNames[c]) == std::string::npos || m.find("expected") == std::string::npos) {
            problems.push_back(where + ": the error does not name the call and what was expected: " + m);
          }
        }
        // Nothing changed (or the valid call moved to `after`): a correct
        // step from here succeeds and steps the parameter.
        for (Call f : Completion(after)) {
          Status fs = Do(**e, f);
          if (!fs.ok()) {
            problems.push_back(where + ": then " + kCallNames[f] + " failed: " + fs.ToString());
            break;
          }
        }
      }
    }
    return OkStatus();
  });
  if (!s.ok()) problems.push_back("RunLocalRanks: " + s.ToString());
  return problems;
}

TEST(FsdpEngineOrder, EveryCallInEveryStateIsValidOrAFailedPreconditionThatChangesNothing) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::vector<std::string> problems = RunMatrix();
    std::string out;
    for (const std::string& p : problems) out += p + "\n";
    if (::write(fds[1], out.data(), out.size()) < 0) ::_exit(3);
    ::_exit(problems.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string report;
  char buf[4096];
  ssize_t k;
  while ((k = ::read(fds[0], buf, sizeof(buf))) > 0) report.append(buf, static_cast<size_t>(k));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the matrix crashed with signal " << WTERMSIG(status)
                                 << "; reported so far:\n" << report;
  EXPECT_EQ(WEXITSTATUS(status), 0) << report;
}

// The sequence the issue found: it returned OK and then segfaulted.
TEST(FsdpEngineOrder, ZeroGradInsideABackwardWindowIsAnErrorNamingTheExpectedCall) {
  Status s = comm::RunLocalRanks(1, [&](int, comm::ProcessGroup* world) -> Status {
    UnitSpec unit{"fc", {ParamSpec{"w", Shape{3}, Initializer{}}}};
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create({unit}, world, FsdpEngineOptions{}));
    SK_RETURN_IF_ERROR(e->PreForward(0));
    SK_RETURN_IF_ERROR(e->PostForward(0));
    SK_RETURN_IF_ERROR(e->PreBackward(0));
    Status z = e->ZeroGrad();
    EXPECT_EQ(z.code(), StatusCode::kFailedPrecondition) << z;
    EXPECT_NE(std::string(z.message()).find("expected PostBackward(0)"), std::string::npos) << z;
    Status step = e->OptimizerStep();
    EXPECT_EQ(step.code(), StatusCode::kFailedPrecondition) << step;
    SK_RETURN_IF_ERROR(e->PostBackward(0));
    Status zero_in_flight = e->ZeroGrad();
    EXPECT_NE(std::string(zero_in_flight.message()).find("expected FinishBackward"), std::string::npos)
        << zero_in_flight;
    SK_RETURN_IF_ERROR(e->FinishBackward());
    SK_RETURN_IF_ERROR(e->OptimizerStep());
    Status again = e->OptimizerStep();
    EXPECT_NE(std::string(again.message()).find("expected a backward pass"), std::string::npos) << again;
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace sk
