"""Runs one generated Python program in a sandbox, as the HumanEval evaluator does.

    python -m laplax.sandbox FILE [--timeout S] [--memory-mb M]

prints one JSON line, ``{"passed": bool, "status": str, "seconds": float,
"isolation": {...}}``, and exits with 0 when the program passed, 1 when it did
not, 2 on bad input (a missing or unreadable FILE, a bad flag: one line on
standard error). :func:`run_program` is the same from Python;
:mod:`laplax.evaluators.humaneval` calls it for every completion.

A program *passes* when it runs to its end without raising (nanochat's and
HumanEval's rule: the assembled program ends with ``check(entry_point)``,
whose asserts raise on a wrong answer). It is run like nanochat's
``execute_code`` (``nanochat/execution.py``, itself from OpenAI's
``human_eval/execution.py``):

- in its own process: a fresh ``python -I`` interpreter (no user site, no
  ``PYTHON*`` variables, no working directory on ``sys.path``), with a
  minimal environment, never a fork of the caller (a fork of a process
  running JAX threads is unsafe); ``exec(program, {})`` as nanochat does, so
  ``__name__`` is not ``"__main__"``;
- in a fresh temporary directory as its working directory (also ``HOME``
  and ``TMPDIR``), deleted afterwards;
- with a time limit: ``timeout`` seconds (nanochat: 5) of an interval timer
  raise ``TimeoutError``-like ``SandboxTimeout`` in the program; a program
  still alive 1 s later is killed (nanochat: ``join(timeout + 1)``). The
  limit counts from the moment the interpreter is ready, not from its start;
- with memory limits: ``RLIMIT_AS``, ``RLIMIT_DATA`` and ``RLIMIT_STACK`` of
  ``memory_mb`` (nanochat: 256 MB), no core files, files of at most 64 MiB;
- without standard input (``/dev/null``, and ``sys.stdin`` raises on read as
  in nanochat); its standard output and error are discarded;
- with the destructive calls of nanochat's ``reliability_guard`` disabled
  (``os.kill``, ``os.system``, ``os.fork``, ``os.remove``, ``os.chdir``,
  ``shutil.rmtree``, ``subprocess.Popen``, ...), and more: the ``exec*`` and
  ``spawn*`` families, ``posix_spawn``, ``os.popen``, ``setsid``, the same
  names of the ``posix`` module, and ``socket.socket``. A disabled call
  raises ``SandboxRefused`` (a ``TypeError``, as calling nanochat's ``None``
  does, so a program's ``except`` clauses see what they saw there). Opening
  a file for writing, making a directory, link, FIFO or node, or touching a
  file, anywhere but inside the temporary directory raises
  ``PermissionError``.

Where the kernel allows it (root, or unprivileged user namespaces) the
program also gets:

- a new network namespace: no interface but a loopback that is down, so no
  connection leaves it, loopback ports of the machine included;
- a new PID namespace whose first process is the program: when it ends or is
  killed, the kernel kills every process it started (fork bombs included);
- when the caller is root, the ``nobody`` user (uid 65534) with no groups:
  the kernel refuses writes outside the temporary directory and world-writable
  directories, signals to other users' processes, and more than 64 processes
  (``RLIMIT_NPROC``).

``isolation`` in the result says which of these held. Where none does (a
non-root user without user namespaces) the guard above, the process group
killed as a whole after every run, and an ``RLIMIT_NPROC`` of 64 processes
above the user's current count are what is left: code that calls the C
library through ``ctypes`` can then reach the network, write where the user
may write and signal the user's processes. Like nanochat's, this is a guard
against accidents of generated code, not a security boundary against an
adversary (a program can, for instance, write a forged result line to the
pipe that reports to the caller).

This module uses only the standard library: the sandboxed interpreter runs
this file as a script (``--sandbox-child``) without importing laplax.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

USAGE_EXIT = 2
TIMEOUT_S = 5.0  # nanochat's execute_code default
KILL_AFTER_S = 1.0  # killed this long after the time limit (nanochat: join(timeout + 1))
MEMORY_MB = 256  # RLIMIT_AS, RLIMIT_DATA and RLIMIT_STACK (nanochat: 256 MB)
FILE_SIZE_MB = 64  # RLIMIT_FSIZE: no file the program writes grows past this
NPROC = 64  # processes the program may add (RLIMIT_NPROC)
NOBODY = 65534  # the uid and gid a root caller's program runs as
STARTUP_S = 60.0  # longest wait for the interpreter to be ready (a loaded machine)
MAX_REPORT_BYTES = 1 << 20  # more on the result pipe than this: the run failed
CHILD_FLAG = "--sandbox-child"
# The interpreter of the sandboxed program (tests point it at another one).
PYTHON = sys.executable
# Whether to try the network and PID namespaces (tests turn them off to see
# what a machine without them gets).
NAMESPACES = True
_CLONE_NEWNET, _CLONE_NEWPID, _CLONE_NEWUSER = 0x40000000, 0x20000000, 0x10000000
# Names disabled by nanochat's reliability_guard (os, shutil, subprocess) ...
_NANOCHAT_OS = (
    "kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
    "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink",
    "fchmod", "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown",
    "getcwd", "chdir")
_NANOCHAT_SHUTIL = ("rmtree", "move", "chown")
_NANOCHAT_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")
# ... and what laplax adds: every other way to start a program or leave the
# process group, and the Python-level socket.
_MORE_OS = (
    "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
    "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
    "spawnvpe", "posix_spawn", "posix_spawnp", "popen", "setsid", "setpgid",
    "setpgrp", "setreuid", "setresuid", "setgid", "setregid", "setresgid",
    "pidfd_open", "lchmod")
# Calls that create or modify a path: refused outside the temporary directory.
_PATH_WRITERS = ("mkdir", "symlink", "link", "mkfifo", "mknod", "utime")
_OPEN_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxError(ValueError):
  """Bad arguments to the sandbox (a time limit or memory limit that is not
  positive, an unreadable program file); the message is one line."""


class SandboxRefused(TypeError):
  """A call the sandbox disables (a ``TypeError``, like calling the ``None``
  that nanochat's ``reliability_guard`` leaves in its place)."""


class SandboxTimeout(Exception):
  """Raised in the program when its time limit passes (nanochat's
  ``TimeoutException``: an ``Exception``, so ``except Exception`` catches it
  and the kill 1 s later is what stops such a program)."""


@dataclasses.dataclass(frozen=True)
class Result:
  """The outcome of one sandboxed run.

  Attributes:
    passed: the program ran to its end without raising.
    status: ``"passed"``; ``"timeout"`` (the time limit raised in the
      program); ``"killed: time limit + 1 s"``; ``"memory"`` (``MemoryError``);
      ``"error: TYPE: MESSAGE"`` (an exception, message cut at 300
      characters); ``"crashed: ..."`` (the process ended without a result:
      a signal, ``os._exit``, a closed result pipe); ``"sandbox: ..."`` (the
      sandbox itself could not start the program).
    seconds: wall-clock seconds from the interpreter being ready to the end.
    isolation: what held, e.g. ``{"network": "namespace", "processes":
      "pid namespace", "user": "nobody", "guard": "on"}``; a value that says
      ``none (...)`` names what was not available and why.
  """
  passed: bool
  status: str
  seconds: float
  isolation: dict

  def to_json(self) -> str:
    """The one JSON line the command prints."""
    return json.dumps(dataclasses.asdict(self), sort_keys=False)


def run_program(source: str, timeout: float = TIMEOUT_S,
                memory_mb: int = MEMORY_MB) -> Result:
  """Runs ``source`` (a whole Python program) in the sandbox and waits for it.

  Args:
    source: the program text (``str``).
    timeout: seconds the program may run (> 0); it is killed ``1 s`` later.
    memory_mb: the address-space, data and stack limit in MiB (> 0).

  Returns:
    A :class:`Result`. Whatever the program does, this returns (within about
    ``timeout + 1`` seconds once the interpreter is ready); nothing is raised
    for a failing program.

  Raises:
    SandboxError: ``timeout`` or ``memory_mb`` not positive.
  """
  if not isinstance(timeout, (int, float)) or not timeout > 0:
    raise SandboxError(f"the time limit must be a positive number of seconds, "
                       f"got {timeout!r}")
  if not isinstance(memory_mb, int) or memory_mb <= 0:
    raise SandboxError(f"the memory limit must be a positive number of MiB, "
                       f"got {memory_mb!r}")
  base = tempfile.mkdtemp(prefix="laplax-sandbox-")
  try:
    os.chmod(base, 0o711)  # the program's user may enter, not list or write
    program = os.path.join(base, "program.py")
    with open(program, "w", encoding="utf-8") as f:
      f.write(source)
    os.chmod(program, 0o644)
    work = os.path.join(base, "work")
    os.mkdir(work, 0o700)
    if os.geteuid() == 0:
      os.chown(work, NOBODY, NOBODY)
    return _run(program, work, float(timeout), memory_mb)
  finally:
    shutil.rmtree(base, ignore_errors=True)


def _run(program: str, work: str, timeout: float, memory_mb: int) -> Result:
  """Starts the sandboxed interpreter on ``program`` in ``work`` and watches it."""
  read_end, write_end = os.pipe()
  settings = {"program": program, "work": work, "fd": write_end, "timeout": timeout,
              "memory": memory_mb << 20, "namespaces": NAMESPACES}
  env = {"PATH": os.defpath, "HOME": work, "TMPDIR": work, "LC_ALL": "C.UTF-8",
         "OMP_NUM_THREADS": "1"}
  start = time.monotonic()
  try:
    proc = subprocess.Popen(
        [PYTHON, "-I", os.path.abspath(__file__), CHILD_FLAG,
         json.dumps(settings)], cwd=work, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_end,),
        start_new_session=True)
  except OSError as e:
    os.close(read_end)
    return Result(False, f"sandbox: cannot start {PYTHON} ({e})", 0.0, {})
  finally:
    os.close(write_end)
  try:
    messages, ready_at, killed = _watch(proc, read_end, timeout)
  finally:
    _kill_group(proc)
    os.close(read_end)
  seconds = round(time.monotonic() - (ready_at or start), 3)
  ready = next((m for m in messages if "isolation" in m), None)
  isolation = ready["isolation"] if ready else {}
  status = next((m["status"] for m in messages if isinstance(m.get("status"), str)), None)
  if killed:
    status = (f"killed: time limit + {KILL_AFTER_S:g} s" if ready else
              f"sandbox: the interpreter was not ready within {STARTUP_S:g} s")
  elif status is None:
    status = "crashed: " + _describe_exit(proc.returncode, messages)
  return Result(status == "passed", status, seconds, isolation)


def _watch(proc: subprocess.Popen, fd: int, timeout: float):
  """Reads the child's JSON lines until it exits or its deadline passes.

  Returns ``(messages, ready_at, killed)``: the parsed lines (``dict``), the
  monotonic time the interpreter reported ready (``None`` if it never did),
  and whether the deadline passed with the child alive.
  """
  os.set_blocking(fd, False)
  data, messages, ready_at = b"", [], None
  deadline = time.monotonic() + STARTUP_S
  while True:
    now = time.monotonic()
    if now >= deadline:
      return messages, ready_at, True
    exited = proc.poll() is not None
    readable, _, _ = select.select([fd], [], [], 0 if exited else min(deadline - now, 0.05))
    eof = False
    if readable:
      try:
        chunk = os.read(fd, 65536)
      except BlockingIOError:
        chunk = b""
      eof = not chunk
      data += chunk
      if len(data) > MAX_REPORT_BYTES:  # a flood: not ours
        return [m for m in messages if "isolation" in m], ready_at, False
      *lines, data = data.split(b"\n")
      for line in lines:
        try:
          message = json.loads(line)
        except ValueError:
          continue
        if isinstance(message, dict):
          messages.append(message)
          if "isolation" in message and ready_at is None:
            ready_at = time.monotonic()
            deadline = ready_at + timeout + KILL_AFTER_S
    if exited and (eof or not readable):
      return messages, ready_at, False


def _kill_group(proc: subprocess.Popen) -> None:
  """Kills the child's process group (its session: everything it started that
  did not leave it) and reaps the child."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  proc.wait()


def _describe_exit(returncode: int | None, messages: list) -> str:
  """Why a child ended without a status: its (or, in a PID namespace, the
  program process's) signal or exit code."""
  exit_message = next((m for m in messages if "exit" in m), None)
  code = exit_message["exit"] if exit_message else returncode
  if isinstance(code, int) and code < 0:
    try:
      return f"killed by signal {signal.Signals(-code).name}"
    except ValueError:
      return f"killed by signal {-code}"
  return f"exit code {code} without a result"


# ---------------------------------------------------------------------------
# The sandboxed interpreter (runs as ``python -I sandbox.py --sandbox-child``).


def _unshare(flags: int) -> None:
  """``unshare(2)``: ``os.unshare`` on Python 3.12+, the C library before."""
  if hasattr(os, "unshare"):
    os.unshare(flags)
    return
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.unshare(ctypes.c_int(flags)) != 0:
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code))


def _namespaces(isolation: dict, allowed: bool) -> bool:
  """Enters new network and PID namespaces where the kernel allows (as root, or
  else in a new user namespace). Returns whether the PID namespace was made
  (the next fork is then its first process)."""
  attempts = [_CLONE_NEWNET | _CLONE_NEWPID] if allowed else []
  if allowed and os.geteuid() != 0:
    attempts.append(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID)
  error = "turned off"
  for flags in attempts:
    try:
      _unshare(flags)
    except (OSError, AttributeError) as e:
      error = f"unshare: {getattr(e, 'strerror', None) or e}"
      continue
    isolation["network"] = "namespace"
    isolation["processes"] = "pid namespace"
    return True
  isolation["network"] = f"none ({error})"
  isolation["processes"] = "process group"
  return False


def _program_user(isolation: dict) -> tuple[int | None, int | None]:
  """Who the program will run as: ``(uid to switch to or None, that user's
  thread count now)``, counted before any namespace hides other processes.

  Root switches to ``nobody`` when ``nobody`` can read the interpreter's
  installation (a program imports from it); the count is ``None`` for root,
  whom ``RLIMIT_NPROC`` never binds.
  """
  if os.geteuid() != 0:
    isolation["user"] = f"uid {os.getuid()} (not root: the caller's own user)"
    return None, _tasks_of(os.getuid())
  unreadable = _unreadable_by_others()
  if unreadable:
    isolation["user"] = f"root (nobody cannot read {unreadable})"
    return None, None
  return NOBODY, _tasks_of(NOBODY)


def _user_and_limits(isolation: dict, memory: int, uid: int | None,
                     tasks: int | None) -> None:
  """Switches to ``uid`` (no groups) if given, then sets the limits (memory,
  core files, file size, and ``RLIMIT_NPROC`` at ``tasks + NPROC``)."""
  import resource  # not at module level: the guard hides this module from the program
  if uid is not None:
    try:
      os.setgroups([])
      os.setgid(uid)
      os.setuid(uid)
      isolation["user"] = "nobody"
    except OSError as e:
      isolation["user"] = f"root (setuid: {e.strerror})"
      tasks = None
  for limit in (resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_STACK):
    resource.setrlimit(limit, (memory, memory))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_MB << 20, FILE_SIZE_MB << 20))
  if tasks is None:
    isolation["nproc"] = "none (root is exempt)"
    return
  nproc = NPROC + tasks
  _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
  if hard != resource.RLIM_INFINITY:
    nproc = min(nproc, hard)
  resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
  isolation["nproc"] = nproc


def _unreadable_by_others() -> str | None:
  """The first directory of this interpreter's installation (standard library,
  extension modules, site-packages) that another user cannot read, or None.

  A program run as ``nobody`` imports from these; an installation in a
  private home directory (``/root/.pyenv``) keeps the program root.
  """
  import sysconfig
  paths = sysconfig.get_paths()
  for key in ("stdlib", "platstdlib", "purelib", "platlib"):
    directory = paths.get(key)
    if not directory or not os.path.isdir(directory):
      continue
    parts = os.path.realpath(directory).split("/")
    for i in range(2, len(parts) + 1):
      path = "/".join(parts[:i])
      mode = os.stat(path).st_mode
      if not mode & 0o001 or (i == len(parts) and not mode & 0o004):
        return path
  return None


def _tasks_of(uid: int) -> int:
  """Threads the user ``uid`` runs now (what ``RLIMIT_NPROC`` counts)."""
  count = 0
  for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
    if entry.isdigit():
      try:
        if os.stat(f"/proc/{entry}").st_uid == uid:
          count += len(os.listdir(f"/proc/{entry}/task"))
      except OSError:
        continue
  return count


def _child_main(settings: dict) -> None:
  """The sandboxed interpreter: isolate, limit, guard, then run the program.

  Reports on ``settings["fd"]`` one JSON line when ready (``isolation``) and
  one with the ``status``; in a PID namespace the waiting first process adds
  ``{"exit": code}`` (negative: the signal) of the program process.
  """
  fd, isolation = settings["fd"], {}
  write = lambda message: os.write(fd, (json.dumps(message) + "\n").encode())
  with open(settings["program"], encoding="utf-8") as f:
    source = f.read()
  uid, tasks = _program_user(isolation)
  if _namespaces(isolation, settings["namespaces"]):
    pid = os.fork()  # the program process: pid 1 of the new namespace
    if pid:
      _, wait_status = os.waitpid(pid, 0)
      write({"exit": os.waitstatus_to_exitcode(wait_status)})
      os._exit(0)
  _user_and_limits(isolation, settings["memory"], uid, tasks)
  _guard(os.path.realpath(settings["work"]))
  exit_now, dumps = os._exit, json.dumps
  write({"isolation": isolation})
  status = _execute(source, settings["timeout"])
  try:
    os.write(fd, (dumps({"status": status}) + "\n").encode())
  finally:
    exit_now(0)  # no atexit handlers or finalizers of the program


def _execute(source: str, timeout: float) -> str:
  """``exec(source, {})`` under an interval timer; returns the status string."""
  def alarm(signum, frame):
    raise SandboxTimeout(f"the time limit of {timeout:g} s passed")
  set_timer, format_error = signal.setitimer, _one_line
  signal.signal(signal.SIGALRM, alarm)
  set_timer(signal.ITIMER_REAL, timeout)
  try:
    exec(compile(source, "program.py", "exec"), {})  # pylint: disable=exec-used
    status = "passed"
  except SandboxTimeout:
    status = "timeout"
  except MemoryError:
    status = "memory"
  except BaseException as e:  # pylint: disable=broad-except
    status = format_error(e)
  set_timer(signal.ITIMER_REAL, 0)
  return status


def _one_line(error: BaseException) -> str:
  """``"error: TYPE: MESSAGE"``, the message on one line, at most 300 characters."""
  try:
    message = " ".join(str(error).split())[:300]
  except BaseException:  # pylint: disable=broad-except
    message = "(unprintable)"
  return f"error: {type(error).__name__}: {message}".rstrip(": ")


class _NoInput:
  """``sys.stdin`` of the program: reading raises ``OSError`` (nanochat's
  ``WriteOnlyStringIO``)."""
  closed = False

  def readable(self):
    return False

  def _refuse(self, *args, **kwargs):
    raise OSError(errno.EBADF, "the sandbox has no standard input")

  read = readline = readlines = __iter__ = fileno = _refuse


def _refused(name: str):
  """A stand-in for a disabled call: raises :class:`SandboxRefused`."""
  def refused(*args, **kwargs):
    raise SandboxRefused(f"{name} is disabled in the sandbox")
  refused.__name__ = name.rsplit(".", 1)[-1]
  return refused


def _guard(work: str) -> None:
  """Disables the destructive calls (nanochat's ``reliability_guard`` and the
  additions listed in the module docstring) and confines writes to ``work``."""
  import builtins
  import io
  import posix
  import _posixsubprocess
  import faulthandler
  import socket
  faulthandler.disable()
  inside = _inside(work)
  opener, file_io = builtins.open, io.FileIO

  def open_checked(file, mode="r", *args, **kwargs):
    if not isinstance(file, int) and any(c in mode for c in "wax+"):
      inside(file)
    return opener(file, mode, *args, **kwargs)

  class FileIO(file_io):  # io.FileIO(path, "w") directly
    def __init__(self, file, mode="r", *args, **kwargs):
      if not isinstance(file, int) and any(c in mode for c in "wax+"):
        inside(file)
      super().__init__(file, mode, *args, **kwargs)

  def os_open(path, flags, mode=0o777, *, dir_fd=None):
    if flags & _OPEN_WRITE_FLAGS:
      inside(path, dir_fd)
    return os_open.original(path, flags, mode, dir_fd=dir_fd)
  os_open.original = os.open

  def path_writer(name):
    original = getattr(os, name)
    def checked(*args, **kwargs):
      if name == "link":  # a hard link is the file itself: both ends inside
        inside(kwargs.get("src", args[0] if args else None), kwargs.get("src_dir_fd"))
      if name in ("symlink", "link"):  # (src, dst): dst is what is created
        inside(kwargs.get("dst", args[1] if len(args) > 1 else None),
               kwargs.get("dst_dir_fd", kwargs.get("dir_fd")))
      else:
        inside(kwargs.get("path", args[0] if args else None), kwargs.get("dir_fd"))
      return original(*args, **kwargs)
    return checked

  builtins.open = io.open = open_checked
  io.FileIO = FileIO
  replacements = {"open": os_open}
  replacements.update((name, path_writer(name)) for name in _PATH_WRITERS
                      if hasattr(os, name))
  replacements.update((name, _refused(f"os.{name}")) for name in _NANOCHAT_OS + _MORE_OS)
  for module in (os, posix):
    for name, value in replacements.items():
      if hasattr(module, name) or name in _NANOCHAT_OS:
        setattr(module, name, value)
  for name in _NANOCHAT_SHUTIL:
    setattr(shutil, name, _refused(f"shutil.{name}"))
  subprocess.Popen = _refused("subprocess.Popen")
  _posixsubprocess.fork_exec = _refused("_posixsubprocess.fork_exec")
  socket.socket = _refused("socket.socket")
  socket.create_connection = _refused("socket.create_connection")
  builtins.exit = builtins.quit = builtins.help = None
  sys.stdin = sys.__stdin__ = _NoInput()
  for name in _NANOCHAT_MODULES:
    sys.modules[name] = None


def _inside(work: str):
  """A check that raises ``PermissionError`` unless a path lies in ``work``
  (after symbolic links; relative paths are relative to ``work``)."""
  realpath, join, fspath = os.path.realpath, os.path.join, os.fspath

  def check(path, dir_fd=None):
    if path is None or isinstance(path, int):
      return  # an open descriptor, or a call the original will reject
    text = os.fsdecode(fspath(path))
    if dir_fd is not None and not text.startswith("/"):
      raise PermissionError(errno.EACCES, "the sandbox refuses paths relative to a "
                            "dir_fd for writing", text)
    resolved = realpath(join(work, text))
    if resolved != work and not resolved.startswith(work + "/") \
        and resolved != "/dev/null":
      raise PermissionError(errno.EACCES, "the sandbox refuses writes outside its "
                            "temporary directory", text)
  return check


# ---------------------------------------------------------------------------
# The command line.


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit 2 (argparse prints usage too)
    raise SandboxError(message)


def main(argv: list[str] | None = None) -> int:
  """``python -m laplax.sandbox FILE [--timeout S] [--memory-mb M]``.

  Prints the :class:`Result` as one JSON line. Returns 0 (passed), 1 (not
  passed) or 2 (bad input: one line on standard error, nothing run).
  """
  parser = _Parser(prog="python -m laplax.sandbox",
                   description="Run a Python program in laplax's sandbox.")
  parser.add_argument("file", help="the program to run")
  parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                      help=f"seconds the program may run (default {TIMEOUT_S:g})")
  parser.add_argument("--memory-mb", type=int, default=MEMORY_MB,
                      help=f"address-space limit in MiB (default {MEMORY_MB})")
  try:
    args = parser.parse_args(argv)
    try:
      with open(args.file, encoding="utf-8") as f:
        source = f.read()
    except (OSError, UnicodeDecodeError) as e:
      raise SandboxError(f"cannot read the program {args.file} "
                         f"({getattr(e, 'strerror', None) or e}); pass a UTF-8 "
                         f"Python file") from None
    result = run_program(source, timeout=args.timeout, memory_mb=args.memory_mb)
  except SandboxError as e:
    print(f"error: {e}", file=sys.stderr)
    return USAGE_EXIT
  print(result.to_json(), flush=True)
  return 0 if result.passed else 1


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == CHILD_FLAG:
    _child_main(json.loads(sys.argv[2]))
  sys.exit(main())
