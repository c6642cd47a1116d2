"""The sandboxed interpreter of :mod:`laplax.evaluators.sandbox`: isolation, limits, the
guard, then ``exec`` of the program.

:func:`laplax.evaluators.sandbox.run_program` starts ``python -I sandbox_child.py
SETTINGS`` (a JSON object: ``program``, the file to run; ``work``, its
temporary directory; ``fd``, the pipe to report on; ``timeout`` in seconds;
``memory`` in bytes; ``namespaces``, whether to try them). In order:

1. count the processes of the user the program will run as (``RLIMIT_NPROC``
   counts them), before a namespace hides them;
2. enter new network and PID namespaces (``unshare(2)``), as root or in a new
   user namespace; with the PID namespace, fork: the child is its first
   process and runs the program, this process waits and reports its exit;
3. as root, switch to ``nobody`` if ``nobody`` can read this interpreter's
   installation; set the memory, core-file, file-size and process limits;
4. disable the destructive calls and confine writes to ``work`` (the guard);
5. report ``{"isolation": ...}``, ``exec`` the program under an interval
   timer, report ``{"status": ...}`` and ``os._exit(0)``.

This file uses only the standard library and is run by path, never imported
from the program's interpreter as part of laplax (``-I`` keeps the working
directory and ``PYTHONPATH`` off ``sys.path``). The guard's lists follow
``reliability_guard`` of nanochat's ``nanochat/execution.py`` (from OpenAI's
``human_eval/execution.py``) and add to it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import subprocess
import sys

FILE_SIZE_MB = 64  # RLIMIT_FSIZE: no file the program writes grows past this
NPROC = 64  # processes the program may add (RLIMIT_NPROC)
NOBODY = 65534  # the uid and gid a root caller's program runs as
_CLONE_NEWNET, _CLONE_NEWPID, _CLONE_NEWUSER = 0x40000000, 0x20000000, 0x10000000
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
# mount_setattr(2): the same number on every architecture (Linux 5.12+).
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
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
    "pidfd_open")
# Disabled calls that a module being imported may still make (harmless ones).
_IMPORT_TIME_OK = ("getcwd", "putenv")
# Calls that create or modify a path: refused outside the temporary directory.
_PATH_WRITERS = ("mkdir", "symlink", "link", "mkfifo", "mknod", "utime")
_OPEN_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxRefused(TypeError):
  """A call the sandbox disables (a ``TypeError``, like calling the ``None``
  that nanochat's ``reliability_guard`` leaves in its place)."""


class SandboxTimeout(Exception):
  """Raised in the program when its time limit passes (nanochat's
  ``TimeoutException``: an ``Exception``, so ``except Exception`` catches it
  and the kill 1 s later is what stops such a program)."""


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
  else in a new user namespace). Returns whether they were made (the next
  fork is then the PID namespace's first process); if not, says why in
  ``isolation`` (``network``, ``processes``, ``files``)."""
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
  isolation["files"] = f"none ({error})"
  return False


def _read_only_files(isolation: dict, work: str) -> None:
  """In a new mount namespace, makes every mount read-only but ``work``.

  Steps: ``unshare(CLONE_NEWNS)``; every mount private (so that nothing
  propagates back to the caller's namespace); ``work`` bind-mounted on
  itself; ``mount_setattr(2)`` (Linux 5.12+) sets ``MOUNT_ATTR_RDONLY`` on
  the whole tree, then clears it on ``work``. Any step failing leaves the
  files as they were (the guard still confines writes) and says why in
  ``isolation["files"]``.
  """
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                         ctypes.c_ulong, ctypes.c_void_p)
  libc.syscall.restype = ctypes.c_long
  attributes = (ctypes.c_uint64 * 4)()  # struct mount_attr: set, clr, propagation, userns_fd

  def setattr_(path: str, flags: int, set_: int, clear: int) -> int:
    attributes[0], attributes[1] = set_, clear
    return libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(_AT_FDCWD),
                        path.encode(), ctypes.c_uint(flags), attributes,
                        ctypes.c_size_t(ctypes.sizeof(attributes)))

  try:
    _unshare(_CLONE_NEWNS)
  except OSError as e:
    isolation["files"] = f"none (unshare: {e.strerror})"
    return
  steps = (
      ("private mounts", lambda: libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)),
      ("bind", lambda: libc.mount(work.encode(), work.encode(), None, _MS_BIND, None)),
      ("read-only", lambda: setattr_("/", _AT_RECURSIVE, _MOUNT_ATTR_RDONLY, 0)),
      ("writable work", lambda: setattr_(work, 0, 0, _MOUNT_ATTR_RDONLY)),
  )
  for name, step in steps:
    if step() != 0:
      code = ctypes.get_errno()
      isolation["files"] = f"none ({name}: {os.strerror(code) if code else 'failed'})"
      return
  os.chdir(work)  # onto the writable bind mount (the old cwd is beneath it)
  isolation["files"] = "read-only but the temporary directory"


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
  limits = {"RLIMIT_AS": memory, "RLIMIT_DATA": memory, "RLIMIT_STACK": memory,
            "RLIMIT_CORE": 0, "RLIMIT_FSIZE": FILE_SIZE_MB << 20}
  refused = []
  for name, value in limits.items():
    try:
      resource.setrlimit(getattr(resource, name), (value, value))
    except (ValueError, OSError):  # macOS refuses RLIMIT_AS (nanochat skips it there)
      refused.append(name)
  isolation["memory"] = (f"{memory >> 20} MiB" if not refused else
                         f"{memory >> 20} MiB but not {', '.join(refused)} "
                         f"(setrlimit refused)")
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
  private home directory (a pyenv under root's home, say) keeps the program root.
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


def main(settings: dict) -> None:
  """The sandboxed interpreter: isolate, limit, guard, then run the program.

  Reports on ``settings["fd"]`` one JSON line when ready (``isolation``) and
  one with the ``status`` (``"sandbox: ..."`` if the set-up itself failed);
  in a PID namespace the waiting first process adds ``{"exit": code}``
  (negative: the signal) of the program process.
  """
  fd, isolation = settings["fd"], {}
  write, exit_now, dumps = os.write, os._exit, json.dumps  # before the program can swap them

  def report(message: dict) -> None:
    write(fd, (dumps(message) + "\n").encode())

  try:
    source = _prepare(settings, isolation, report)
  except BaseException as e:  # pylint: disable=broad-except
    report({"status": "sandbox: " + _one_line(e)})
    exit_now(1)
  report({"isolation": isolation})
  status = _execute(source, settings["timeout"])
  try:
    report({"status": status})
  finally:
    exit_now(0)  # no atexit handlers or finalizers of the program


def _prepare(settings: dict, isolation: dict, report) -> str:
  """Steps 1-4 of the module docstring; returns the program's source. In a
  PID namespace the first process waits for the program process here and
  exits (it never returns)."""
  with open(settings["program"], encoding="utf-8") as f:
    source = f.read()
  work = os.path.realpath(settings["work"])
  uid, tasks = _program_user(isolation)
  if _namespaces(isolation, settings["namespaces"]):
    _read_only_files(isolation, work)
    pid = os.fork()  # the program process: pid 1 of the new namespace
    if pid:
      _, wait_status = os.waitpid(pid, 0)
      report({"exit": os.waitstatus_to_exitcode(wait_status)})
      os._exit(0)
  _user_and_limits(isolation, settings["memory"], uid, tasks)
  _guard(work)
  return source


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


def _refused(name: str, original=None):
  """A stand-in for a disabled call: raises :class:`SandboxRefused`, except
  that ``original`` (if given) still serves calls made while a module is
  being imported (``numpy`` calls ``os.putenv`` and ``multiprocessing``
  ``os.getcwd`` on import; nanochat's forked child had them imported before
  its guard)."""
  def refused(*args, **kwargs):
    if original is not None and _importing():
      return original(*args, **kwargs)
    raise SandboxRefused(f"{name} is disabled in the sandbox")
  refused.__name__ = name.rsplit(".", 1)[-1]
  return refused


def _importing() -> bool:
  """Whether an ``import`` statement is running (a frame of importlib's
  bootstrap is on the stack)."""
  frame = sys._getframe(2)  # pylint: disable=protected-access
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
      return True
    frame = frame.f_back
  return False


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
  replacements.update((name, _refused(f"os.{name}", getattr(os, name, None)
                                     if name in _IMPORT_TIME_OK else None))
                      for name in _NANOCHAT_OS + _MORE_OS)
  for module in (os, posix):
    for name, value in replacements.items():
      if hasattr(module, name) or name in _NANOCHAT_OS:
        setattr(module, name, value)
  for name in _NANOCHAT_SHUTIL:
    setattr(shutil, name, _refused(f"shutil.{name}"))
  subprocess.Popen = _refused("subprocess.Popen")
  _posixsubprocess.fork_exec = _refused("_posixsubprocess.fork_exec")
  class RefusedSocket(socket.socket):  # a class still: ssl subclasses it on import
    def __init__(self, *args, **kwargs):
      raise SandboxRefused("socket.socket is disabled in the sandbox")
  socket.socket = RefusedSocket
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


if __name__ == "__main__":
  main(json.loads(sys.argv[1]))
