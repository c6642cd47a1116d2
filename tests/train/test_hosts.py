"""Many hosts, simulated (issue 54): 4 ``train.py`` processes of 2 fake CPU devices each.

``jax.distributed`` on loopback, one tiny GPT on the mesh (2,2,2) over the
8 devices (``data`` and ``fsdp`` across the processes, ``tensor`` inside
each), every process started through ``tests/helpers/hosts_run.py``: the
real ``train.py`` with hooks that record the rows each process feeds and
hold one process at a step until its checkpoint is committed and JAX's
preemption sync has every step counter, so that a signal's moment is
deterministic on a busy machine.
One scenario, :func:`check_hosts`, on a workdir root and an environment:

- an uninterrupted run, the reference, and at the same time a run in
  which SIGKILL of process :data:`KILLED` held after step
  :data:`HOLD_AT` makes the other three exit 1 within :data:`KILL_BOUND_S` with
  one line each naming it (:class:`laplax.train.preemption.Peers`), no
  traceback;
- the same command restarted (process 0, which lived, removed the lock as
  it stopped; the run resumes from step 0, committed before the kill),
  SIGTERM to process :data:`SIGNALLED` alone, held after step
  :data:`HOLD_AT`: all four stop after the same step (the step
  each one's stop check said stop, as recorded), exit 0 and leave exactly one
  checkpoint of it besides step 0;
- the same command again resumes, and its metrics equal the
  reference's bitwise (timing keys dropped);
- what each process read, checked: its rows of every step are rows
  ``p::4`` of the global batch one reader of the same data gives, the
  four shares are disjoint and together the whole batch, and the killed,
  stopped and resumed runs read the reference's rows, each step once.

The workdir is a parameter: a root under which each run gets its own
workdir, ``gs://`` on the module's GCS emulator (``helpers.gcs``, its
environment set for the processes); the hooks' records stay local.
:data:`WHERE` holds ``"gs"`` only: the scenario takes minutes, and the local
multi-process path is tested by tests/train/test_stop.py's two-process
tests (``"local"`` still runs it on a local folder).
"""

import json
import os
import random
import re
import signal
import socket
import string
import subprocess
import sys
import time

import pytest

from laplax import store
from laplax.workdir import files
from laplax.workdir import lock as lock_lib

from helpers import sharding_run
from helpers.gcs import gcs_fixture  # noqa: F401  (the fixture gcs)
from helpers.resume import GPT_CONFIG, GPT_TINY
from helpers.runs import ROOT, xla_env

PROCESSES, DEVICES = 4, 2
STEPS, HOLD_AT, SIGNALLED, KILLED = 8, 3, 2, 1
KILL_BOUND_S = 60
HANG_GUARD_S = 300
TIMING = ("steps_per_sec", "data_wait_fraction")
# What JAX's distributed client prints when it ends a process whose peer died.
JAX_ABORT = "Terminating process because the JAX distributed service detected fatal errors"
HELPER = os.path.join(ROOT, "tests", "helpers", "hosts_run.py")
GPT = [
  *GPT_TINY,
  f"--config.total_steps={STEPS}",
  "--config.log_every=1",
  "--config.eval_every=1000",
  "--config.checkpoint_every=1000",
  "--config.mesh_shape=(2,2,2)",
  "--config.optim.grad_accum_steps=1",
]
WHERE = ["gs"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """``(corpus, data_dir, batches)``: a corpus of random letters (so that no
  two windows are equal), prepared once here, and the first :data:`STEPS`
  global batches one reader of all of it gives (``tokens``, ``[8, 33]``)."""
  from laplax import tasks

  root = tmp_path_factory.mktemp("hosts")
  corpus = root / "corpus"
  corpus.mkdir()
  rng = random.Random(54)
  for name in "abc":
    words = ("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(600))
    (corpus / f"{name}.txt").write_text(" ".join(words))
  config = sharding_run.load_config("gpt_shakespeare", {})
  for flag in GPT:
    key, value = flag[len("--config.") :].split("=")
    if key in ("batch_size", "model.max_length", "seed"):
      *parents, leaf = key.split(".")
      node = config
      for part in parents:
        node = node[part]
      node[leaf] = int(value)
  config.data.source_dir, config.data.data_dir = str(corpus), str(root / "tfds")
  stream = iter(tasks.LanguageModelTask.from_data(config, None).train_dataset(0, 1))
  batches = [next(stream)["tokens"] for _ in range(STEPS)]
  rows = [tuple(r) for b in batches for r in b.tolist()]
  assert len(set(rows)) == len(rows) == 8 * STEPS
  return corpus, root / "tfds", batches


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


class Hosts:
  """The 4 processes of one ``train.py`` command, started; their output in files."""

  def __init__(self, workdir, env, data, hooks, hold=None):
    self.hooks = hooks
    hooks.mkdir()
    flags = [
      "--config",
      GPT_CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.source_dir={data[0]}",
      f"--config.data.data_dir={data[1]}",
      *GPT,
      f"--config.distributed.coordinator_address=localhost:{_free_port()}",
      f"--config.distributed.num_processes={PROCESSES}",
    ]
    env = dict(env, LAPLAX_HOSTS_DIR=str(hooks))
    if hold is not None:
      env["LAPLAX_HOSTS_HOLD"] = f"{hold[0]}:{hold[1]}"
    self.procs = []
    for i in range(PROCESSES):
      with open(hooks / f"out{i}", "w") as out, open(hooks / f"err{i}", "w") as err:
        self.procs.append(
          subprocess.Popen(
            [sys.executable, HELPER, *flags, f"--config.distributed.process_id={i}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=err,
          )
        )

  def wait_held(self, index):
    """Waits until process ``index`` holds (or any process ended)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline and all(p.poll() is None for p in self.procs):
      if (self.hooks / f"held{index}").exists():
        return
      time.sleep(0.01)
    raise AssertionError(f"process {index} never held: {self.outputs()}")

  def wait(self):
    """The exit codes, once all have ended (killed at the hang guard)."""
    try:
      return [p.wait(timeout=HANG_GUARD_S) for p in self.procs]
    finally:
      for p in self.procs:
        p.kill()

  def out(self, i, stream="err"):
    return (self.hooks / f"{stream}{i}").read_text()

  def outputs(self):
    return "\n".join(f"--- process {i}:\n{self.out(i)[-2000:]}" for i in range(PROCESSES))

  def records(self, i):
    path = self.hooks / f"process{i}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

  def rows(self, i):
    """``{step: rows}`` process ``i`` fed (each step once)."""
    fed = [(r["step"], r["rows"]) for r in self.records(i) if "rows" in r]
    assert len({s for s, _ in fed}) == len(fed), f"process {i} read a step twice"
    return dict(fed)

  def stops(self):
    return [[r["stop"] for r in self.records(i) if "stop" in r] for i in range(PROCESSES)]


def _metrics(workdir):
  records = [json.loads(line) for line in files.read_metric_lines(workdir)]
  return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def _checkpoints(workdir):
  return sorted(int(n) for n in store.listdir(store.join(workdir, "checkpoints")) if n.isdigit())


def _check_shares(rows, batches):
  """Process ``p``'s rows of step ``s`` are rows ``p::4`` of global batch ``s``; the
  shares are disjoint and together the global batch."""
  assert [sorted(r) for r in rows] == [list(range(1, STEPS + 1))] * PROCESSES
  for s, batch in enumerate(batches, start=1):
    shares = [[tuple(x) for x in rows[p][s]] for p in range(PROCESSES)]
    for p, share in enumerate(shares):
      assert share == [tuple(x) for x in batch[p::PROCESSES].tolist()], (s, p)
    union = [x for share in shares for x in share]
    assert len(set(union)) == len(union) == len(batch), s
    assert set(union) == {tuple(x) for x in batch.tolist()}, s


def _kill_one(hosts, root):
  """SIGKILL of process :data:`KILLED`, held: the other three exit 1 within
  :data:`KILL_BOUND_S`, each with one line naming it, and no traceback."""
  hosts.wait_held(KILLED)
  hosts.procs[KILLED].send_signal(signal.SIGKILL)
  t0 = time.monotonic()
  codes = hosts.wait()
  seconds = time.monotonic() - t0
  assert codes[KILLED] == -9, hosts.outputs()
  assert seconds < KILL_BOUND_S, seconds
  # Known limit (issue 54): JAX's coordination service may end a survivor
  # first, from C++ (LOG(FATAL), SIGABRT), before laplax's watcher writes its
  # line; seen on a quiet machine. Such a process must show JAX's own reason;
  # at least one survivor must end with laplax's line.
  aborted = {i for i, code in enumerate(codes) if code == -signal.SIGABRT and i != KILLED}
  for i in aborted:
    assert JAX_ABORT in hosts.out(i), hosts.outputs()
  survivors = set(range(PROCESSES)) - {KILLED} - aborted
  assert survivors and all(codes[i] == 1 for i in survivors), hosts.outputs()
  # Process 0 knows every pid and names it to the others; itself it is named by index.
  pid = f" (pid {hosts.procs[KILLED].pid})" if KILLED else ""
  for i in survivors:
    err = hosts.out(i)
    lines = [line for line in re.split(r"[\r\n]", err) if line.startswith("stopped")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0] == (
      f"stopped: process {KILLED} of {PROCESSES}{pid} ended without stopping with the "
      f"others: last complete checkpoint: step 0 in {root}/checkpoints, later steps not "
      f"saved; run the same command on every process to go on"
    ), lines[0]
  return seconds


def _term_one(hosts):
  """SIGTERM to process :data:`SIGNALLED` alone, held: all four exit 0 after
  the same step (each one's stop check, recorded); returns it."""
  hosts.wait_held(SIGNALLED)
  hosts.procs[SIGNALLED].send_signal(signal.SIGTERM)
  assert hosts.wait() == [0] * PROCESSES, hosts.outputs()
  stops = hosts.stops()
  step = stops[0][0] if stops[0] else None
  assert stops == [[step]] * PROCESSES and step in (HOLD_AT, HOLD_AT + 1), hosts.outputs()
  assert f"stopped by a signal to another process at step {step}; " in hosts.out(0, "out")
  return step


def check_hosts(root, env, tmp_path, data):
  """The scenario of the module docstring under the workdir root ``root`` (a
  local path, or an object-store URL that ``env`` reaches). The stop bound
  is raised so that a loaded machine's slow step never ends a process at it
  (tests/train/test_stop.py tests the bound)."""
  env = dict(env, PYTHONUNBUFFERED="1", LAPLAX_STOP_BOUND_S="120")
  reference, run = f"{root}/reference", f"{root}/run"
  # The reference and the killed run at once (8 processes: the machine's
  # waits overlap), then SIGTERM to one after the same command's restart.
  ref = Hosts(reference, env, data, tmp_path / "reference")
  kill = Hosts(run, env, data, tmp_path / "kill", hold=(KILLED, HOLD_AT))
  _kill_one(kill, run)
  assert _checkpoints(run) == [0]
  assert lock_lib.read(run) is None  # process 0, alive, released it as it stopped
  assert ref.wait() == [0] * PROCESSES, ref.outputs()
  rows = [ref.rows(p) for p in range(PROCESSES)]
  _check_shares(rows, data[2])
  assert ref.stops() == [[]] * PROCESSES
  term = Hosts(run, env, data, tmp_path / "term", hold=(SIGNALLED, HOLD_AT))
  step = _term_one(term)
  assert "resumed from step 0" in term.out(0, "out")
  assert _checkpoints(run) == [0, step]
  assert max(r["step"] for r in _metrics(run) if r["split"] == "train") == step

  # The same command resumes: bitwise the uninterrupted run's metrics.
  resume = Hosts(run, env, data, tmp_path / "resume")
  assert resume.wait() == [0] * PROCESSES, resume.outputs()
  assert f"resumed from step {step}" in resume.out(0, "out")
  assert _metrics(run) == _metrics(reference)
  assert _checkpoints(run) == [0, step, STEPS]
  assert lock_lib.read(run) is None and lock_lib.read(reference) is None
  # Each run read the reference's rows of its steps, each step once.
  for p in range(PROCESSES):
    killed, before, after = kill.rows(p), term.rows(p), resume.rows(p)
    assert sorted(before) == list(range(1, step + 1)), p
    assert sorted(after) == list(range(step + 1, STEPS + 1)), p
    assert {**before, **after} == rows[p], p
    assert killed == {s: rows[p][s] for s in killed}, p


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("where", WHERE)
def test_four_hosts_stop_together_resume_bitwise_and_read_their_own_rows(
  where, tmp_path, data, request
):
  if where == "gs":
    gcs = request.getfixturevalue("gcs")
    root = f"gs://{gcs.bucket}/hosts"
  else:
    root = str(tmp_path / "workdirs")
  check_hosts(root, xla_env(DEVICES), tmp_path, data)
