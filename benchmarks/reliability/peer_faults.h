// Peer-fault injection for //benchmarks:soak (issue 35, defect 5): gloo
// ranks as processes, one of them killed (SIGKILL) or stopped (SIGSTOP)
// while the others train or load a checkpoint; counts which ranks the
// survivors' errors blame.
//
//   soak --fault_trials=20 --fault_world=3 --fault_signal=kill --fault_phase=step
//
// Each trial starts --fault_world processes (this binary again, one per
// rank, with torchrun's variables; rank 0 serves the store as under our
// launcher), waits until each has trained a step (phase "step") or saved a
// checkpoint and started loading it in a loop (phase "load"), waits a random
// 0-200 ms, signals one rank drawn at random (rank 0 only with
// --fault_victim_zero; it serves the store), and reads each survivor's
// error. Survivors stay alive after their error (as ranks still running
// would) until the trial ends. An error blames the ranks it names other
// than as its own identity ("gloo rank 2 of 4: ...", "step 3 on rank 2"):
// "rank 5 did not arrive", "ranks 1,3 did not arrive", "(world rank 2)",
// "rank 1 failed step 2", "rank 0 is dead or hung".
//
// Prints one "fault:" summary line: survivor errors, those naming the
// signalled rank, naming a healthy rank, naming no rank, and survivors with
// no error within 4 timeouts + 10 s (hangs). Exit code 1 unless every
// survivor error names the signalled rank and no healthy one.
#ifndef SHARDKIT_BENCHMARKS_RELIABILITY_PEER_FAULTS_H_
#define SHARDKIT_BENCHMARKS_RELIABILITY_PEER_FAULTS_H_

#include <string>
#include <vector>

namespace sk::bench {

// Whether --fault_trials asks for peer-fault trials.
bool PeerFaultsRequested();
// Runs them (the parent) or one rank of a trial (a child); the exit code.
int RunPeerFaults(const char* self);

// The world ranks `error` blames (see above), sorted, distinct: every "rank
// N" / "ranks N,M" except identities (after "gloo ", "local ", "nccl ",
// "on ", "group ", or before " of "), with a group's numbers replaced by the
// "(world rank(s) ...)" that follows them.
std::vector<int> BlamedRanks(const std::string& error);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_RELIABILITY_PEER_FAULTS_H_
