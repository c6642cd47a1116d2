"""Signals that always work: SIGINT and SIGTERM end a laplax command within seconds.

A Python signal handler runs only when the main thread executes Python
bytecode. While that thread waits inside a long XLA computation or
compilation (a first step on a batch that cannot fit, a huge model being
compiled) the handler waits too, and Ctrl-C or ``kill`` seem to do nothing.
:class:`Guard` therefore also listens from a thread of its own: the
interpreter's C-level handler writes the number of each signal into a socket
at once (:func:`signal.set_wakeup_fd`), whatever the main thread is doing,
and the guard's watcher thread reads it there.

What a SIGINT or SIGTERM does under a guard (``train.py``, ``eval.py``,
``python -m laplax.convert``; ``python -m laplax.sweep`` forwards its
signals to its child, see :mod:`laplax.sweep`):

- In the training loop (:meth:`Guard.graceful`) the first signal asks for a
  graceful stop: the step in flight finishes, a checkpoint is saved and the
  run exits 0 (:mod:`laplax.train.loop`, which lets at most one step run
  ahead of the host, so that the stop waits for two steps at most). An
  evaluation inside the loop (:meth:`Guard.evaluate`) is ended by the
  signal, and the evaluated step saved; with several processes
  (``graceful(collective=True)``) the first signal also goes to JAX's
  preemption notifier, and the processes stop together at JAX's preemption
  sync point. If that step has not finished
  :data:`BOUND_S` seconds after the signal (or twice the longest time per
  step the loop has logged, when that is longer: :attr:`Guard.step_seconds`),
  or a second signal arrives, the process exits at once
  (:meth:`Guard.hard_exit`).
- Anywhere else (imports, data preparation, compilation, evaluation,
  conversion) the first signal raises :class:`Signalled`, a
  ``KeyboardInterrupt``, in the main thread, whose ``finally`` blocks run
  (the workdir's lock is released) before the CLI exits; if the process is
  still there :data:`BOUND_S` seconds later (the main thread is inside a C
  call), or a second signal arrives, it exits at once.

Exiting at once runs the registered clean-ups (:func:`at_exit`: the
workdir's lock is released, a converter's temporary directory removed),
prints one line saying what was and was not saved, and ends the process with
``os._exit`` and exit code 130 (SIGINT) or 143 (SIGTERM), as a shell
reports a process a signal ended, without the interpreter's teardown (whose
threads may be in the middle of a write). What is on disk stays consistent:
orbax writes a checkpoint into ``N.orbax-checkpoint-tmp...`` and renames it
when it is complete, so an interrupted write leaves only that directory,
which every reader ignores and the next ``train.py`` start removes;
``config.json``, ``eval.json``, the lock and the datasets are written to a
temporary name and renamed; a converter renames its finished workdir into
place inside :func:`critical`, which a hard exit waits for.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: Seconds the step in flight (or, outside the loop, the main thread) has to
#: reach Python after the first signal before the process exits at once; the
#: environment variable LAPLAX_STOP_BOUND_S sets another (bound_from_env).
BOUND_S = 5.0
BOUND_ENV = "LAPLAX_STOP_BOUND_S"
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The exit status of a process that stops because another process of its
#: multi-process run ended without it (Guard.peer_lost).
PEER_LOST_EXIT = 1
_CHECKPOINTS = "checkpoints"  # laplax.workdir.files.CHECKPOINT_DIR (not imported: no JAX here)
_INCOMPLETE = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")
_COMMITTED = "commit_success.txt"  # orbax's commit file of a gs:// step (laplax.workdir.checkpoint)

_cleanups: dict[int, Callable[[], None]] = {}
_critical = threading.RLock()
_current: Guard | None = None


class Signalled(KeyboardInterrupt):
  """SIGINT or SIGTERM outside the training loop; ``signum`` says which."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = int(signum)


def exit_code(signum: int) -> int:
  """The exit status a shell reports for a process ``signum`` ended: 128 +
  the signal number (130 for SIGINT, 143 for SIGTERM)."""
  return 128 + int(signum)


def describe_signal(signum: int) -> str:
  """``"SIGTERM (signal 15)"``."""
  return f"{signal.Signals(signum).name} (signal {int(signum)})"


def at_exit(fn: Callable[[], None]) -> Callable[[], None]:
  """Registers ``fn`` to run (once, in reverse order of registration) at a
  hard exit; returns the function that unregisters it."""
  key = id(fn) ^ time.monotonic_ns()
  _cleanups[key] = fn
  return lambda: _cleanups.pop(key, None)


@contextlib.contextmanager
def critical() -> Iterator[None]:
  """A block that a hard exit waits for (e.g. a rename that completes a
  write); keep it short."""
  with _critical:
    yield


def bound_from_env() -> float:
  """:data:`BOUND_S`, or the seconds that ``$LAPLAX_STOP_BOUND_S`` gives.

  Raises:
    ValueError: the variable is set but not a positive finite number (one line).
  """
  text = os.environ.get(BOUND_ENV)
  if text is None:
    return BOUND_S
  try:
    value = float(text)
  except ValueError:
    value = float("nan")
  if not (value > 0 and value < float("inf")):
    raise ValueError(
      f"{BOUND_ENV}={text!r} must be a positive number of seconds "
      f"(default {BOUND_S:g}); unset it or give e.g. {BOUND_ENV}=30"
    )
  return value


def current() -> Guard | None:
  """The installed guard, or ``None``."""
  return _current


def checkpoint_status(workdir: str) -> str:
  """What ``workdir/checkpoints`` holds, as a phrase for the exit line.

  In an object store (``gs://``) a step directory is complete once orbax has
  written its ``commit_success.txt`` (there is no rename); one without it is
  an unfinished write, as orbax's temporary directories are on a local disk.
  """
  directory = os.path.join(workdir, _CHECKPOINTS)
  try:
    from laplax import store

    names = store.listdir(directory)
    uncommitted = [  # gs://: a step directory without its commit file is unfinished
      int(n)
      for n in names
      if store.is_remote(directory)
      and n.isdigit()
      and not store.exists(store.join(directory, n, _COMMITTED))
    ]
  except Exception:  # an unreachable store: the line says nothing of it
    names, uncommitted = [], []
  steps = [int(n) for n in names if n.isdigit() and int(n) not in uncommitted]
  partial = sorted(
    [int(m.group(1)) for n in names for m in [_INCOMPLETE.match(n)] if m] + uncommitted
  )
  text = (
    f"last complete checkpoint: step {max(steps)} in {directory}, later steps not saved"
    if steps
    else f"no checkpoint saved in {workdir}"
  )
  if partial:
    text += f"; the unfinished write of step {partial[-1]} is ignored and removed at the next start"
  return text


class Guard:
  """SIGINT/SIGTERM handling that works while the main thread is in a C call.

  Args:
    command: the command's name for the exit line (``train.py``).
    bound: :data:`BOUND_S`.

  Attributes:
    signum: the first signal received (``None`` before one).
    workdir: set it (``train.py``) to name the last complete checkpoint in
      the exit line.
    nothing_saved: the exit line's phrase without a workdir.
    step_seconds: the longest time per step the training loop has measured
      (a logged interval's wall time over its steps); in the loop the first
      signal waits ``max(bound, 2 * step_seconds)``, so that a run whose
      steps are slow still stops with a checkpoint.

  Use as a context manager (it installs the handlers and the watcher thread
  and restores what was there before; in another thread than the main one,
  which cannot set signal handlers, it does nothing).
  """

  def __init__(self, command: str, bound: float = BOUND_S):
    self.command = command
    self.bound = float(bound)
    self.signum: int | None = None
    self.workdir: str | None = None
    self.nothing_saved = "nothing more was saved"
    self.step_seconds = 0.0
    self._armed = self.bound
    self._count = 0
    self._in_loop = False
    self._raised = False
    self._interruptible = False
    self._evaluating = False
    self._collective = False
    self._forward: Callable[[int], None] | None = None
    self._own_c_handler: int | None = None
    self._deadline: float | None = None
    self._closing = False
    self._exit_lock = threading.Lock()
    self._old_handlers: dict = {}
    self._old_wakeup = -1
    self._thread: threading.Thread | None = None
    self._rsock = self._wsock = None
    self._active = False
    self._previous: Guard | None = None

  def __enter__(self) -> Guard:
    global _current
    self._active = threading.current_thread() is threading.main_thread()
    if not self._active:  # signal handlers can only be set from the main thread
      return self
    self._rsock, self._wsock = socket.socketpair()
    self._rsock.setblocking(False)
    self._wsock.setblocking(False)
    for s in SIGNALS:
      self._old_handlers[s] = signal.signal(s, self._handle)
    self._own_c_handler = _sigaction_handler(signal.SIGTERM)
    self._old_wakeup = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
    self._thread = threading.Thread(target=self._watch, name="laplax-signals", daemon=True)
    self._thread.start()
    self._previous, _current = _current, self
    return self

  def __exit__(self, *exc) -> None:
    global _current
    if not self._active:
      return
    signal.set_wakeup_fd(self._old_wakeup)
    for s, h in self._old_handlers.items():
      signal.signal(s, h)
    self._closing = True
    with contextlib.suppress(OSError):
      self._wsock.send(b"\0")
    self._thread.join(timeout=1.0)
    self._rsock.close()
    self._wsock.close()
    _current = self._previous

  # -- the main thread's side ------------------------------------------------

  def _handle(self, signum, frame):
    """The Python-level handler (main thread): outside the loop the first
    signal raises :class:`Signalled`; the watcher counts and times."""
    if self.signum is None:
      self.signum = int(signum)
    if self._interruptible:
      self._interruptible = False
      raise Signalled(signum)
    if not self._in_loop and not self._raised:
      self._raised = True
      raise Signalled(signum)

  @contextlib.contextmanager
  def graceful(self, collective: bool = False) -> Iterator[Guard]:
    """The training loop: a first signal only sets :attr:`signum`; the loop
    saves and stops after the step in flight (and calls :meth:`reached`).

    ``collective``: several processes train together (``jax.distributed``).
    Their stop is agreed by JAX's preemption sync point, which
    ``jax.distributed.initialize`` (after ``__enter__``) arms by installing its
    preemption notifier's own C-level SIGTERM handler: the guard takes both
    signals back (so that the bound and a second signal still work) and hands
    the first one on to that handler (:func:`_c_signal_handler`), as if the
    notifier had received the SIGTERM itself. Where no such handler is found
    (``jax.distributed`` not initialised, or not on Linux), no stop can be
    agreed: one warning line says so, and a signal ends the run by the bound.
    """
    self._in_loop = True
    self._collective = bool(collective)
    if self._active:
      if collective:
        self._forward = _c_signal_handler(signal.SIGTERM, self._own_c_handler)
        if self._forward is None:
          _write(
            "warning: JAX's preemption notifier has no SIGTERM handler here, so the "
            "processes cannot agree on a stop: a signal ends this run by the bound "
            f"({self.bound:g} s) at the last complete checkpoint"
          )
      for s in SIGNALS:
        signal.signal(s, self._handle)
    try:
      yield self
    finally:
      self._in_loop = False

  def evaluate(self, fn: Callable[[], T]) -> T | None:
    """``fn()`` (an evaluation inside the training loop), or ``None`` if a
    signal came before or during it.

    One process: a signal ends ``fn`` at once (:class:`Signalled` raised in
    it, caught here); the loop then saves the step it evaluated and stops.
    Several processes (``graceful(collective=True)``): ``fn`` holds collective
    operations that every process must finish, so it runs to its end, and the
    bound's deadline does not run out while it does (it starts again when
    ``fn`` returns).
    """
    if self._collective:
      self._evaluating = True
      try:
        return fn()
      finally:
        self._evaluating = False
        self.progress()
    if self.signum is not None:
      return None
    try:
      self._interruptible = True
      try:
        return fn()
      finally:
        self._interruptible = False
    except Signalled:
      return None

  def progress(self) -> None:
    """The loop goes on towards a stop that several processes must agree on
    (JAX's preemption sync point): the deadline starts again from now; not
    when the signal could not be handed on to JAX (nothing would ever stop
    the loop then but the bound)."""
    if self._deadline is not None and not (self._collective and self._forward is None):
      self._deadline = time.monotonic() + self._armed

  def reached(self) -> None:
    """The step in flight has finished after a stop request: the deadline is
    lifted (the checkpoint is saved next; a second signal still ends it)."""
    self._deadline = None

  # -- the watcher thread ----------------------------------------------------

  def _watch(self) -> None:
    while not self._closing:
      deadline = self._deadline
      timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
      try:
        ready, _, _ = select.select([self._rsock], [], [], timeout)
      except (OSError, ValueError):
        return
      if self._closing:
        return
      if not ready:
        if self._deadline is not None and time.monotonic() >= self._deadline:
          if self._evaluating:  # a collective evaluation: wait for its end
            self._deadline = time.monotonic() + self._armed
            continue
          self.hard_exit(self.signum or signal.SIGTERM, late=True)
        continue
      try:
        data = self._rsock.recv(64)
      except BlockingIOError:
        continue
      except OSError:
        return
      for signum in data:
        if signum in SIGNALS:
          self._on_signal(signum)

  def _on_signal(self, signum: int) -> None:
    self._count += 1
    if self.signum is None:
      self.signum = signum
    if self._count > 1:
      self.hard_exit(signum, late=False)
      return
    self._armed = max(self.bound, 2 * self.step_seconds) if self._in_loop else self.bound
    self._deadline = time.monotonic() + self._armed
    if self._in_loop and self._forward is not None:
      self._forward(signal.SIGTERM)  # to JAX's preemption notifier: all processes stop
    if self._in_loop:
      _write(
        f"{describe_signal(signum)}: stopping after the step in flight, with a "
        f"checkpoint (if that step has not finished in {self._armed:.3g} s, or at "
        f"a second signal, the run ends at once)"
      )

  def hard_exit(self, signum: int, late: bool, reason: str | None = None) -> None:
    """Runs the clean-ups, prints the exit line and ends the process with
    :func:`exit_code` ``(signum)``; never returns (a second caller waits)."""

    def line(saved: str) -> str:
      why = reason
      if why is None:
        if late:
          why = (
            f"no step ended within {self._armed:.3g} s"
            if self._in_loop
            else f"{self.command} was still busy {self._armed:.3g} s later"
          )
        else:
          why = "a second signal"
      return f"stopped by {describe_signal(signum)}, {why}: {saved}; run the same command to go on"

    self._exit(line, exit_code(signum))

  def peer_lost(self, what: str) -> None:
    """Another process of the run ended without stopping with this one
    (``what`` names it; :class:`laplax.train.preemption.Peers`): the
    clean-ups, one line, exit :data:`PEER_LOST_EXIT`; never returns."""
    self._exit(
      lambda saved: f"stopped: {what}: {saved}; run the same command on every process to go on",
      PEER_LOST_EXIT,
    )

  def _exit(self, line: Callable[[str], str], code: int) -> None:
    if not self._exit_lock.acquire(blocking=False):
      while True:  # another thread is exiting
        time.sleep(1.0)
    with _critical:
      for key in reversed(list(_cleanups)):
        fn = _cleanups.pop(key, None)
        with contextlib.suppress(Exception):
          fn()
      saved = checkpoint_status(self.workdir) if self.workdir else self.nothing_saved
      _flush_python_streams()
      _write(line(saved))
      os._exit(code)


class _Sigaction(ctypes.Structure):
  """glibc's ``struct sigaction`` on Linux (x86-64, AArch64): the handler
  first, then the 1024-bit mask, the flags and the restorer."""

  _fields_ = [
    ("sa_handler", ctypes.c_void_p),
    ("sa_mask", ctypes.c_ulong * 16),
    ("sa_flags", ctypes.c_int),
    ("sa_restorer", ctypes.c_void_p),
  ]


def _sigaction_handler(signum: int) -> int | None:
  """The address of the C handler installed for ``signum`` (0: SIG_DFL, 1:
  SIG_IGN), from ``sigaction(2)``; ``None`` off Linux or when it takes
  ``siginfo`` (``SA_SIGINFO``) or cannot be read."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    old = _Sigaction()
    if libc.sigaction(int(signum), None, ctypes.byref(old)) != 0:
      return None
  except (OSError, AttributeError):
    return None
  if old.sa_flags & 4:  # SA_SIGINFO: a three-argument handler
    return None
  return int(old.sa_handler or 0)


def _c_signal_handler(signum: int, own: int | None) -> Callable[[int], None] | None:
  """The C function native code (JAX's preemption notifier) installed for
  ``signum`` after the guard's own (``own``, the address of Python's C-level
  handler), as a callable; ``None`` when it is the default, ignored or
  Python's own, or cannot be read (not Linux/glibc).

  Python does not see such a handler (:func:`signal.getsignal` still names
  the guard's) and cannot call it; ``sigaction(2)`` reads its address.
  Calling it from the watcher thread does what the signal would have done:
  the notifier's handler only sets a flag that its own thread polls.
  """
  address = _sigaction_handler(signum)
  if address in (None, 0, 1) or address == own:
    return None
  fn = ctypes.CFUNCTYPE(None, ctypes.c_int)(address)
  return lambda s: fn(int(s))


def _write(line: str) -> None:
  """``line`` on stderr with one system call (no Python-level stream lock)."""
  with contextlib.suppress(OSError):
    os.write(2, ("\n" + line + "\n").encode())


def _flush_python_streams(timeout: float = 0.5) -> None:
  """Flushes ``sys.stdout``/``sys.stderr`` from a helper thread, waiting at most
  ``timeout`` seconds (a stream blocked on a full pipe must not stop the exit)."""

  def flush():
    for stream in (sys.stdout, sys.stderr):
      with contextlib.suppress(Exception):
        stream.flush()

  t = threading.Thread(target=flush, daemon=True)
  t.start()
  t.join(timeout)


@contextlib.contextmanager
def graceful(collective: bool = False) -> Iterator[Guard]:
  """:meth:`Guard.graceful` of the installed guard; without one (the loop
  called from Python, not a CLI) a guard is installed for the loop."""
  if _current is not None:
    with _current.graceful(collective) as guard:
      yield guard
    return
  with Guard("train_and_evaluate", bound_from_env()) as guard, guard.graceful(collective):
    yield guard
