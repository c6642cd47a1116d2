#!/usr/bin/env bash
#SBATCH --job-name=laplax
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --open-mode=append
#SBATCH --output=laplax-%j.out
# A SLURM batch script that runs a training command on every node of the job
# and requeues the job after a preemption, a lost node or its time limit.
#
#   cd laplax && sbatch --nodes=N --gpus-per-node=G [--time=...] \
#       scripts/slurm_job.sh [--max-retries R] -- COMMAND...
#   bash scripts/slurm_job.sh --dry-run [--max-retries R] -- COMMAND...
#
# srun starts one process per node, which uses all the node's GPUs
# (JAX_LOCAL_DEVICE_IDS=0,...,G-1: JAX's SLURM detection alone would give
# each process only GPU number SLURM_LOCALID). COMMAND should be train.py with
# --config.distributed.enabled=True (jax.distributed.initialize() reads the
# coordinator, process count and index from SLURM's variables; a job of
# several nodes refuses train.py without it) and a
# --workdir on a file system every node shares. 300 s before the time limit
# SLURM sends USR1 to this script, which sends SIGTERM to the run (train.py
# saves a checkpoint and exits). The job is requeued (scontrol requeue, at
# most R times, default 3; SLURM_RESTART_COUNT counts them) unless COMMAND
# succeeded without being stopped or exited with 2 (bad input); the requeued
# job runs the same command, which resumes from its last checkpoint (with
# --force_unlock: the lock of a node the previous run lost is stale).
# With --ntasks-per-node=G instead (one process per GPU) JAX's choice stays.
# --dry-run prints the srun command and runs nothing. Submit from the
# repository's root (the job reads scripts/launch_common.sh there).
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
if [ -n "${SLURM_SUBMIT_DIR:-}" ] && [ -f "$SLURM_SUBMIT_DIR/scripts/launch_common.sh" ]; then
  here=$SLURM_SUBMIT_DIR/scripts  # sbatch runs a copy of this file from its spool directory
fi
# shellcheck source=scripts/launch_common.sh
source "$here/launch_common.sh"

usage() {
  sed -n '/^# A SLURM/,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

parse_retry_args slurm_job.sh "$@"

if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ] && is_train_command "${command[@]}" \
    && ! printf '%s\n' "${command[@]}" | grep -qix -- '--config.distributed.enabled=true'; then
  die "a job of $SLURM_JOB_NUM_NODES nodes runs one train.py per node: add" \
    "--config.distributed.enabled=True, or every node trains alone"
fi
restarts=${SLURM_RESTART_COUNT:-0}
if [ "$restarts" -gt 0 ] && is_train_command "${command[@]}"; then
  command+=(--force_unlock)
fi
srun_args=(srun --kill-on-bad-exit=1)
gpus=${SLURM_GPUS_ON_NODE:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)}
if [ "${SLURM_NTASKS_PER_NODE:-1}" = 1 ] && [ "$gpus" -gt 1 ]; then
  srun_args+=(env "JAX_LOCAL_DEVICE_IDS=$(seq -s, 0 $((gpus - 1)))")
fi
if [ "$DRY_RUN" = 1 ]; then
  run "${srun_args[@]}" "${command[@]}"
  exit 0
fi
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a SLURM job: submit it with sbatch (see --help), or use --dry-run"

child=""
signalled=0
on_usr1() {
  signalled=1
  echo "the job's time limit is near: stopping the run (SIGTERM), then requeueing the job" >&2
  kill -TERM "${child:-$!}" 2>/dev/null || true  # $!: a signal before child= is set
}
trap on_usr1 USR1

echo "+ $(shquote "${srun_args[@]}" "${command[@]}")" >&2
"${srun_args[@]}" "${command[@]}" &
child=$!
rc=0
wait "$child" || rc=$?
if [ "$signalled" = 1 ]; then  # the wait was interrupted: wait for the run's own end
  rc=0
  wait "$child" || rc=$?
fi
should_retry "$rc" "$((restarts + 1))" "$signalled" || exit "$STOP_CODE"
run scontrol requeue "$SLURM_JOB_ID"
