#!/usr/bin/env bash
# Runs laplax on a Cloud TPU VM slice: every command acts on every worker.
#
#   bash scripts/tpu_vm.sh create  --name NAME --zone ZONE --type TYPE --version RUNTIME [--spot] [--queued]
#   bash scripts/tpu_vm.sh install --name NAME --zone ZONE
#   bash scripts/tpu_vm.sh stage   --name NAME --zone ZONE --data gs://SRC --to DIR
#   bash scripts/tpu_vm.sh run     --name NAME --zone ZONE [--max-retries N] [create and stage flags] -- COMMAND...
#   bash scripts/tpu_vm.sh delete  --name NAME --zone ZONE [--queued]
#
# create: a TPU VM (gcloud compute tpus tpu-vm create) or, with --queued, a
#   queued resource (gcloud compute tpus queued-resources create; waits until
#   it is ACTIVE); --spot for spot capacity.
# install: copies this checkout's HEAD (git archive) to ~/laplax on every
#   worker and runs scripts/install.sh --tpu there.
# stage: copies gs://SRC into DIR on every worker's local disk (TFDS
#   array_record files are read from a local directory).
# run: runs COMMAND in ~/laplax on every worker at once (the same command:
#   train.py with --config.distributed.enabled=True and a --workdir gs://...
#   that all workers share). COMMAND is run again, at most N times (default
#   3), after any end but success and exit 2 (bad input), and after a success
#   that train.py's "stopped by ..." line shows was a preemption; when the
#   slice is gone (preempted), it is deleted, created, installed and staged
#   again first (the create and stage flags say how). Runs after the first get
#   --force_unlock (train.py's lock of a lost worker is stale). Ctrl-C ends the
#   ssh sessions and the retries.
# delete: deletes the TPU VM (or the queued resource and its VM).
#
# Every command takes --project PROJECT (default: gcloud's), --dry-run (print
# the commands, one per line, and run nothing) and --help. See
# docs/scale-out.md, "Run on a TPU pod slice".
set -euo pipefail
# shellcheck source=scripts/launch_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

# Seconds between two looks at a queued resource that is not ACTIVE yet.
POLL_S=${LAPLAX_TPU_POLL_S:-60}
name="" zone="" type="" version="" project="" data="" to=""
spot=0 queued=0
command=()

parse() {
  local value
  while [ $# -gt 0 ]; do
    case $1 in
      -h | --help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      --spot) spot=1 ;;
      --queued) queued=1 ;;
      --) shift; command=("$@"); return ;;
      --name | --zone | --type | --version | --project | --data | --to | --max-retries)
        [ $# -ge 2 ] || die "$1 needs a value; see --help"
        value=$2
        case $1 in
          --name) name=$value ;;
          --zone) zone=$value ;;
          --type) type=$value ;;
          --version) version=$value ;;
          --project) project=$value ;;
          --data) data=$value ;;
          --to) to=$value ;;
          --max-retries) set_max_retries "$value" ;;
        esac
        shift
        ;;
      *) die "unknown flag '$1' of scripts/tpu_vm.sh; see --help (a command goes after --)" ;;
    esac
    shift
  done
}

need() {
  local flag
  for flag in "$@"; do
    case $flag in
      --name) [ -n "$name" ] ;;
      --zone) [ -n "$zone" ] ;;
      --type) [ -n "$type" ] ;;
      --version) [ -n "$version" ] ;;
    esac || die "$action needs $flag; see --help"
  done
  [[ $name =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] \
    || die "--name '$name' must be lowercase letters, digits and dashes, starting with a letter"
}

# gcloud's arguments after the resource: zone and project.
where() {
  printf '%s\n' "--zone=$zone"
  [ -z "$project" ] || printf '%s\n' "--project=$project"
}

# Sets SSH to the gcloud command that runs the shell line $1 on every worker.
SSH=()
ssh_all() {
  local -a loc
  mapfile -t loc < <(where)
  SSH=(gcloud compute tpus tpu-vm ssh "$name" "${loc[@]}" --worker=all --command "$1")
}

# Runs the shell line $1 on every worker.
on_workers() {
  ssh_all "$1"
  run "${SSH[@]}"
}

do_create() {
  local -a loc flags=()
  mapfile -t loc < <(where)
  [ "$spot" = 0 ] || flags+=(--spot)
  if [ "$queued" = 0 ]; then
    run gcloud compute tpus tpu-vm create "$name" "${loc[@]}" \
      "--accelerator-type=$type" "--version=$version" "${flags[@]}"
    return
  fi
  run gcloud compute tpus queued-resources create "$name" "${loc[@]}" "--node-id=$name" \
    "--accelerator-type=$type" "--runtime-version=$version" "${flags[@]}"
  local state
  while :; do
    state=$(run gcloud compute tpus queued-resources describe "$name" "${loc[@]}" \
      "--format=value(state.state)")
    [ "$DRY_RUN" = 0 ] || { echo "$state"; return; }
    case $state in
      ACTIVE) return ;;
      FAILED | SUSPENDED) die "queued resource $name is $state; see gcloud compute tpus queued-resources describe $name" ;;
    esac
    echo "queued resource $name is ${state:-not there yet}; looking again in ${POLL_S} s" >&2
    sleep "$POLL_S"
  done
}

do_install() {
  local archive=/tmp/$name-src.tar.gz
  local -a loc
  mapfile -t loc < <(where)
  run git archive --format=tar.gz "--output=$archive" HEAD
  run gcloud compute tpus tpu-vm scp "$archive" "$name:laplax.tar.gz" "${loc[@]}" --worker=all
  on_workers "mkdir -p laplax && tar -xzf laplax.tar.gz -C laplax && cd laplax && bash scripts/install.sh --tpu"
}

do_stage() {
  [ -n "$data" ] || die "stage needs --data gs://BUCKET/PATH and --to DIR; see --help"
  [ -n "$to" ] || die "stage needs --data gs://BUCKET/PATH and --to DIR; see --help"
  [[ $data =~ ^gs://[A-Za-z0-9_.][-A-Za-z0-9_./]*$ ]] \
    || die "--data '$data' must be a gs:// path of letters, digits and -_./"
  [[ $to =~ ^~?[-A-Za-z0-9_./]+$ ]] || die "--to '$to' must be a directory path of letters, digits and -_./ (~/ allowed)"
  on_workers "mkdir -p $to && gcloud storage cp -r $data $to"
}

do_delete() {
  local -a loc
  mapfile -t loc < <(where)
  if [ "$queued" = 1 ]; then
    run gcloud compute tpus queued-resources delete "$name" "${loc[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$name" "${loc[@]}" --quiet
  fi
}

# Whether the slice still runs: READY (a TPU VM) or ACTIVE (a queued resource).
slice_alive() {
  local -a loc
  local state
  mapfile -t loc < <(where)
  if [ "$queued" = 1 ]; then
    state=$(run gcloud compute tpus queued-resources describe "$name" "${loc[@]}" \
      "--format=value(state.state)") || state=""
  else
    state=$(run gcloud compute tpus tpu-vm describe "$name" "${loc[@]}" \
      "--format=value(state)") || state=""
  fi
  echo "slice $name: ${state:-gone}" >&2
  [ "$state" = READY ] || [ "$state" = ACTIVE ]
}

recreate() {
  if [ -z "$type" ] || [ -z "$version" ]; then
    die "the slice is gone and run has no --type and --version to create it again"
  fi
  do_delete || true
  do_create
  do_install
  [ -z "$data" ] || do_stage
}

do_run() {
  [ ${#command[@]} -gt 0 ] || die "run needs a command after --, e.g. -- .venv/bin/python train.py ..."
  local attempt=0 rc stopped log stopping=0
  local -a cmd=("${command[@]}")
  if [ "$DRY_RUN" = 1 ]; then
    on_workers "cd laplax && $(shquote "${cmd[@]}")"
    return
  fi
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  # Ctrl-C reaches gcloud too, which ends the ssh sessions; the run is not started again.
  trap 'stopping=1' INT TERM
  while :; do
    attempt=$((attempt + 1))
    rc=0
    ssh_all "cd laplax && $(shquote "${cmd[@]}")"
    echo "+ $(shquote "${SSH[@]}")" >&2
    # Both streams, also into a file: train.py's "stopped by" line tells a preemption from the end.
    "${SSH[@]}" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
    if [ "$stopping" = 1 ]; then
      echo "stopped by a signal; not running the command again" >&2
      exit "$((rc == 0 ? 130 : rc))"
    fi
    stopped=0
    grep -qF -- "$STOPPED_LINE" "$log" && stopped=1
    should_retry "$rc" "$attempt" "$stopped" || exit "$STOP_CODE"
    slice_alive || recreate
    if [ "$attempt" = 1 ] && is_train_command "${cmd[@]}"; then
      cmd+=(--force_unlock)
    fi
  done
}

[ $# -gt 0 ] || die "no command: create, install, stage, run or delete; see --help"
action=$1
shift
case $action in
  -h | --help) usage; exit 0 ;;
  create) parse "$@"; need --name --zone --type --version; do_create ;;
  install) parse "$@"; need --name --zone; do_install ;;
  stage) parse "$@"; need --name --zone; do_stage ;;
  run) parse "$@"; need --name --zone; do_run ;;
  delete) parse "$@"; need --name --zone; do_delete ;;
  *) die "unknown command '$action': create, install, stage, run or delete; see --help" ;;
esac
