#!/usr/bin/env bash
# examples/c/train_gpt_gloo unchanged under a scheduler's variables alone:
# two processes with only Slurm's variables (as srun sets them, no RANK or
# MASTER_ADDR), and under Open MPI's mpirun -np 2 when it is installed (the
# test says SKIP otherwise). Rank 0's losses equal the 2-rank local session's
# bit for bit each time.
#   scheduler_launch_test.sh TRAIN_GPT_GLOO TRAIN_GPT
set -euo pipefail
gloo="$1" local_run="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}"
"$local_run" >"$out/local.txt"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Slurm: srun -N1 -n2 would set these (and more); the store's port comes from
# the job id, its host from the node list.
job=$((RANDOM % 20000 + 1))
pids=()
for r in 0 1; do
  env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
    SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_STEP_TASKS_PER_NODE=2 \
    SLURM_STEP_NODELIST=localhost SLURM_JOB_NODELIST=localhost SLURM_JOB_ID=$job \
    "$gloo" >"$out/slurm$r.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$out"/slurm*.log >&2; fail "a rank failed under Slurm's variables"; }; done
grep "^step" "$out/slurm0.log" >"$out/slurm_rank0.txt"
diff -u "$out/local.txt" "$out/slurm_rank0.txt" || fail "rank 0's losses under Slurm's variables differ"
echo "PASS: Slurm's variables alone (SLURM_JOB_ID=$job): rank 0's losses equal the local session's"

if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun is not installed (Debian: apt-get install openmpi-bin)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
  mpirun --oversubscribe --tag-output -np 2 "$gloo" >"$out/mpi.log" 2>&1 || {
  cat "$out/mpi.log" >&2
  fail "mpirun -np 2 failed"
}
sed -n 's/^\[1,0\]<stdout>: *\(step .*\)/\1/p' "$out/mpi.log" >"$out/mpi_rank0.txt"
diff -u "$out/local.txt" "$out/mpi_rank0.txt" || { cat "$out/mpi.log" >&2; fail "rank 0's losses under mpirun differ"; }
echo "PASS: mpirun -np 2: rank 0's losses equal the local session's"
