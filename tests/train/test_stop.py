"""Graceful stops that happen (issue 42): real processes, signals at random moments.

- SIGINTs at moments of a seeded schedule, each to a run of the tiny
  quick-start ViT that the same command then resumes (a chain of
  processes, one per SIGINT): each exits 0 with a checkpoint of the step it
  stopped at, never by the bound, and the last command ends bitwise where an
  uninterrupted run ends. Metrics are logged every 10 steps, so most signals
  land between log steps, where the host used to run ahead of the device
  (the stop bound then waited for every step dispatched since the last log).
  ``LAPLAX_STOP_SEED`` sets the schedule (default 42) and
  ``LAPLAX_STOP_SIGINTS`` the number of SIGINTs (default 4, to keep the
  suite short; 10 for the acceptance run).
- SIGTERM during an in-loop evaluation: the evaluation ends, the evaluated
  step is saved, exit 0, no eval record for it.
- Two ``train.py`` processes (``jax.distributed`` on loopback, one CPU
  device each): SIGTERM to one stops both at the same step with one
  checkpoint (JAX's preemption sync point); SIGKILL of one stops the other
  at once with one line naming it (:class:`laplax.train.preemption.Peers`).
- :class:`~laplax.train.preemption.Peers` in threads with a dict as the
  key-value store: an abrupt close is named to every other process, ``bye``
  is not.
"""

import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from laplax.train import preemption

from helpers.resume import (
  GPT_CONFIG,
  GPT_TINY,
  assert_bitwise_equal,
  last_train_step,
  saved_state,
  start,
  wait_for_step,
)
from helpers.runs import CONFIG, ROOT, read_metrics, run_in_process, xla_env
from helpers.runs import TINY as VIT_TINY

HANG_GUARD_S = 240
CHAIN = VIT_TINY + [
  "--config.model.dropout=0.1",
  "--config.log_every=10",
  "--config.checkpoint_every=7",
  "--config.eval_every=1000",
  "--config.total_steps=120",
]


def _vit_args(workdir, data_dir, *extra):
  return (
    [
      "train.py",
      "--config",
      CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.data_dir={data_dir}",
    ]
    + CHAIN
    + list(extra)
  )


def _newest_checkpoint(workdir):
  return max(int(n) for n in os.listdir(workdir / "checkpoints") if n.isdigit())


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigints_at_random_moments_each_save_and_the_chain_resumes_bitwise(
  tmp_path, fmnist_data_dir, capfd
):
  seed = int(os.environ.get("LAPLAX_STOP_SEED", "42"))
  count = int(os.environ.get("LAPLAX_STOP_SIGINTS", "4"))
  rng = random.Random(seed)
  targets = sorted(rng.sample(range(3, 100), count))
  delays = [rng.uniform(0.0, 0.15) for _ in targets]
  reference = tmp_path / "reference"
  r = run_in_process(_vit_args(reference, fmnist_data_dir), capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  workdir = tmp_path / "run"
  args = _vit_args(workdir, fmnist_data_dir)
  stopped_at = 0
  for i, (target, delay) in enumerate(zip(targets, delays)):
    context = f"seed {seed}, SIGINT {i + 1} at step >= {target} + {delay:.3f} s"
    target = max(target, stopped_at + 1)
    log = tmp_path / f"run{i}.log"
    proc = start(args, log)
    try:
      assert wait_for_step(proc, workdir, target, timeout=HANG_GUARD_S), log.read_text()[-3000:]
      time.sleep(delay)
      proc.send_signal(signal.SIGINT)
      code = proc.wait(timeout=HANG_GUARD_S)
    finally:
      proc.kill()
    out = log.read_text()
    assert code == 0, f"{context}: {out[-3000:]}"
    assert "no step ended within" not in out, context
    m = re.search(r"stopped by signal 2 at step (\d+); checkpoint saved in (\S+); ", out)
    assert m, f"{context}: {out[-3000:]}"
    step = int(m.group(1))
    assert target <= step < 120, context
    # The step it stopped at: saved and the newest; nothing logged past it.
    assert step - 10 < last_train_step(workdir) <= step, context
    assert _newest_checkpoint(workdir) == step, context
    saved_step, state = saved_state(workdir, step)
    assert saved_step == step and int(state["step"]) == step, context
    stopped_at = step
  r = run_in_process(args, capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert f"resumed from step {stopped_at}" in r.stderr + r.stdout
  assert_bitwise_equal(saved_state(reference)[1], saved_state(workdir)[1], f"seed {seed}")
  train = [m["step"] for m in read_metrics(workdir) if m["split"] == "train"]
  assert train == list(range(10, 121, 10))


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_during_an_in_loop_evaluation_saves_the_evaluated_step(tmp_path, fmnist_data_dir):
  """Evaluations at steps 3 and 6 of 200 images each (compiled at step 3);
  SIGTERM once step 6 is saved, i.e. in step 6's evaluation (or just before
  it): exit 0, checkpoint 6, and no eval record for step 6."""
  workdir = tmp_path / "run"
  args = [
    "train.py",
    "--config",
    CONFIG,
    "--workdir",
    str(workdir),
    f"--config.data.data_dir={fmnist_data_dir}",
    *VIT_TINY,
    "--config.log_every=1",
    "--config.total_steps=9",
    "--config.eval_every=3",
    "--config.checkpoint_every=3",
    "--config.data.eval_split=test",
    "--config.eval_batch_size=20",
  ]
  proc = start(args, tmp_path / "run.log")
  try:
    deadline = time.time() + HANG_GUARD_S
    while proc.poll() is None and time.time() < deadline:
      if (workdir / "checkpoints" / "6").is_dir():
        break
      time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=HANG_GUARD_S)
  finally:
    proc.kill()
  out = (tmp_path / "run.log").read_text()
  assert code == 0, out[-3000:]
  assert re.search(r"stopped by signal 15 at step 6; checkpoint saved in ", out), out[-3000:]
  records = read_metrics(workdir)
  assert [r["step"] for r in records if r["split"] == "eval"] == [3]
  assert max(r["step"] for r in records if r["split"] == "train") == 6
  assert _newest_checkpoint(workdir) == 6
  assert int(saved_state(workdir, 6)[1]["step"]) == 6


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def sonnets(tmp_path_factory):
  """``(corpus, data_dir)``: a corpus and its prepared datasets (by a
  one-step run in this process, so that two processes never prepare them at once)."""
  root = tmp_path_factory.mktemp("sonnets")
  corpus = root / "corpus"
  corpus.mkdir()
  for name in "abc":
    (corpus / f"{name}.txt").write_text("the cat sat on the mat. " * 150)
  argv = [
    "train.py",
    "--config",
    GPT_CONFIG,
    "--workdir",
    str(root / "prepare"),
    f"--config.data.source_dir={corpus}",
    f"--config.data.data_dir={root / 'tfds'}",
    *GPT_TINY,
    "--config.total_steps=1",
  ]
  assert run_in_process(argv).returncode == 0
  return corpus, root / "tfds"


def _two_processes(tmp_path, sonnets):
  """Two train.py processes of one tiny GPT (one CPU device each, mesh
  (2,1,1)), started; returns them and the workdir once a step is logged."""
  workdir = tmp_path / "two"
  common = [
    "train.py",
    "--config",
    GPT_CONFIG,
    "--workdir",
    str(workdir),
    f"--config.data.source_dir={sonnets[0]}",
    f"--config.data.data_dir={sonnets[1]}",
    *GPT_TINY,
    "--config.mesh_shape=(2,1,1)",
    "--config.total_steps=2000",
    "--config.log_every=1",
    "--config.eval_every=100000",
    "--config.checkpoint_every=100000",
    f"--config.distributed.coordinator_address=localhost:{_free_port()}",
    "--config.distributed.num_processes=2",
  ]
  procs = [
    subprocess.Popen(
      [sys.executable] + common + [f"--config.distributed.process_id={i}"],
      cwd=ROOT,
      env=xla_env(1, PYTHONUNBUFFERED="1"),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  deadline = time.time() + HANG_GUARD_S
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if last_train_step(workdir) >= 3:
      break
    time.sleep(0.02)
  return procs, workdir


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_processes_sigterm_to_one_stops_both_at_one_step_sigkill_stops_the_other(
  tmp_path, sonnets
):
  # SIGTERM to process 1 only: JAX's sync point, the same step saved by both.
  procs, workdir = _two_processes(tmp_path / "term", sonnets)
  procs[1].send_signal(signal.SIGTERM)
  outs = [p.communicate(timeout=HANG_GUARD_S) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-4000:]
  stopped = re.search(r"stopped by a signal to another process at step (\d+)", outs[0][0])
  assert stopped, outs[0][0][-2000:] + outs[0][1][-2000:]
  step = int(stopped.group(1))
  assert 3 <= step < 2000
  assert last_train_step(workdir) == step
  assert sorted(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit()) == [0, step]

  # SIGKILL of process 1: process 0 stops long before JAX's heartbeats
  # (100 s) would, with one line naming process 1.
  procs, workdir = _two_processes(tmp_path / "kill", sonnets)
  procs[1].send_signal(signal.SIGKILL)
  t0 = time.time()
  _, err = procs[0].communicate(timeout=HANG_GUARD_S)
  seconds = time.time() - t0
  procs[1].wait()
  assert procs[0].returncode == 1, err[-4000:]
  lines = [l for l in re.split(r"[\r\n]", err) if l.startswith("stopped")]
  assert len(lines) == 1, err[-4000:]
  assert re.fullmatch(
    rf"stopped: process 1 of 2 \(pid {procs[1].pid}\) ended without stopping with the "
    rf"others: last complete checkpoint: step 0 in {re.escape(str(workdir / 'checkpoints'))}, "
    r"later steps not saved; run the same command on every process to go on",
    lines[0],
  ), lines[0]
  assert "Traceback" not in err
  assert seconds < 60, seconds  # a hang guard: without Peers, >= 100 s
  assert not (workdir / "train.lock").exists()


class _Store:
  """The key-value store of Peers (JAX's coordination-service client's two calls)."""

  def __init__(self):
    self._values, self._cond = {}, threading.Condition()

  def key_value_set(self, key, value):
    with self._cond:
      self._values[key] = value
      self._cond.notify_all()

  def blocking_key_value_get(self, key, timeout_ms):
    with self._cond:
      assert self._cond.wait_for(lambda: key in self._values, timeout_ms / 1000)
      return self._values[key]


def _peers(count):
  store, lost, made = _Store(), {i: [] for i in range(count)}, {}
  got = threading.Event()

  def make(i):
    def on_lost(what):
      lost[i].append(what)
      got.set()

    made[i] = preemption.Peers(i, count, on_lost, client=store, host="localhost")

  threads = [threading.Thread(target=make, args=(i,)) for i in range(count)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  assert sorted(made) == list(range(count))
  return made, lost, got


def test_peers_name_a_process_that_ends_abruptly_and_not_one_that_says_bye():
  made, lost, got = _peers(3)
  # Process 2 ends without bye (its socket closed as a killed process's is).
  made[2]._closing = True
  conn = made[2]._conns[0]
  conn.shutdown(socket.SHUT_RDWR)
  conn.close()
  deadline = time.time() + 30
  while time.time() < deadline and not (lost[0] and lost[1]):
    time.sleep(0.01)
  what = f"process 2 of 3 (pid {os.getpid()}) ended without stopping with the others"
  assert lost == {0: [what], 1: [what], 2: []}

  made, lost, got = _peers(3)
  for i in (2, 1, 0):  # all stop together: nobody is reported
    made[i].close()
  assert not got.wait(1.0)
  assert lost == {0: [], 1: [], 2: []}


def test_an_evaluation_that_counts_nothing_is_a_data_error_not_a_division_by_zero():
  from laplax.data.errors import DataError
  from laplax.tasks.classification import ClassificationTask
  from laplax.tasks.language_model import LanguageModelTask

  with pytest.raises(DataError, match="counted no target token"):
    LanguageModelTask.summarize({"loss": 0.0, "count": 0.0, "bytes": 0.0})
  with pytest.raises(DataError, match="counted no image"):
    ClassificationTask.summarize({"loss": 0.0, "correct": 0.0, "count": 0.0})
  got = LanguageModelTask.summarize({"loss": 6.0, "count": 3.0, "bytes": 4.0})
  assert got["loss"] == 2.0 and got["num_tokens"] == 3
  assert got["bits_per_byte"] == pytest.approx(6.0 / math.log(2) / 4.0, rel=1e-12)
  got = ClassificationTask.summarize({"loss": 3.0, "correct": 1.0, "count": 4.0})
  assert got == {"accuracy": 0.25, "loss": 0.75, "num_examples": 4}


def _watched_pair(monkeypatch):
  """Process 0's :func:`preemption.watched` in a thread (``jax.process_*`` of
  a 2-process run, a dict as the key-value store) and process 1's Peers;
  returns ``(enter, peer, lost)``: ``enter(error)`` raises ``error`` inside the
  block and returns what left it (``None`` while it has not)."""
  import functools

  import jax

  store, lost, left = _Store(), [], []
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  monkeypatch.setattr(
    preemption, "Peers", functools.partial(preemption.Peers, client=store, host="localhost")
  )
  guard = type("Guard", (), {"peer_lost": staticmethod(lost.append)})()
  ready = threading.Event()

  def process0(error):
    try:
      with preemption.watched(guard):
        ready.set()
        raise error
    except BaseException as e:  # noqa: BLE001 - what left the block
      left.append(e)

  def enter(error):
    thread = threading.Thread(target=process0, args=(error,), daemon=True)
    thread.start()
    return thread

  return enter, store, lost, left, ready


def test_a_collective_that_fails_as_a_process_ends_leaves_the_stop_to_the_watch(monkeypatch):
  """A ``JaxRuntimeError`` in :func:`preemption.watched` (a gloo collective whose
  peer ended) waits for the watch: when the watch names the process that
  ended, the watch's line ends the process and the error is never raised;
  without such a process it is raised after ``GRACE_S``; other errors at once."""
  import jax

  enter, store, lost, left, ready = _watched_pair(monkeypatch)
  collective = jax.errors.JaxRuntimeError("UNKNOWN: Gloo collective failed: Connection reset")
  thread = enter(collective)
  peer = preemption.Peers(1, 2, lambda what: None, client=store, host="localhost")
  assert ready.wait(30)
  peer._closing = True
  peer._conns[0].shutdown(socket.SHUT_RDWR)  # process 1 ends (as a SIGKILL closes it)
  peer._conns[0].close()
  deadline = time.time() + 30
  while time.time() < deadline and not lost:
    time.sleep(0.01)
  assert lost == [f"process 1 of 2 (pid {os.getpid()}) ended without stopping with the others"]
  thread.join(0.5)
  assert thread.is_alive() and left == []  # waiting for the watch's exit, the error not raised

  for error, grace in ((collective, 0.3), (ValueError("own error"), 60.0)):
    enter, store, lost, left, ready = _watched_pair(monkeypatch)
    monkeypatch.setattr(preemption, "GRACE_S", grace)
    t0 = time.monotonic()
    thread = enter(error)
    peer = preemption.Peers(1, 2, lambda what: None, client=store, host="localhost")
    thread.join(30)
    assert left == [error] and lost == []
    assert time.monotonic() - t0 < 30
    peer.close()
