"""The trusted runner inside each sandbox of :mod:`laplax.sandbox`.

Run as ``python -I -S -B RUNNER SETTINGS`` (a JSON object), standard library only.
Roles:

* ``"program"``: ``exec(source, {})`` (as nanochat), then answers JSON-line calls
  ``{"nonce", "name", "args", "kwargs"}`` with ``{"nonce", "value"}`` or
  ``{"nonce", "raise", "message"}``, the call's nonce first;
  all of it is the program's word, relayed as data.
* ``"check"``: runs the problem's prompt and test and ``check(candidate)``, the
  candidate calling the program and rebuilding builtin values with :func:`decode`;
  the last line is ``{"status": "passed"}`` or ``{"status": "error: TYPE: MESSAGE"}``.

Both set the resource limits, keep only their two channels and point 0, 1, 2 at
``/dev/null``. The program role applies nanochat's ``reliability_guard``
(``nanochat/execution.py``, from OpenAI's ``human_eval/execution.py``): no security
boundary, it keeps scores equal with and without ``--unsafe_no_sandbox``.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import subprocess
import sys

# Names disabled by nanochat's reliability_guard (os, shutil, subprocess) ...
_NANOCHAT_OS = (
  "kill",
  "system",
  "putenv",
  "remove",
  "removedirs",
  "rmdir",
  "fchdir",
  "setuid",
  "fork",
  "forkpty",
  "killpg",
  "rename",
  "renames",
  "truncate",
  "replace",
  "unlink",
  "fchmod",
  "fchown",
  "chmod",
  "chown",
  "chroot",
  "lchflags",
  "lchmod",
  "lchown",
  "getcwd",
  "chdir",
)
_NANOCHAT_SHUTIL = ("rmtree", "move", "chown")
_NANOCHAT_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")
# ... and the other ways to start a program or leave the process group.
_MORE_OS = (
  "execl",
  "execle",
  "execlp",
  "execlpe",
  "execv",
  "execve",
  "execvp",
  "execvpe",
  "spawnl",
  "spawnle",
  "spawnlp",
  "spawnlpe",
  "spawnv",
  "spawnve",
  "spawnvp",
  "spawnvpe",
  "posix_spawn",
  "posix_spawnp",
  "popen",
  "setsid",
  "setpgid",
  "setpgrp",
  "setreuid",
  "setresuid",
  "setgid",
  "setregid",
  "setresgid",
  "pidfd_open",
)
# Disabled calls that a module being imported may still make (harmless ones).
_IMPORT_TIME_OK = ("getcwd", "putenv")
# Calls that create or modify a path: refused outside the work directory.
_PATH_WRITERS = ("mkdir", "symlink", "link", "mkfifo", "mknod", "utime")
_OPEN_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
MAX_DEPTH = 100  # nesting of a plain-data value
MAX_LINE = 1 << 20  # the longest line a checker reads (the caller cuts longer ones)
_PLAIN = (type(None), bool, int, float, str)


class SandboxRefused(TypeError):
  """A call the guard disables (a ``TypeError``, like nanochat's ``None`` stand-ins)."""


class NotPlainData(TypeError):
  """A value that is not plain builtin data (see :func:`encode`)."""


def encode(value, depth: int = 0):
  """``value`` as JSON-ready data.

  ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` as themselves; tagged
  ``{"tuple"}``, ``{"set"}``, ``{"frozenset"}``, ``{"dict": [[k, v], ...]}``,
  ``{"bytes": HEX}``, ``{"complex": [re, im]}``. Exact types only: a subclass or
  nesting deeper than :data:`MAX_DEPTH` raises :class:`NotPlainData`.
  """
  kind = type(value)
  if depth > MAX_DEPTH:
    raise NotPlainData(f"a value nested deeper than {MAX_DEPTH}")
  if kind in _PLAIN:
    return value
  if kind is list:
    return [encode(v, depth + 1) for v in value]
  if kind in (tuple, set, frozenset):
    return {kind.__name__: [encode(v, depth + 1) for v in value]}
  if kind is dict:
    return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
  if kind is bytes:
    return {"bytes": value.hex()}
  if kind is complex:
    return {"complex": [value.real, value.imag]}
  raise NotPlainData(
    f"a value of type {kind.__name__} is not plain data "
    f"(builtin numbers, strings, bytes and containers of them)"
  )


def decode(data, depth: int = 0):
  """The builtin value :func:`encode` made ``data`` from (builtin objects only).

  Raises :class:`NotPlainData` for an unknown tag or a malformed container.
  """
  kind = type(data)
  if depth > MAX_DEPTH:
    raise NotPlainData(f"a value nested deeper than {MAX_DEPTH}")
  if kind in _PLAIN:
    return data
  if kind is list:
    return [decode(v, depth + 1) for v in data]
  if kind is dict and len(data) == 1:
    ((tag, body),) = data.items()
    if tag in ("tuple", "set", "frozenset") and type(body) is list:
      items = [decode(v, depth + 1) for v in body]
      return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
      return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
    if tag == "bytes" and type(body) is str:
      return bytes.fromhex(body)
    if (
      tag == "complex"
      and type(body) is list
      and len(body) == 2
      and all(type(x) in (int, float) for x in body)
    ):
      return complex(body[0], body[1])
  raise NotPlainData("malformed plain data")


def _limits(settings: dict) -> None:
  """Sets the resource limits of this process and all it starts."""
  import resource  # (the guard hides it)

  memory = settings["memory"]
  limits = {
    "RLIMIT_AS": memory,
    "RLIMIT_DATA": memory,
    "RLIMIT_STACK": min(memory, 64 << 20),
    "RLIMIT_CORE": 0,
    "RLIMIT_FSIZE": settings["fsize"],
    "RLIMIT_NOFILE": settings["nofile"],
    "RLIMIT_NPROC": settings["nproc"],
  }
  for name, value in limits.items():
    resource.setrlimit(getattr(resource, name), (value, value))


def _channels(settings: dict) -> tuple[int, int]:
  """Closes every descriptor but the two channels and points 0, 1 and 2 at
  ``/dev/null``; returns ``(in, out)``."""
  keep = {settings["in"], settings["out"]}
  for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
    fd = int(name)
    if fd > 2 and fd not in keep:
      try:
        os.close(fd)
      except OSError:
        pass
  null = os.open("/dev/null", os.O_RDWR)
  for fd in (0, 1, 2):
    os.dup2(null, fd)
  os.close(null)
  return settings["in"], settings["out"]


def _one_line(error: BaseException) -> tuple[str, str]:
  """``(TYPE, MESSAGE)`` of an exception, the message on one line, at most
  300 characters."""
  try:
    message = " ".join(str(error).split())[:300]
  except BaseException:
    message = "(unprintable)"
  return type(error).__name__, message


def _status(error: BaseException) -> str:
  """The checker's status for an exception: ``"memory"`` or
  ``"error: TYPE: MESSAGE"``."""
  if isinstance(error, MemoryError):
    return "memory"
  name, message = _one_line(error)
  return f"error: {name}: {message}".rstrip(": ")


def program_role(settings: dict) -> None:
  """Runs the program, then answers calls until the caller closes ``in``."""
  in_fd, out_fd = _channels(settings)
  write, dumps, loads, exit_now = os.write, json.dumps, json.loads, os._exit

  def send(message: dict) -> None:
    data = (dumps(message) + "\n").encode()
    while data:
      data = data[write(out_fd, data) :]

  with open(os.path.join(settings["files"], "program.py"), encoding="utf-8") as f:
    source = f.read()
  send({"ready": 1})
  _guard(settings["work"])
  namespace = {}
  try:
    exec(compile(source, "program.py", "exec"), namespace)
  except BaseException as e:
    name, message = _one_line(e)
    send({"loaded": False, "type": name, "message": message})
    exit_now(1)
  send({"loaded": True})
  reader = os.fdopen(in_fd, "rb", buffering=1 << 16, closefd=False)
  for line in reader:
    nonce = None
    try:
      request = loads(line)
      nonce = request.get("nonce")
      if request["name"] not in namespace:  # what nanochat's check(entry_point) raises
        raise NameError(f"name {request['name']!r} is not defined")
      function = namespace[request["name"]]
      args = decode(request["args"])
      kwargs = dict(decode(request["kwargs"]))
      reply = {"value": encode(function(*args, **kwargs))}
    except BaseException as e:
      name, message = _one_line(e)
      reply = {"raise": name, "message": message}
    send({"nonce": nonce, **reply})  # the caller's nonce first: this line answers that call
  exit_now(0)


class _RemoteError(Exception):
  """The program raised an exception that is not a builtin one."""


class _Candidate:
  """The checker's stand-in for the program's function: each call is sent to
  the program; the answer is rebuilt with :func:`decode` (builtin values
  only) or raised as the builtin exception it names."""

  def __init__(self, name: str, in_fd: int, out_fd: int):
    self.__name__ = self.name = name
    self.reader = os.fdopen(in_fd, "rb", buffering=1 << 16, closefd=False)
    self.out_fd = out_fd

  def __call__(self, *args, **kwargs):
    line = (
      json.dumps({"name": self.name, "args": encode(list(args)), "kwargs": encode(kwargs)}) + "\n"
    )
    data = line.encode()
    while data:
      data = data[os.write(self.out_fd, data) :]
    answer = self.reader.readline(MAX_LINE + 1)
    if not answer.endswith(b"\n"):
      raise _RemoteError("the program ended or sent an over-long answer")
    reply = json.loads(answer)
    if type(reply) is dict and set(reply) == {"value"}:
      return decode(reply["value"])
    if (
      type(reply) is dict
      and set(reply) == {"raise", "message"}
      and type(reply["raise"]) is str
      and type(reply["message"]) is str
    ):
      kind = getattr(builtins, reply["raise"], None)
      message = reply["message"][:300]
      if isinstance(kind, type) and issubclass(kind, Exception) and kind.__module__ == "builtins":
        try:
          error = kind(message)
        except Exception:
          error = _RemoteError(f"{reply['raise']}: {message}")
        raise error
      raise _RemoteError(f"{reply['raise'][:100]}: {message}")
    raise _RemoteError("the program sent a malformed answer")


def check_role(settings: dict) -> None:
  """Runs the problem's prompt and test with the remote candidate and writes
  the verdict."""
  in_fd, out_fd = _channels(settings)

  def send(message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
      data = data[os.write(out_fd, data) :]

  with open(os.path.join(settings["files"], "check.json"), encoding="utf-8") as f:
    spec = json.load(f)
  send({"ready": 1})
  try:
    namespace = {}
    exec(compile(spec["prompt"], "prompt.py", "exec"), namespace)
    exec(compile(spec["test"], "test.py", "exec"), namespace)
    candidate = _Candidate(spec["entry_point"], in_fd, out_fd)
    namespace[spec["entry_point"]] = candidate
    namespace["check"](candidate)
    status = "passed"
  except BaseException as e:
    status = _status(e)
  send({"status": status})
  os._exit(0)


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
  """A stand-in for a disabled call: raises :class:`SandboxRefused`.

  ``original`` still serves calls made during an ``import`` (numpy calls
  ``os.putenv``, multiprocessing ``os.getcwd``).
  """

  def refused(*args, **kwargs):
    if original is not None and _importing():
      return original(*args, **kwargs)
    raise SandboxRefused(f"{name} is disabled in the sandbox")

  refused.__name__ = name.rsplit(".", 1)[-1]
  return refused


def _importing() -> bool:
  """Whether an ``import`` statement is running (a frame of importlib's
  bootstrap is on the stack)."""
  frame = sys._getframe(2)
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
      return True
    frame = frame.f_back
  return False


def _guard(work: str) -> None:
  """Disables the destructive calls (nanochat's ``reliability_guard`` and more); writes only in ``work``."""
  import _posixsubprocess
  import builtins
  import faulthandler
  import io
  import posix
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
        inside(
          kwargs.get("dst", args[1] if len(args) > 1 else None),
          kwargs.get("dst_dir_fd", kwargs.get("dir_fd")),
        )
      else:
        inside(kwargs.get("path", args[0] if args else None), kwargs.get("dir_fd"))
      return original(*args, **kwargs)

    return checked

  builtins.open = io.open = open_checked
  io.FileIO = FileIO
  replacements = {"open": os_open}
  replacements.update((name, path_writer(name)) for name in _PATH_WRITERS if hasattr(os, name))
  replacements.update(
    (name, _refused(f"os.{name}", getattr(os, name, None) if name in _IMPORT_TIME_OK else None))
    for name in _NANOCHAT_OS + _MORE_OS
  )
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
      raise PermissionError(
        errno.EACCES, "the sandbox refuses paths relative to a dir_fd for writing", text
      )
    resolved = realpath(join(work, text))
    if resolved != work and not resolved.startswith(work + "/") and resolved != "/dev/null":
      raise PermissionError(
        errno.EACCES, "the sandbox refuses writes outside its temporary directory", text
      )

  return check


def main(argv: list[str]) -> None:
  """``RUNNER SETTINGS``: sets the limits, then runs the role."""
  settings = json.loads(argv[1])
  _limits(settings)
  if settings["role"] == "check":
    check_role(settings)
  else:
    program_role(settings)


if __name__ == "__main__":
  main(sys.argv)
