#!/usr/bin/env bash
# Runs a training command on one host with several GPUs, and runs it again
# after a crash or a lost GPU until it succeeds.
#
#   bash scripts/gpu_host.sh [--max-retries N] [--dry-run] -- COMMAND...
#
# One process uses every local GPU (JAX sees them all; config.mesh_shape lays
# the run out over them, no config.distributed needed). COMMAND is run again
# after any exit but 0 (done) and 2 (bad input), at most N times (default 3);
# train.py resumes from its last checkpoint. SIGINT or SIGTERM to this script
# goes to COMMAND (which saves a checkpoint and exits) and ends the retries.
# --dry-run prints the command and runs nothing. See docs/scale-out.md,
# "Run on a GPU cluster".
set -euo pipefail
# shellcheck source=scripts/launch_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

parse_retry_args gpu_host.sh "$@"

child=""
stopping=0
on_signal() {
  stopping=1
  kill -TERM "${child:-$!}" 2>/dev/null || true  # $!: a signal before child= is set
}
trap on_signal INT TERM

attempt=0
while :; do
  attempt=$((attempt + 1))
  [ "$stopping" = 0 ] || exit 130  # a signal between two runs
  if [ "$DRY_RUN" = 1 ]; then
    run "${command[@]}"
    exit 0
  fi
  echo "+ $(shquote "${command[@]}")" >&2
  set -m  # the command in a process group of its own: a Ctrl-C reaches it once, from on_signal
  "${command[@]}" &
  child=$!
  set +m
  rc=0
  wait "$child" || rc=$?
  if [ "$stopping" = 1 ]; then  # the wait was interrupted: wait for the command's own end
    rc=0
    wait "$child" || rc=$?
    echo "stopped by a signal; not running the command again" >&2
    exit "$rc"
  fi
  should_retry "$rc" "$attempt" || exit "$STOP_CODE"
done
