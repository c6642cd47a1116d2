"""Signals always work: SIGINT/SIGTERM end a run whose step never ends (issue 32).

Everything here runs in real processes, since a signal that cannot reach a
busy process is only visible from outside:

- :mod:`laplax.signals` alone, in a small script whose main thread is
  stuck in a C call (``libc.sleep`` in a loop, or ``hashlib.pbkdf2_hmac``
  for minutes): one signal in the "training loop" (``Guard.graceful``) ends
  it after the bound with 143, a second signal at once with 130, and outside
  the loop a C call that never returns to Python is ended by the watcher;
  every path runs the registered clean-ups and prints one line.
- ``train.py`` with ``--config.debug.stall_at_step=3`` (step 3 waits inside
  the compiled step until the process ends, as a step too large for the
  machine keeps XLA busy), stopped by one SIGTERM: exit 143, one line
  naming the last complete checkpoint, ``train.lock`` gone, and that
  checkpoint verifies and restores.
- ``python -m laplax.sweep`` running that same stalled ``train.py``, stopped
  by two SIGINTs: the child ends at once with 130 naming its last
  checkpoint, the sweep with 130 repeating that line, and the lock is gone.

No test asserts a duration (the waits below only keep a broken build from
hanging the suite).
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from laplax.workdir import integrity

from helpers.resume import saved_state, start, wait_for_step
from helpers.runs import CONFIG, ROOT, TINY

HANG_GUARD_S = 180  # a process that never exits fails the test instead of hanging it

GUARD_SCRIPT = r"""
import ctypes, hashlib, linecache, sys, threading, time
from laplax import signals
mode, marker = sys.argv[1], sys.argv[2]
signals.at_exit(lambda: open(marker, "w").write("cleaned"))
libc = ctypes.CDLL(None)
with signals.Guard("demo", bound=float(sys.argv[3])) as guard:
  guard.step_seconds = float(sys.argv[4])  # as the loop's logged step times set it
  if mode == "loop":  # a step that never ends: libc.sleep, again and again
    with guard.graceful():
      print("ready", flush=True)
      while True:
        libc.sleep(100)
  if mode == "collective":  # several processes, but no JAX notifier: steps go on ending
    with guard.graceful(collective=True):
      print("ready", flush=True)
      while True:
        guard.progress()
        time.sleep(0.02)
  main = threading.main_thread().ident

  def ready():  # once the main thread is at the C call (and a moment after)
    while sys._current_frames()[main].f_code.co_name != "<module>" or \
        "pbkdf2" not in linecache.getline(__file__, sys._current_frames()[main].f_lineno):
      time.sleep(0.01)
    time.sleep(0.2)
    print("ready", flush=True)
  threading.Thread(target=ready, daemon=True).start()
  try:  # outside the loop: a C call that does not return to Python for minutes
    hashlib.pbkdf2_hmac("sha256", b"x", b"y", 10 ** 9)
  except signals.Signalled as e:
    guard.hard_exit(e.signum, late=False, reason="before demo finished")
"""


def _guard(tmp_path, mode, bound, signals_to_send, step_seconds=0.0):
  """Runs :data:`GUARD_SCRIPT`, sends the signals (each after the script
  shows it got the one before) and returns ``(exit code, stderr lines,
  whether the clean-up ran)``."""
  script = tmp_path / "guard.py"
  script.write_text(GUARD_SCRIPT)
  marker = tmp_path / "cleaned"
  env = dict(os.environ, PYTHONPATH=ROOT)
  proc = subprocess.Popen(
    [sys.executable, str(script), mode, str(marker), str(bound), str(step_seconds)],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env,
  )
  assert proc.stdout.readline().strip() == "ready"
  for i, signum in enumerate(signals_to_send):
    if i:  # the first one was seen: the notice line is on stderr
      assert "stopping after the step in flight" in proc.stderr.readline() + proc.stderr.readline()
    proc.send_signal(signum)
  _, err = proc.communicate(timeout=HANG_GUARD_S)
  return proc.returncode, [l for l in err.splitlines() if l.strip()], marker.exists()


def test_collective_stop_without_jax_notifier_ends_by_the_bound(tmp_path):
  """graceful(collective=True) without jax.distributed: no stop can be agreed,
  so steps that keep ending do not hold the bound off; one warning line."""
  code, lines, cleaned = _guard(tmp_path, "collective", 1, [signal.SIGTERM])
  assert code == 143, lines
  assert any("cannot agree on a stop" in line for line in lines), lines
  assert cleaned


@pytest.mark.parametrize("step_seconds,waited", [(0.0, 1), (1.5, 3)])
def test_one_sigterm_in_a_step_that_never_ends_exits_143_after_the_bound(
  tmp_path, step_seconds, waited
):
  """The bound is 1 s here, or twice the slowest step the loop logged."""
  code, lines, cleaned = _guard(tmp_path, "loop", 1, [signal.SIGTERM], step_seconds)
  assert code == 143 and cleaned, lines
  assert lines[-1] == (
    f"stopped by SIGTERM (signal 15), no step ended within {waited} s: "
    f"nothing more was saved; run the same command to go on"
  ), lines
  assert f"has not finished in {waited} s" in lines[0], lines


def test_a_second_sigint_exits_130_at_once(tmp_path):
  # The bound (10 minutes) is never reached: only the second signal can end it.
  code, lines, cleaned = _guard(tmp_path, "loop", 600, [signal.SIGINT, signal.SIGINT])
  assert code == 130 and cleaned, lines
  assert lines[-1].startswith("stopped by SIGINT (signal 2), a second signal:"), lines


def test_outside_the_loop_a_c_call_that_never_returns_is_ended(tmp_path):
  code, lines, cleaned = _guard(tmp_path, "other", 1, [signal.SIGTERM])
  assert code == 143 and cleaned, lines
  assert len(lines) == 1 and lines[0].startswith(
    "stopped by SIGTERM (signal 15), demo was still busy 1 s later:"
  ), lines


# --------------------------------------------------------------------------
# train.py and the sweep.

STALL = [
  "--config.total_steps=8",
  "--config.checkpoint_every=2",
  "--config.log_every=1",
  "--config.eval_every=1000",
  "--config.data.eval_split=test[:200]",
]


def _train_args(workdir, fmnist_data_dir, *extra):
  return (
    [
      "train.py",
      "--config",
      CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.data_dir={fmnist_data_dir}",
    ]
    + TINY
    + STALL
    + list(extra)
  )


def _stopped_run(tmp_path, fmnist_data_dir, signals_to_send):
  """A train.py whose step 3 never ends, signalled once step 2 is saved:
  ``(exit code, its output, workdir)``."""
  workdir = tmp_path / "run"
  log = tmp_path / "train.log"
  proc = start(_train_args(workdir, fmnist_data_dir, "--config.debug.stall_at_step=3"), log)
  try:
    assert wait_for_step(proc, workdir, 2), log.read_text()[-3000:]
    while proc.poll() is None and not (workdir / "checkpoints" / "2").exists():
      time.sleep(0.01)  # step 2's checkpoint is committed (renamed into place) in the background
    for i, signum in enumerate(signals_to_send):
      if i:
        while "stopping after the step in flight" not in log.read_text():
          assert proc.poll() is None, log.read_text()[-3000:]
          time.sleep(0.01)
      proc.send_signal(signum)
    code = proc.wait(timeout=HANG_GUARD_S)
  finally:
    proc.kill()
  return code, log.read_text(), workdir


def _last_line(text):
  return [l for l in re.split(r"[\r\n]", text) if l.strip()][-1]


@pytest.mark.slow
def test_train_py_stopped_by_one_sigterm_in_a_step_that_never_ends(tmp_path, fmnist_data_dir):
  code, out, workdir = _stopped_run(tmp_path, fmnist_data_dir, [signal.SIGTERM])
  assert code == 143, out[-3000:]
  # The bound: 5 s, or twice the slowest logged step time if longer.
  assert re.fullmatch(
    rf"stopped by SIGTERM \(signal 15\), no step ended within [\d.]+ s: last complete "
    rf"checkpoint: step 2 in {re.escape(str(workdir / 'checkpoints'))}, later steps not "
    rf"saved; run the same command to go on",
    _last_line(out),
  ), out[-3000:]
  assert "Traceback" not in out
  assert not (workdir / "train.lock").exists()
  names = os.listdir(workdir / "checkpoints")
  assert max(int(n) for n in names if n.isdigit()) == 2, names
  assert integrity.verify(str(workdir / "checkpoints" / "2"))  # complete, and it restores:
  step, state = saved_state(workdir, 2)
  assert step == 2 and int(state["step"]) == 2


@pytest.mark.slow
@pytest.mark.subprocess
def test_sweep_two_sigints_end_its_stalled_child_at_once(tmp_path, fmnist_data_dir):
  """The sweep's first SIGINT reaches its train.py as SIGTERM (it would save
  after its step), the second as SIGINT: the child exits at once with 130
  naming its last checkpoint, and so does the sweep."""
  workdir = tmp_path / "sweep"
  args = (
    [
      "-m",
      "laplax.sweep",
      "--config",
      CONFIG,
      "--workdir",
      str(workdir),
      "--grid",
      "model.num_laplacian_heads=1",
      f"--config.data.data_dir={fmnist_data_dir}",
      "--config.debug.stall_at_step=3",
    ]
    + TINY
    + STALL
  )
  log = tmp_path / "sweep.log"
  with open(log, "w") as f:  # a bound of 10 minutes: only the second signal can end the run
    proc = subprocess.Popen(
      [sys.executable] + args,
      cwd=ROOT,
      stdout=f,
      stderr=subprocess.STDOUT,
      env=dict(os.environ, PYTHONUNBUFFERED="1", LAPLAX_STOP_BOUND_S="600"),
    )
  run = workdir / "num_laplacian_heads=1,seed=0"
  try:
    assert wait_for_step(proc, run, 2), log.read_text()[-3000:]
    while proc.poll() is None and not (run / "checkpoints" / "2").exists():
      time.sleep(0.01)  # as in _stopped_run: a loaded machine may still be writing it
    proc.send_signal(signal.SIGINT)
    while "stopping after the step in flight" not in _read(run / "train.log"):
      assert proc.poll() is None, log.read_text()[-3000:]
      time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=HANG_GUARD_S)
  finally:
    proc.kill()
  out = log.read_text()
  assert code == 130, out[-3000:]
  assert re.search(
    r"stopped by a signal before it could save \(stopped by SIGINT "
    r"\(signal 2\), a second signal: last complete checkpoint: step \d+ in "
    r"\S+, later steps not saved(; [^;]*)?; run the same command to go on\); "
    r"run the same command to go on",
    out,
  ), out[-3000:]
  assert "Traceback" not in out + _read(run / "train.log")
  assert not (run / "train.lock").exists()


@pytest.mark.subprocess
def test_a_bad_stop_bound_is_one_line_exit_2():
  r = subprocess.run(
    [sys.executable, "-c", "from laplax.cli import common as cli; cli.run(lambda guard: 0)"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=HANG_GUARD_S,
    env=dict(os.environ, LAPLAX_STOP_BOUND_S="soon"),
  )
  assert r.returncode == 2 and r.stderr.strip() == (
    "error: LAPLAX_STOP_BOUND_S='soon' must be a positive number of seconds (default 5); "
    "unset it or give e.g. LAPLAX_STOP_BOUND_S=30"
  ), r.stderr


def _read(path):
  return path.read_text() if path.exists() else ""
