"""One writer per workdir: the lock ``train.py`` holds on its workdir.

The lock is the file ``WORKDIR/train.lock``, JSON ``{"host", "pid",
"started", "proc_start", "token"}``: the host name, the process id, the start
time (Unix seconds and ISO text) and, on Linux, the process's start time in
clock ticks since boot (field 22 of ``/proc/PID/stat``), so that a PID the
kernel has given to another process since is not mistaken for the owner.
It is created atomically (a temporary file, then ``os.link``, which fails if
the lock exists) and removed when the run ends, on every exit path that
Python sees (a normal end, an error, SIGTERM/SIGINT, also the immediate exit
of :mod:`laplax.signals`); a SIGKILL or a crash of the machine leaves
it behind.

A lock left behind by a process that no longer runs on this host is taken
over with a warning (a killed run restarted with the same command, e.g. by
``python -m laplax.sweep``). A lock of a live process, or of another host
(whose processes this one cannot see), refuses the run in one line; the
latter is taken over with ``train.py --force_unlock``. The takeover is done
under ``flock`` of the workdir directory, so two starts never both take a
stale lock. Readers (``eval.py``, ``laplax.load``) never take the lock.

In an object store (``gs://``) the lock is an object with a lease, taken by a
create-if-absent upload and renewed by a heartbeat (:mod:`laplax.workdir.lease`):
a lock of another host whose lease has run out is taken over too.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator

from laplax import store
from laplax.errors import UserError
from laplax.workdir import lease, saving

LOCK_FILE = "train.lock"


class LockError(UserError, ValueError):
  """The workdir is locked by another run; the message is one line with the fix."""


def _proc_start(pid: int) -> int | None:
  """Start time of process ``pid`` in clock ticks since boot (Linux), or
  ``None`` (no ``/proc``, or no such process)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      stat = f.read()
  except OSError:
    return None
  # The command name (field 2) may hold spaces and parentheses: split after it.
  fields = stat[stat.rfind(")") + 2 :].split()
  if fields and fields[0] in ("Z", "X"):  # a zombie has finished
    return None
  try:
    return int(fields[19])
  except (IndexError, ValueError):
    return None


def _alive(pid: int, proc_start: int | None) -> bool:
  """Whether process ``pid`` of this host runs and is the one that started
  at ``proc_start`` (when both that and ``/proc`` are known)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # it exists, under another user
  except (OverflowError, ValueError):
    return False
  if os.path.isdir("/proc/self"):
    now = _proc_start(pid)
    if now is None:
      return False
    if proc_start is not None and now != proc_start:
      return False  # the PID was reused
  return True


def read(workdir: str) -> dict | None:
  """The lock record of ``workdir`` (``{}`` if the file is not a lock
  record), or ``None`` if there is none."""
  if store.is_remote(workdir):
    return lease.read(store.join(workdir, LOCK_FILE))[0]
  try:
    with open(os.path.join(workdir, LOCK_FILE)) as f:
      record = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


def _describe(record: dict) -> str:
  started = record.get("started_iso", "an unknown time")
  return f"process {record.get('pid', '?')} on host {record.get('host', '?')} (since {started})"


def _held_by_other(workdir: str, record: dict | None, force: bool) -> str | None:
  """Why ``record`` (a lock read from ``workdir``) refuses this start, or
  ``None`` when there is none or it may be taken over."""
  if record is None or not record:
    return None
  path = os.path.join(workdir, LOCK_FILE)
  if store.is_remote(workdir):
    return _remote_held(workdir, record, force)
  if record.get("host") != socket.gethostname():
    if force:
      return None
    return (
      f"workdir {workdir} is locked by train.py {_describe(record)}, another "
      f"host, whose processes this one cannot see; if that run has ended, run "
      f"the same command with --force_unlock (or remove {path})"
    )
  pid = record.get("pid")
  if isinstance(pid, int) and _alive(pid, record.get("proc_start")):
    return (
      f"workdir {workdir} is in use by train.py {_describe(record)}; wait for it "
      f"to finish, stop it (kill {pid}: it saves and exits), or use another "
      f"--workdir"
    )
  return None


def _remote_held(workdir: str, record: dict, force: bool) -> str | None:
  """:func:`_held_by_other` in an object store: a live lease refuses (unless
  ``force``), except one of a process of this host that no longer runs."""
  pid = record.get("pid")
  if record.get("host") == socket.gethostname() and isinstance(pid, int):
    if not _alive(pid, record.get("proc_start")):
      return None
  if force or lease.expired(record):
    return None
  left = record.get("renewed", 0) + record.get("lease_s", lease.DEFAULT_LEASE_S) - time.time()
  return (
    f"workdir {workdir} is locked by train.py {_describe(record)}, whose lease "
    f"runs {left:.0f} s more; wait for it to finish, or, if that run has ended, run "
    f"the same command after the lease or with --force_unlock"
  )


def check(workdir: str, force: bool = False) -> None:
  """Refuses, before anything is read or written, a workdir locked by a live
  run (or by another host, without ``force``). Writes nothing.

  Raises:
    LockError: the lock is held (the message names the host and PID).
  """
  if store.is_remote(workdir) or os.path.isdir(workdir):
    why = _held_by_other(workdir, read(workdir), force)
    if why:
      raise LockError(why)


def _record() -> dict:
  now = time.time()
  return {
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "started": now,
    "started_iso": datetime.datetime.fromtimestamp(now).isoformat(timespec="seconds"),
    "proc_start": _proc_start(os.getpid()),
    "token": uuid.uuid4().hex,
  }


@contextlib.contextmanager
def _directory_flock(workdir: str):
  """An exclusive ``flock`` of the directory ``workdir`` (serialises takeovers)."""
  fd = os.open(workdir, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # releases the flock


class WorkdirLock:
  """The lock of ``workdir`` held by this process; a context manager.

  Args:
    workdir: the run's directory (must exist).
    force: take over a lock of another host (``--force_unlock``).

  Raises (on enter):
    LockError: a live process holds the lock, or another host without ``force``.
    OSError: the lock file cannot be written.
  """

  def __init__(self, workdir: str, force: bool = False):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_FILE)
    self.force = force
    self.record = None
    self._unregister = lambda: None

  def __enter__(self) -> WorkdirLock:
    if store.is_remote(self.workdir):
      return self._enter_remote()
    record = _record()
    tmp = f"{self.path}.tmp{os.getpid()}"
    try:
      with open(tmp, "w") as f:
        json.dump(record, f)
      try:
        os.link(tmp, self.path)  # atomic: fails if the lock exists
      except FileExistsError:
        self._take_over(tmp)
    finally:
      with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    self.record = record
    from laplax import signals

    self._unregister = signals.at_exit(self.release)  # also at a signal's hard exit
    return self

  def _enter_remote(self) -> WorkdirLock:
    """Takes the lock object (create-if-absent, or a generation-checked
    takeover of a stale one) and starts its heartbeat."""
    record = {**_record(), "lease_s": lease.lease_s()}
    record["renewed"] = record["started"]
    old, gen = lease.read(self.path)
    why = _held_by_other(self.workdir, old, self.force)
    if why:
      raise LockError(why)
    new = store.replace(self.path, json.dumps(record), gen or 0)
    if new is None or (lease.read(self.path)[0] or {}).get("token") != record["token"]:
      raise LockError(
        _held_by_other(self.workdir, read(self.workdir), self.force)
        or f"workdir {self.workdir} was locked meanwhile by another train.py; "
        f"run the same command again"
      )
    if old is not None:
      _warn_taken_over(self.workdir, old)
    self.record = record
    self._heartbeat = lease.Heartbeat(self.path, record, new)
    from laplax import signals

    self._unregister = signals.at_exit(self.release)
    return self

  def _take_over(self, tmp: str) -> None:
    """Replaces a stale lock by ``tmp`` under the directory's flock.

    Raises:
      LockError: the lock is held by a live process (or another host).
    """
    with _directory_flock(self.workdir):
      old = read(self.workdir)
      why = _held_by_other(self.workdir, old, self.force)
      if why:
        raise LockError(why)
      if old is None:  # released meanwhile
        try:
          os.link(tmp, self.path)
        except FileExistsError:  # and taken by a start that did not need the flock
          raise LockError(
            _held_by_other(self.workdir, read(self.workdir), self.force)
            or f"workdir {self.workdir} was locked meanwhile by another "
            f"train.py; run the same command again"
          ) from None
        return
      os.replace(tmp, self.path)
    _warn_taken_over(self.workdir, old)

  def __exit__(self, *exc) -> None:
    self.release()

  def release(self) -> None:
    """Removes the lock file if it is still this process's."""
    if self.record is None:
      return
    self._unregister()
    if store.is_remote(self.workdir):
      gen = self._heartbeat.stop()
      current, now = lease.read(self.path)
      if current and current.get("token") == self.record["token"] and now == gen:
        store.remove(self.path)
      self.record = None
      return
    current = read(self.workdir)
    if current and current.get("token") == self.record["token"]:
      with contextlib.suppress(FileNotFoundError):
        os.remove(self.path)
    self.record = None


def _warn_taken_over(workdir: str, old: dict) -> None:
  """The warning of a lock taken over: unreadable, another host's, or a dead run's."""
  if not old:
    logging.warning("workdir %s had an unreadable lock file; taking the lock over", workdir)
  elif old.get("host") != socket.gethostname():
    why = (
      "whose lease ran out"
      if store.is_remote(workdir) and lease.expired(old)
      else "(--force_unlock)"
    )
    logging.warning(
      "workdir %s was locked by train.py %s, another host; taking the lock over %s",
      workdir,
      _describe(old),
      why,
    )
  else:
    logging.warning(
      "workdir %s was locked by train.py %s, which is no longer running "
      "(killed?); taking the lock over",
      workdir,
      _describe(old),
    )


def _last_checkpoint(workdir: str) -> int | None:
  """The newest complete checkpoint step in ``workdir/checkpoints``, or ``None``."""
  directory = os.path.join(workdir, "checkpoints")
  return max((int(n) for n in store.listdir(directory) if n.isdigit()), default=None)


@contextlib.contextmanager
def hold(workdir: str, force: bool = False) -> Iterator[None]:
  """Process 0 creates ``workdir`` and holds its :class:`WorkdirLock` inside
  the ``with``; with several processes all of them learn whether it could
  (one broadcast) and raise together.

  Raises:
    LockError: another run holds the lock.
    ConfigError: the workdir cannot be created.
    SaveError: the lock file cannot be written (a full disk).
  """
  import jax

  from laplax.config.validation import ConfigError

  lock, error = None, None
  if jax.process_index() == 0:
    try:
      if not store.is_remote(workdir):  # an object store has no directories
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
      error = ConfigError(
        f"--workdir {workdir} cannot be created ({e.strerror}); choose another directory"
      )
    else:
      try:
        with saving.guard(f"the lock file {LOCK_FILE}", workdir, lambda: _last_checkpoint(workdir)):
          lock = WorkdirLock(workdir, force).__enter__()
      except (LockError, saving.SaveError, store.StoreError) as e:
        error = e
  if jax.process_count() > 1:
    import numpy as np
    from jax.experimental import multihost_utils

    ok = bool(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if not ok and error is None:
      error = LockError(
        f"process 0 could not take the lock of workdir {workdir}; its output says why"
      )
  if error is not None:
    raise error
  try:
    yield
  finally:
    if lock is not None:
      lock.release()


def check_single_process(config, workdir: str, force: bool = False) -> None:
  """:func:`check` at the very start of ``train.py`` (before JAX and the data
  are imported), when the run is surely one process: no
  ``config.distributed.enabled`` / ``coordinator_address`` and no
  ``JAX_COORDINATOR_ADDRESS`` (what :func:`laplax.sharding.initialize_distributed`
  reads); with several processes only process 0 checks, once it knows it is.

  Raises:
    LockError: the workdir is locked by another run.
  """
  dist = config.distributed
  if not (dist.coordinator_address or dist.enabled or os.environ.get("JAX_COORDINATOR_ADDRESS")):
    check(workdir, force)
