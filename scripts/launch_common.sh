# shellcheck shell=bash
# What scripts/tpu_vm.sh, scripts/gpu_host.sh and scripts/slurm_job.sh share
# (sourced, not run): the error line, printing and running a command
# (--dry-run only prints it), the flags of the retrying scripts and the
# retry policy of a training command.
#
# Retry policy: exit 0 is success, exit 2 is bad input (train.py's error
# line says what to fix) and 126/127 a command that cannot start, so none is
# run again; any other exit (a signal's 130/143, a lost process's 1, a lost
# ssh connection's 255, a crash) is run again, at most --max-retries times:
# train.py resumes from its last checkpoint.

# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
DRY_RUN=0
MAX_RETRIES=3
# train.py's last line when a signal stopped it (exit 0, laplax/train/loop.py).
STOPPED_LINE="; run the same command to resume"

# One error line on stderr and exit 2 (bad flags, a user error).
die() {
  echo "error: $*" >&2
  exit 2
}

# The arguments as one line of shell words that a shell reads back as them.
shquote() {
  local out="" arg
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then
      out+=" $arg"
    elif [[ $arg != *\'* ]]; then
      out+=" '$arg'"
    elif [[ $arg != *[\"\$\`\\!]* ]]; then
      out+=" \"$arg\""
    else
      out+=" '${arg//\'/\'\\\'\'}'"
    fi
  done
  printf '%s\n' "${out# }"
}

# Prints the command (stdout with --dry-run, "+ command" on stderr otherwise)
# and runs it unless --dry-run.
run() {
  if [ "$DRY_RUN" = 1 ]; then
    shquote "$@"
    return 0
  fi
  echo "+ $(shquote "$@")" >&2
  "$@"
}

# Checks --max-retries' value.
set_max_retries() {
  [[ ${1:-} =~ ^[0-9]+$ ]] || die "--max-retries takes a whole number >= 0, not '${1:-}'"
  MAX_RETRIES=$1
}

# The flags of a script that runs one command and retries it (gpu_host.sh,
# slurm_job.sh): --help (the script's usage()), --dry-run, --max-retries N,
# then -- COMMAND..., which is left in the array "command".
parse_retry_args() {
  local script=$1
  shift
  command=()
  while [ $# -gt 0 ]; do
    case $1 in
      -h | --help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      --max-retries) set_max_retries "${2:-}"; shift ;;
      --max-retries=*) set_max_retries "${1#*=}" ;;
      --) shift; command=("$@"); break ;;
      *) die "unknown flag '$1' of scripts/$script; see --help (the command goes after --)" ;;
    esac
    shift
  done
  [ ${#command[@]} -gt 0 ] || die "no command: put it after --, e.g. -- .venv/bin/python train.py ..."
}

# Whether the command is train.py's (train.py or laplax-train).
is_train_command() {
  local arg
  for arg in "$@"; do
    case ${arg##*/} in
      train.py | laplax-train) return 0 ;;
    esac
  done
  return 1
}

# The decision after attempt $2 (1 for the first run) ended with exit code $1
# ($3=1: it printed train.py's "stopped by a signal" line, or was stopped for
# a time limit, so exit 0 is not the end): returns 0 to run it again, or 1
# with STOP_CODE set to the exit code to stop with.
STOP_CODE=0
should_retry() {
  local rc=$1 attempt=$2 stopped=${3:-0}
  STOP_CODE=$rc
  if [ "$rc" = 0 ] && [ "$stopped" = 0 ]; then
    return 1
  fi
  if [ "$rc" = 2 ]; then
    echo "error: the command exited with 2 (bad input, said above); not running it again" >&2
    return 1
  fi
  if [ "$rc" = 126 ] || [ "$rc" = 127 ]; then
    echo "error: the command could not be started (exit code $rc: not found or not executable);" \
      "not running it again" >&2
    return 1
  fi
  if [ "$attempt" -gt "$MAX_RETRIES" ]; then
    echo "error: the command ended with exit code $rc after $MAX_RETRIES retries" \
      "(--max-retries); run the same command to resume" >&2
    [ "$rc" != 0 ] || STOP_CODE=1
    return 1
  fi
  echo "retry $attempt of $MAX_RETRIES: the command ended with exit code $rc;" \
    "running it again (it resumes from its last checkpoint)" >&2
  return 0
}
