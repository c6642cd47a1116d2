"""Runs that survive a full disk, a second writer and a flipped bit (issue 18).

Each test drives the real ``train.py`` / ``eval.py`` with tiny ViTs:

- a workdir on a small file system (a 1200 KiB tmpfs mounted here when this
  runs as root; otherwise ``tests/helpers/enospc_shim.c``, compiled with ``cc`` and
  preloaded, fails writes under the workdir with ENOSPC past a byte budget)
  fills during a checkpoint: one ``error:`` line, exit 2, no traceback, the
  last complete checkpoint bitwise that of an uninterrupted run, and with
  space again the same command ends bitwise where that run ends;
- a second ``train.py`` on a workdir being trained is refused in one line
  while ``eval.py``, ``eval.py --analysis`` and ``laplax.load`` read it in a
  loop; a stale lock (a dead PID, a reused PID) is taken over, and of
  starts racing for one lock exactly one gets it;
- one flipped byte in each of several files of a checkpoint is detected by
  ``eval.py``, ``laplax.load`` and a resumed ``train.py``, which use the
  previous step.

``LAPLAX_TEST_ENOSPC=shim`` uses the preloaded library even as root.
"""

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

import laplax
from laplax.workdir import integrity
from laplax.workdir import lock as lock_lib

from helpers.resume import assert_bitwise_equal, saved_state, start, wait_for_step, wait_stopped
from helpers.runs import ROOT, read_metrics, run_in_process, train_args

# Checkpoints every 5 steps, all kept: the disk fills while one is written.
RUN = [
  "--config.total_steps=30",
  "--config.checkpoint_every=5",
  "--config.keep_checkpoints=100",
  "--config.eval_every=1000",
  "--config.data.eval_split=test[:500]",
  "--config.eval_batch_size=250",
]
SHIM = os.path.join(ROOT, "tests", "helpers", "enospc_shim.c")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, fmnist_data_dir):
  """The uninterrupted run of :data:`RUN` (in this process)."""
  workdir = tmp_path_factory.mktemp("survive_ref") / "run"
  r = run_in_process(train_args(workdir, fmnist_data_dir, *RUN))
  assert r.returncode == 0
  return workdir


def error_lines(text):
  """The lines of ``text`` (split at newlines and the progress bar's carriage
  returns) that start with ``error:``."""
  return [l for l in re.split(r"[\r\n]", text) if l.startswith("error:")]


@contextlib.contextmanager
def small_disk(path, size):
  """Mounts a tmpfs of ``size`` at ``path`` and yields True (as root), or
  yields False if that is not possible; unmounts at the end."""
  if os.geteuid() != 0 or os.environ.get("LAPLAX_TEST_ENOSPC") == "shim":
    yield False
    return
  os.makedirs(path)
  mounted = (
    subprocess.run(
      ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode
    == 0
  )
  try:
    yield mounted
  finally:
    if mounted and subprocess.run(["umount", str(path)], capture_output=True).returncode:
      subprocess.run(["umount", "-l", str(path)], capture_output=True)


def enospc_shim(tmp_path):
  """``tests/helpers/enospc_shim.c`` compiled into ``tmp_path``, or None without a compiler."""
  cc = shutil.which("cc") or shutil.which("gcc")
  if cc is None:
    return None
  out = str(tmp_path / "enospc_shim.so")
  made = subprocess.run(
    [cc, "-shared", "-fPIC", "-O2", "-o", out, SHIM, "-ldl"], capture_output=True
  )
  return out if made.returncode == 0 else None


@pytest.mark.slow
@pytest.mark.subprocess
def test_disk_full_during_a_checkpoint_one_line_exit_2_then_resumes(
  tmp_path, reference, fmnist_data_dir, capfd
):
  with small_disk(tmp_path / "mnt", "1200k") as mounted:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    workdir = tmp_path / "mnt" / "run"
    if not mounted:
      shim = enospc_shim(tmp_path)
      if shim is None:
        pytest.skip("cannot mount a tmpfs (not root) and no C compiler for the ENOSPC shim")
      workdir = tmp_path / "run"
      env.update(LD_PRELOAD=shim, ENOSPC_PREFIX=str(workdir), ENOSPC_BYTES="700000")
    args = train_args(workdir, fmnist_data_dir, *RUN)
    r = subprocess.run(
      [sys.executable] + args, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Exception" not in r.stderr, r.stderr[-3000:]
    errors = error_lines(r.stderr)
    assert len(errors) == 1, r.stderr[-3000:]
    m = re.fullmatch(
      r"error: no space left on device while saving checkpoint step (\d+) in "
      r"(\S+) \(about [\d.]+ MB needed\); last complete checkpoint: step (\d+); "
      r"free space and run the same command to resume",
      errors[0],
    )
    assert m, errors[0]
    failed, last = int(m.group(1)), int(m.group(3))
    assert m.group(2) == str(workdir / "checkpoints") and last == failed - 5 and last >= 5
    # Nothing half-written is left as if complete.
    names = os.listdir(workdir / "checkpoints")
    assert not [n for n in names if "tmp" in n], names
    assert max(int(n) for n in names if n.isdigit()) == last
    assert integrity.verify(str(workdir / "checkpoints" / str(last)))
    logged = [m["step"] for m in read_metrics(workdir) if m["split"] == "train"]  # all parse
    assert logged == sorted(set(logged)) and logged[-1] >= failed
    assert not (workdir / lock_lib.LOCK_FILE).exists()
    assert_bitwise_equal(saved_state(reference, last)[1], saved_state(workdir, last)[1])

    # Space again: the same command ends where the uninterrupted run ends.
    if mounted:
      subprocess.run(["mount", "-o", "remount,size=8m", str(tmp_path / "mnt")], check=True)
    r = run_in_process(args, capfd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from step {last}" in r.stdout + r.stderr
    step, state = saved_state(workdir)
    assert step == 30
    assert_bitwise_equal(saved_state(reference)[1], state)
    train = [m["step"] for m in read_metrics(workdir) if m["split"] == "train"]
    assert train == [5, 10, 15, 20, 25, 30]


def _dead_pid():
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def tree_state(directory):
  """``{relative path: (size, mtime_ns, bytes or None)}`` of everything under
  ``directory`` (the bytes of files, None for folders)."""
  out = {}
  for root, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(root, name)
      st = os.stat(path)
      data = None
      if name in files:
        with open(path, "rb") as f:
          data = f.read()
      out[os.path.relpath(path, directory)] = (st.st_size, st.st_mtime_ns, data)
  return out


@contextlib.contextmanager
def refusal_watch(monkeypatch):
  """Counts, while in the block, XLA compilations (JAX's monitoring events)
  and calls of the trainer (``loop.train_and_evaluate``): a start refused at
  once makes neither."""
  import jax

  from laplax.train import loop

  counts = {"compiled": 0, "trained": 0}

  def on_duration(event, duration, **kwargs):
    if event.startswith("/jax/core/compile/"):  # tracing, lowering, compiling
      counts["compiled"] += 1

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  original = loop.train_and_evaluate

  def trained(*args, **kwargs):
    counts["trained"] += 1
    return original(*args, **kwargs)

  monkeypatch.setattr(loop, "train_and_evaluate", trained)
  try:
    yield counts
  finally:
    jax.monitoring.unregister_event_duration_listener(on_duration)
    monkeypatch.setattr(loop, "train_and_evaluate", original)


@pytest.mark.slow
@pytest.mark.subprocess
def test_one_writer_many_readers(tmp_path, fmnist_data_dir, capfd, monkeypatch):
  """A second train.py is refused in one line before it writes anything or
  compiles anything (the first run frozen meanwhile, so that its workdir
  stands still); eval.py, eval.py --analysis and laplax.load read the workdir in a
  loop while it checkpoints every step (keeping 2, so each save also deletes
  one) and never fail, warn or go back to an older step; the first run's metrics are strictly increasing; a
  lock left by a dead process is taken over."""
  workdir = tmp_path / "run"
  args = train_args(
    workdir,
    fmnist_data_dir,
    "--config.total_steps=40",
    "--config.checkpoint_every=1",
    "--config.keep_checkpoints=2",
    "--config.log_every=1",
    "--config.eval_every=1000",
    "--config.data.eval_split=test[:500]",
    "--config.eval_batch_size=250",
  )
  proc = start(args, tmp_path / "first.log")
  try:
    assert wait_for_step(proc, workdir, 2), (tmp_path / "first.log").read_text()[-3000:]
    proc.send_signal(signal.SIGSTOP)
    try:
      wait_stopped(proc.pid)  # every thread, so that no write is still in flight
      before = tree_state(workdir)
      with refusal_watch(monkeypatch) as watched:
        r = run_in_process(args, capfd)
      assert tree_state(workdir) == before  # nothing written, moved or removed
    finally:
      proc.send_signal(signal.SIGCONT)
    assert r.returncode == 2, r.stderr[-3000:]
    assert watched == {"compiled": 0, "trained": 0}, watched
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: workdir "), r.stderr
    assert f"process {proc.pid} on host {socket.gethostname()}" in lines[0]
    assert f"kill {proc.pid}" in lines[0]
    assert lock_lib.read(str(workdir))["pid"] == proc.pid

    seen, during = [], 0
    for i in itertools.count():
      if proc.poll() is not None and i >= 3:
        break
      kind = ("eval", "analysis", "load")[i % 3]
      out = tmp_path / f"read{i}" / f"{kind}.json"
      during += proc.poll() is None
      if kind == "load":
        seen.append((kind, laplax.load(str(workdir)).step, ""))
        continue
      argv = ["eval.py", "--workdir", str(workdir), "--out", str(out)]
      if kind == "analysis":
        argv += [
          "--analysis",
          "--analysis_layers",
          "0",
          "--analysis_examples",
          "64",
          "--analysis_jacobian_dim",
          "0",
        ]
      r = run_in_process(argv, capfd)
      assert r.returncode == 0, (kind, r.stderr[-3000:])
      seen.append((kind, json.loads(out.read_text())["step"], r.stderr))
    assert proc.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
  finally:
    if proc.poll() is None:
      proc.kill()
  steps = [s for _, s, _ in seen]
  assert during >= 2, (during, seen)  # reads while the run trained
  assert all(0 <= s <= 40 for s in steps), seen
  assert steps == sorted(steps), seen
  for _, _, err in seen:
    assert not re.search(r"unreadable|incomplete|no checksum", err), err
  train = [m["step"] for m in read_metrics(workdir) if m["split"] == "train"]
  assert train == list(range(1, 41))
  assert not (workdir / lock_lib.LOCK_FILE).exists()

  # A lock of a dead process of this host is taken over by the same command.
  dead = _dead_pid()
  (workdir / lock_lib.LOCK_FILE).write_text(
    json.dumps({"host": socket.gethostname(), "pid": dead, "started_iso": "2026-12-01T00:00:00"})
  )
  r = run_in_process(args, capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert re.search(
    rf"workdir \S+ was locked by train.py process {dead} on host "
    rf"\S+ \(since 2026-12-01T00:00:00\), which is no longer running",
    r.stderr,
  )
  assert not (workdir / lock_lib.LOCK_FILE).exists()


def test_reused_pid_is_not_the_owner(tmp_path):
  """A live PID whose process started at another time is a reused PID."""
  me = os.getpid()
  started = lock_lib._proc_start(me)
  assert started is not None and lock_lib._alive(me, started)
  assert not lock_lib._alive(me, started + 1)
  assert not lock_lib._alive(_dead_pid(), None)
  (tmp_path / lock_lib.LOCK_FILE).write_text(
    json.dumps({"host": socket.gethostname(), "pid": me, "proc_start": started + 1})
  )
  with lock_lib.WorkdirLock(str(tmp_path)) as held:
    assert lock_lib.read(str(tmp_path))["token"] == held.record["token"]
    with pytest.raises(lock_lib.LockError, match=f"process {me} on host"):
      lock_lib.check(str(tmp_path))
  assert not (tmp_path / lock_lib.LOCK_FILE).exists()


def _flip(path):
  """Flips one bit of the middle byte of ``path``; returns the original bytes."""
  original = path.read_bytes()
  data = bytearray(original)
  data[len(data) // 2] ^= 0x10
  path.write_bytes(bytes(data))
  return original


@pytest.mark.slow
def test_flipped_byte_detected_previous_step_used(tmp_path, reference, fmnist_data_dir, capfd):
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  step_dir = workdir / "checkpoints" / "30"
  files = json.loads((step_dir / integrity.MANIFEST).read_text())["files"]
  chunks = sorted((f for f in files if f.startswith("state/d/")), key=lambda f: files[f][0])
  flipped = [chunks[-1], "state/_METADATA", "state/manifest.ocdbt", "data/metadata"]
  for rel in flipped:
    original = _flip(step_dir / rel)
    out = tmp_path / rel.replace("/", "_") / "eval.json"
    r = run_in_process(["eval.py", "--workdir", str(workdir), "--out", str(out)], capfd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(
      rf"checkpoint step 30 in \S+ is unreadable \(checksum mismatch in "
      rf"{re.escape(rel)}\); using step 25",
      r.stderr,
    ), r.stderr[-3000:]
    assert json.loads(out.read_text())["step"] == 25
    if rel == flipped[0]:
      run = laplax.load(str(workdir))
      assert (run.step, run.latest_step) == (25, 30)
    (step_dir / rel).write_bytes(original)

  # train.py resumes from step 25 (taking over another host's lock, as asked),
  # saves step 30 again and ends bitwise where the uninterrupted run ends.
  _flip(step_dir / chunks[-1])
  (workdir / lock_lib.LOCK_FILE).write_text(
    json.dumps({"host": "elsewhere.example", "pid": 1, "started_iso": "2026-12-01T00:00:00"})
  )
  args = train_args(workdir, fmnist_data_dir, *RUN)
  r = run_in_process(args, capfd)
  assert r.returncode == 2 and "--force_unlock" in r.stderr
  r = run_in_process(args + ["--force_unlock"], capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "another host; taking the lock over (--force_unlock)" in r.stderr
  assert f"is unreadable (checksum mismatch in {chunks[-1]}); using step 25" in r.stderr
  assert integrity.verify(str(step_dir))
  assert_bitwise_equal(saved_state(reference)[1], saved_state(workdir)[1])


@pytest.mark.subprocess
def test_racing_starts_one_gets_the_lock(tmp_path):
  """Three processes take the lock of a workdir at the same moment, once on
  a new workdir and once over a stale lock: exactly one holds it, the others
  are refused."""
  code = (
    "import sys, time\nfrom laplax.workdir import lock\n"
    "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
    "try:\n  with lock.WorkdirLock(sys.argv[1]):\n    print('held', flush=True)\n"
    "    time.sleep(1.0)\nexcept lock.LockError:\n  print('refused')\n"
  )
  for stale in (False, True):
    workdir = tmp_path / f"stale{stale}"
    workdir.mkdir()
    if stale:
      (workdir / lock_lib.LOCK_FILE).write_text(
        json.dumps({"host": socket.gethostname(), "pid": _dead_pid()})
      )
    at = str(time.time() + 1.0)
    procs = [
      subprocess.Popen(
        [sys.executable, "-c", code, str(workdir), at],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
      )
      for _ in range(3)
    ]
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["held", "refused", "refused"], (stale, outcomes)
    assert not (workdir / lock_lib.LOCK_FILE).exists()
