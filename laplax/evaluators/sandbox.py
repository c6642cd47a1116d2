"""Runs one generated Python program in a sandbox, as the HumanEval evaluator does.

    python -m laplax.evaluators.sandbox FILE [--timeout S] [--memory-mb M]

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
  ``__name__`` is not ``"__main__"``; in a new session (process group),
  killed as a whole when the run ends;
- in a fresh temporary directory as its working directory (also ``HOME``
  and ``TMPDIR``), deleted afterwards;
- with a time limit: after ``timeout`` seconds (nanochat: 5) an interval
  timer raises ``SandboxTimeout`` in the program; a program still alive 1 s
  later is killed (nanochat: ``join(timeout + 1)``). The limit counts from
  the moment the interpreter is ready, not from its start;
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
  does, so a program's ``except`` clauses see what they saw there), but
  ``os.getcwd`` and ``os.putenv`` still serve a module being imported
  (``multiprocessing``, ``numpy``: nanochat's forked child had them loaded
  before its guard). Opening
  a file for writing, making a directory, link, FIFO or node, or touching a
  file, anywhere but inside the temporary directory raises
  ``PermissionError``.

These hold on any Linux machine. Where the kernel allows it (root, or a
user allowed unprivileged user namespaces), the program also gets:

- a new network namespace: no interface but a loopback that is down, so no
  connection leaves it, loopback ports of the machine included;
- a new PID namespace whose first process is the program: when it ends or is
  killed, the kernel kills every process it started (fork bombs included);
- a new mount namespace in which every file system is read-only but the
  temporary directory: writes elsewhere fail with ``EROFS`` even past the
  guard (``ctypes``);
- when the caller is root and ``nobody`` can read the interpreter's
  installation, the ``nobody`` user (uid 65534) with no groups: the kernel
  also refuses signals to other users' processes and more than 64 processes
  (``RLIMIT_NPROC``, which never binds root). A non-root caller's program
  runs as the caller, with ``RLIMIT_NPROC`` 64 above the caller's count.

``isolation`` in the result says which of these held (``"none (why)"``
where one did not). Without namespaces (a non-root user without user
namespaces, or a container that forbids them) only the guard and the
process limits are left: code that calls the C library through ``ctypes``
can then reach the network, write where the user may write, and signal the
user's processes. Like nanochat's, this sandbox guards against accidents of
generated code; it is not a security boundary against an adversary (a
program can, for instance, write a forged result line to the pipe that
reports to the caller, or, as root, undo its mounts).

The sandboxed interpreter runs :mod:`laplax.evaluators.sandbox_child` as a script (it
uses only the standard library); this module starts and watches it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from laplax.evaluators import sandbox_child
from laplax.errors import UserError
from laplax.evaluators.sandbox_child import NOBODY, NPROC, SandboxRefused, SandboxTimeout  # re-exported

USAGE_EXIT = 2
TIMEOUT_S = 5.0  # nanochat's execute_code default
KILL_AFTER_S = 1.0  # killed this long after the time limit (nanochat: join(timeout + 1))
MEMORY_MB = 256  # RLIMIT_AS, RLIMIT_DATA and RLIMIT_STACK (nanochat: 256 MB)
STARTUP_S = 60.0  # longest wait for the interpreter to be ready (a loaded machine)
MAX_REPORT_BYTES = 1 << 20  # more on the result pipe than this: the run failed
CHILD = os.path.abspath(sandbox_child.__file__)  # run by path in the sandbox
# The interpreter of the sandboxed program (tests point it at another one).
PYTHON = sys.executable
# Whether to try the network, PID and mount namespaces (tests turn them off to
# see what a machine without them gets).
NAMESPACES = True


class SandboxError(UserError, ValueError):
  """Bad arguments to the sandbox (a time limit or memory limit that is not
  positive, an unreadable program file); the message is one line."""


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
    isolation: what held, e.g. ``{"user": "nobody", "network": "namespace",
      "processes": "pid namespace", "files": "read-only but the temporary
      directory", "memory": "256 MiB", "nproc": 65}``; a value
      ``"none (...)"`` says what was not available and why. Empty if the
      interpreter never became ready.
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
  check_limits(timeout, memory_mb)
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


def check_limits(timeout: float, memory_mb: int) -> None:
  """Raises :class:`SandboxError` unless ``timeout`` (seconds) and
  ``memory_mb`` (MiB, an ``int``) are positive and finite."""
  if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
      or not 0 < timeout < float("inf")):
    raise SandboxError(f"the time limit must be a positive number of seconds, "
                       f"got {timeout!r}")
  if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0:
    raise SandboxError(f"the memory limit must be a positive number of MiB, "
                       f"got {memory_mb!r}")


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
        [PYTHON, "-I", CHILD, json.dumps(settings)], cwd=work, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=(write_end,), start_new_session=True)
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


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit 2 (argparse prints usage too)
    raise SandboxError(message)


def main(argv: list[str] | None = None) -> int:
  """``python -m laplax.evaluators.sandbox FILE [--timeout S] [--memory-mb M]``.

  Prints the :class:`Result` as one JSON line. Returns 0 (passed), 1 (not
  passed) or 2 (bad input: one line on standard error, nothing run).
  """
  parser = _Parser(prog="python -m laplax.evaluators.sandbox",
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
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return USAGE_EXIT
  print(result.to_json(), flush=True)
  return 0 if result.passed else 1


if __name__ == "__main__":
  sys.exit(main())
