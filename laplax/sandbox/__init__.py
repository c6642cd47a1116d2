"""Runs model-generated programs under bubblewrap; HumanEval's verdicts come
from a checker the program cannot reach.

    python -m laplax.sandbox FILE [--timeout S] [--memory-mb M] [--unsafe_no_sandbox]

prints one JSON line ``{"passed", "status", "seconds", "isolation"}`` and exits 0
(the program ran to its end), 1 (it did not) or 2 (bad input or no sandbox: one
line on standard error, nothing run).

Isolation (``bwrap``; all kernel-enforced, the full list in docs/evaluation.md,
"Running generated code"): uid/gid 65534 in new user, PID, network, IPC, UTS, mount
and cgroup namespaces, no capabilities, ``no_new_privs``; a read-only root with
``/usr``, the interpreter, the runner and a private :data:`WORK_MB` MiB ``/work``
tmpfs; a seccomp filter (x86-64); per-process rlimits (``memory_mb`` MiB address
space, :data:`NOFILE` descriptors, :data:`NPROC` tasks per sandbox). At the deadline
(``timeout`` seconds) and at every end, ``SIGKILL`` to the PID namespace's first
process kills the whole tree. It fails closed (:class:`SandboxUnavailable`);
``unsafe=True`` runs plain processes with the limits only.

Verdicts: :func:`run_program`'s ``passed`` is the program's own word;
:func:`run_test` runs the problem's test in a second sandbox that calls the
program's function through the caller as plain data, so only returned values reach
the verdict. The caller reads at most :data:`MAX_MESSAGE` bytes per line, never
waits without a deadline, and its cleanup cannot raise.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

from laplax.errors import UserError
from laplax.sandbox import child as sandbox_child
from laplax.sandbox.child import NotPlainData, SandboxRefused  # noqa: F401  (re-exported)

USAGE_EXIT = 2
TIMEOUT_S = 5.0  # nanochat's execute_code default
MEMORY_MB = 256  # RLIMIT_AS and RLIMIT_DATA per process (nanochat: 256 MB)
WORK_MB = 64  # the work tmpfs and RLIMIT_FSIZE
NPROC = 8  # tasks (processes + threads) of the sandbox's uid in its user namespace
NOFILE = 64  # open descriptors per process
NOBODY = 65534  # the program's uid and gid
STARTUP_S = 60.0  # longest wait for the interpreters to be ready (a loaded machine)
MAX_MESSAGE = 1 << 20  # the longest line the caller reads from a sandbox
KILL_WAIT_S = 30.0  # longest wait for a killed namespace to be gone
MAX_STDERR = 4096  # bytes of bwrap's own error output kept
WORK, FILES = "/work", "/sandbox"
BWRAP = "bwrap"  # found on PATH (tests point it elsewhere)
UNSHARE = "unshare"  # util-linux, makes the user namespace of a root caller
RUNNER = os.path.abspath(sandbox_child.__file__)
# The seccomp filter: x86-64 system calls refused with EPERM.
_X86_64 = 0xC000003E  # AUDIT_ARCH_X86_64
_DENIED = {  # name: number on x86-64
  "shmget": 29,
  "semget": 64,
  "msgget": 68,
  "ptrace": 101,
  "personality": 135,
  "pivot_root": 155,
  "chroot": 161,
  "acct": 163,
  "mount": 165,
  "umount2": 166,
  "swapon": 167,
  "reboot": 169,
  "init_module": 175,
  "delete_module": 176,
  "quotactl": 179,
  "mq_open": 240,
  "kexec_load": 246,
  "add_key": 248,
  "request_key": 249,
  "keyctl": 250,
  "unshare": 272,
  "perf_event_open": 298,
  "setns": 308,
  "process_vm_readv": 310,
  "process_vm_writev": 311,
  "finit_module": 313,
  "bpf": 321,
  "userfaultfd": 323,
  "io_uring_setup": 425,
  "io_uring_enter": 426,
  "io_uring_register": 427,
  "open_tree": 428,
  "move_mount": 429,
  "fsopen": 430,
  "fsconfig": 431,
  "fsmount": 432,
  "fspick": 433,
  "mount_setattr": 442,
}
_CLONE, _CLONE3 = 56, 435
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NAMESPACES = 0x7E020000


class SandboxError(UserError, ValueError):
  """Bad arguments to the sandbox (a limit not positive, an unreadable program); one line."""


class SandboxUnavailable(UserError, RuntimeError):
  """No sandbox can be made here; the one-line message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class Result:
  """The outcome of one run.

  Attributes:
    passed: :func:`run_test`: the checker's ``check`` returned; :func:`run_program`:
      the program reported running to its end.
    status: ``"passed"``, ``"timeout"``, ``"memory"`` (``MemoryError``), ``"error:
      TYPE: MESSAGE"`` (at most 300 characters), ``"crashed: ..."`` (no answer) or
      ``"sandbox: ..."`` (could not run it).
    seconds: wall-clock seconds from the interpreters being ready to the end.
    isolation: what held (written by the caller, not the sandbox).
  """

  passed: bool
  status: str
  seconds: float
  isolation: dict

  def to_json(self) -> str:
    """The one JSON line the command prints."""
    return json.dumps(dataclasses.asdict(self), sort_keys=False)


@dataclasses.dataclass(frozen=True)
class _Setup:
  """How sandboxes are made here (:func:`check_available`)."""

  bwrap: str
  unshare: str | None  # root: makes the user namespace
  python: str
  binds: tuple  # bwrap arguments for the read-only root
  isolation: dict


def check_limits(timeout: float, memory_mb: int) -> None:
  """Raises :class:`SandboxError` unless ``timeout`` (seconds) and
  ``memory_mb`` (MiB, an ``int``) are positive and finite."""
  if (
    isinstance(timeout, bool)
    or not isinstance(timeout, (int, float))
    or not 0 < timeout < float("inf")
  ):
    raise SandboxError(f"the time limit must be a positive number of seconds, got {timeout!r}")
  if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0:
    raise SandboxError(f"the memory limit must be a positive number of MiB, got {memory_mb!r}")


def check_available() -> dict:
  """Makes sure programs can be sandboxed here; returns the isolation that holds (a dict).

  Raises:
    SandboxUnavailable: no ``bwrap`` on ``PATH``, no ``unshare`` or no Python uid
      65534 can read (as root), or a failing trial sandbox; one line with the fix.
  """
  return dict(_setup(BWRAP, UNSHARE).isolation)


@functools.cache
def _setup(bwrap_name: str, unshare_name: str) -> _Setup:
  """Finds the tools and interpreter, then runs a trial sandbox (cached)."""
  fix = (
    "install bubblewrap (`apt-get install bubblewrap`; scripts/install.sh does), or "
    "pass --unsafe_no_sandbox to run generated code without isolation"
  )
  bwrap = shutil.which(bwrap_name)
  if bwrap is None:
    raise SandboxUnavailable(
      f"no {bwrap_name} on PATH, so generated code cannot be sandboxed: {fix}"
    )
  root = os.geteuid() == 0
  unshare = shutil.which(unshare_name) if root else None
  if root and unshare is None:
    raise SandboxUnavailable(
      f"no {unshare_name} (util-linux) on PATH, which makes the "
      f"sandbox's user namespace for root: install util-linux, "
      f"or pass --unsafe_no_sandbox"
    )
  python, prefix = _interpreter(root)
  binds = ["--ro-bind", "/usr", "/usr"]
  for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(name):
      binds += ["--symlink", os.readlink(name), name]
    elif os.path.isdir(name):
      binds += ["--ro-bind", name, name]
  if prefix != "/usr" and not prefix.startswith("/usr/"):
    binds += ["--ro-bind", prefix, prefix]
  seccomp = (
    "x86-64 filter"
    if platform.machine() == "x86_64"
    else (f"none (no filter for {platform.machine()})")
  )
  isolation = {
    "sandbox": "bubblewrap",
    "user": "uid 65534 in a new user namespace, "
    + ("uid 65534 outside" if root else f"uid {os.getuid()} (the caller) outside"),
    "namespaces": "user, pid, network, ipc, uts, mount, cgroup",
    "files": f"read-only {' and '.join(sorted({'/usr', prefix}))}; /work: {WORK_MB} MiB tmpfs",
    "memory_mb_per_process": MEMORY_MB,
    "tasks": NPROC,
    "seccomp": seccomp,
    "python": python,
  }
  setup = _Setup(bwrap, unshare, python, tuple(binds), isolation)
  trial = _run([("program", {"program.py": "pass\n"})], 30.0, MEMORY_MB, setup)
  if not trial.passed:
    raise SandboxUnavailable(
      f"{bwrap} cannot make a sandbox here: {_why_not(bwrap) or trial.status}; "
      "or pass --unsafe_no_sandbox"
    )
  return setup


def _probe(command: list) -> str:
  """The first line bubblewrap's ``command`` writes on standard error when it
  fails, ``""`` when it runs."""
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    return (str(e).splitlines() or [type(e).__name__])[0]
  if done.returncode == 0:
    return ""
  return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[0]


def _why_not(bwrap: str) -> str:
  """Why no sandbox can be made, probed one step at a time: new namespaces
  (``bwrap --unshare-all``), then a new ``/proc`` in them (``--proc /proc``,
  which the kernel refuses where this machine's ``/proc`` has masked paths,
  as containers have); ``""`` when both work (the cause is elsewhere)."""
  base = [bwrap, "--unshare-user", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"]
  failed = _probe([*base, "true"])
  if failed:
    return (
      f"it cannot create namespaces ({failed}); enable user namespaces (sysctl "
      "kernel.unprivileged_userns_clone=1 or user.max_user_namespaces>0)"
    )
  failed = _probe([*base, "--proc", "/proc", "true"])
  if failed:
    return (
      f"it can create namespaces but cannot mount /proc in them ({failed}): this "
      "machine's /proc has masked paths (a container's); run where /proc is fully "
      "visible (docker: --security-opt systempaths=unconfined; podman: --security-opt "
      "unmask=ALL)"
    )
  return ""


def _interpreter(root: bool) -> tuple[str, str]:
  """``(python, its installation prefix)`` for the sandbox, run with ``-I -S``.

  This interpreter's real file, or ``/usr/bin/python3`` as root when uid 65534
  cannot read it.
  """
  candidates = [os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)]
  if root:
    candidates.append(os.path.realpath("/usr/bin/python3"))
  for python in candidates:
    prefix = os.path.dirname(os.path.dirname(python))
    if os.path.isfile(python) and (not root or _others_can_read(prefix)):
      return python, prefix
  raise SandboxUnavailable(
    f"uid 65534 cannot read {candidates[0]} (under a private "
    f"directory) and there is no /usr/bin/python3: install "
    f"Debian's python3, or pass --unsafe_no_sandbox"
  )


def _others_can_read(prefix: str) -> bool:
  """Whether every directory from ``/`` to ``prefix`` lets others in."""
  parts = prefix.split("/")
  for i in range(2, len(parts) + 1):
    try:
      if not os.stat("/".join(parts[:i])).st_mode & 0o001:
        return False
    except OSError:
      return False
  return True


def run_program(
  source: str, timeout: float = TIMEOUT_S, memory_mb: int = MEMORY_MB, unsafe: bool = False
) -> Result:
  """Runs ``source`` (a whole Python program) in a sandbox and waits for it.

  ``passed`` is the program's own report; use :func:`run_test` for a verdict the
  program cannot write.

  Raises:
    SandboxError: ``timeout`` or ``memory_mb`` not positive.
    SandboxUnavailable: no sandbox here and not ``unsafe``.
  """
  check_limits(timeout, memory_mb)
  setup = None if unsafe else _setup(BWRAP, UNSHARE)
  return _run([("program", {"program.py": source})], float(timeout), memory_mb, setup)


def run_test(
  program: str,
  prompt: str,
  test: str,
  entry_point: str,
  timeout: float = TIMEOUT_S,
  memory_mb: int = MEMORY_MB,
  unsafe: bool = False,
) -> Result:
  """HumanEval's verdict on ``program``: ``prompt`` and ``test`` run in a checker sandbox.

  ``check(candidate)`` calls the program's ``entry_point`` (another sandbox) through
  the caller, as plain data.

  Raises:
    SandboxError: ``timeout`` or ``memory_mb`` not positive.
    SandboxUnavailable: no sandbox here and not ``unsafe``.
  """
  check_limits(timeout, memory_mb)
  setup = None if unsafe else _setup(BWRAP, UNSHARE)
  spec = json.dumps({"prompt": prompt, "test": test, "entry_point": entry_point})
  return _run(
    [("program", {"program.py": program}), ("check", {"check.json": spec})],
    float(timeout),
    memory_mb,
    setup,
  )


def _isolation(setup: _Setup | None, memory_mb: int) -> dict:
  if setup is None:
    return {
      "sandbox": "none (--unsafe_no_sandbox)",
      "memory_mb_per_process": memory_mb,
      "tasks": "no limit" if os.geteuid() == 0 else NPROC,
    }
  return {**setup.isolation, "memory_mb_per_process": memory_mb}


def _run(roles: list, timeout: float, memory_mb: int, setup: _Setup | None) -> Result:
  """Starts one sandbox per role, relays calls between them, and returns the
  result; every process is killed and every file removed before returning."""
  isolation = _isolation(setup, memory_mb)
  procs = []
  try:
    for role, files in roles:
      procs.append(_Proc.start(role, files, memory_mb, setup))
    return _drive(procs, timeout, isolation)
  except OSError as e:
    return Result(False, f"sandbox: cannot start ({e})", 0.0, isolation)
  finally:
    for proc in procs:
      proc.close()


class _Proc:
  """One sandbox: its process, its two channels and what to clean up."""

  def __init__(self, role, popen, to_child, from_child, base, info):
    self.role, self.popen, self.base, self.info = role, popen, base, info
    self.to_child, self.from_child = to_child, from_child
    self.inbox, self.outbox, self.stderr = bytearray(), bytearray(), bytearray()
    self.eof = False
    for fd in (to_child, from_child, popen.stderr.fileno()):
      os.set_blocking(fd, False)

  @classmethod
  def start(cls, role: str, files: dict, memory_mb: int, setup: _Setup | None) -> _Proc:
    """Starts the runner in ``role`` with ``files`` (name -> text) beside it."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    settings = {
      "role": role,
      "memory": memory_mb << 20,
      "fsize": WORK_MB << 20,
      "nofile": NOFILE,
      "nproc": NPROC,
      "in": req_r,
      "out": rep_w,
    }
    opened, base, info_r = [req_r, rep_w], None, None
    try:
      if setup is None:
        base = tempfile.mkdtemp(prefix="laplax-sandbox-")
        os.mkdir(os.path.join(base, "files"))
        os.mkdir(os.path.join(base, "work"), 0o700)
        for name, text in {**files, "runner.py": _runner_source()}.items():
          with open(os.path.join(base, "files", name), "w", encoding="utf-8") as f:
            f.write(text)
        settings.update(files=os.path.join(base, "files"), work=os.path.join(base, "work"))
        command = [sys.executable, "-I", "-S", "-B", os.path.join(base, "files", "runner.py")]
        env = {
          "PATH": os.defpath,
          "HOME": settings["work"],
          "TMPDIR": settings["work"],
          "LC_ALL": "C.UTF-8",
          "OMP_NUM_THREADS": "1",
        }
        cwd = settings["work"]
      else:
        settings.update(files=FILES, work=WORK)
        info_r, info_w = os.pipe()
        opened.append(info_w)
        command = (
          [setup.bwrap, "--info-fd", str(info_w)]
          + _namespace_args(setup, opened)
          + list(setup.binds)
          + [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--remount-ro",
            "/dev",
            "--size",
            str(WORK_MB << 20),
            "--tmpfs",
            WORK,
            "--chdir",
            WORK,
          ]
        )
        for name, text in {**files, "runner.py": _runner_source()}.items():
          command += ["--ro-bind-data", str(_memfd(text.encode(), opened)), f"{FILES}/{name}"]
        if platform.machine() == "x86_64":
          command += ["--seccomp", str(_memfd(_seccomp_filter(), opened))]
        command += [
          "--remount-ro",
          "/",
          "--clearenv",
          "--setenv",
          "PATH",
          "/usr/bin:/bin",
          "--setenv",
          "HOME",
          WORK,
          "--setenv",
          "TMPDIR",
          WORK,
          "--setenv",
          "LC_ALL",
          "C.UTF-8",
          "--setenv",
          "OMP_NUM_THREADS",
          "1",
          setup.python,
          "-I",
          "-S",
          "-B",
          f"{FILES}/runner.py",
        ]
        env, cwd = {"PATH": "/usr/bin:/bin"}, "/"
      popen = subprocess.Popen(
        command + [json.dumps(settings)],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        pass_fds=tuple(opened),
        start_new_session=True,
      )
    except BaseException:
      for fd in (req_w, rep_r, info_r):
        _close(fd)
      _remove_tree(base)
      raise
    finally:
      for fd in opened:
        _close(fd)
    return cls(role, popen, req_w, rep_r, base, info_r)

  def close(self) -> None:
    """Kills the sandbox and returns once every process of it is gone; never raises.

    ``SIGKILL`` by pidfd to the PID namespace's first process (the kernel reaps the
    rest), then to ``bwrap``'s process group; closes the channels, removes the files.
    """
    try:
      self._kill_namespace()
    except BaseException:
      pass
    try:
      os.killpg(self.popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
      pass
    try:
      self.popen.wait()
    except BaseException:
      pass
    for fd in (self.to_child, self.from_child, self.info):
      if fd is not None:
        _close(fd)
    try:
      self.popen.stderr.close()
    except BaseException:
      pass
    _remove_tree(self.base)

  def _kill_namespace(self) -> None:
    """``SIGKILL`` to the namespace's first process, named by ``bwrap
    --info-fd`` (``{"child-pid": N, "pid-namespace": INODE, ...}``), and a wait
    until the kernel has killed and reaped every process of the namespace."""
    if self.info is None:
      return
    info = self._read_info()
    if "child-pid" not in info:
      return
    pid = int(info["child-pid"])
    pidfd = os.pidfd_open(pid)
    try:
      if self._is_namespace_init(pid, info.get("pid-namespace")):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        # Readable once it has exited, which is after the kernel killed and
        # reaped the rest of its namespace.
        select.select([pidfd], [], [], KILL_WAIT_S)
    finally:
      os.close(pidfd)

  def _read_info(self) -> dict:
    """bwrap's ``--info-fd`` JSON; ``{}`` if bwrap closed it first (it died
    before making the namespace) or wrote nothing parsable in time."""
    # bwrap writes it once the namespace exists; a short deadline would let a
    # loaded machine skip the kill (bwrap's SIGKILL then reached the namespace
    # only through --die-with-parent, asynchronously, after this returned).
    text, deadline = b"", time.monotonic() + KILL_WAIT_S
    while len(text) <= 4096 and time.monotonic() < deadline:
      if not select.select([self.info], [], [], max(deadline - time.monotonic(), 0))[0]:
        break
      try:
        chunk = os.read(self.info, 4096)
      except BlockingIOError:
        continue
      if not chunk:
        break
      text += chunk
      try:
        return json.loads(text)
      except ValueError:
        continue  # not all of it yet
    return {}

  def _is_namespace_init(self, pid: int, namespace) -> bool:
    """Whether ``pid`` is still the sandbox's first process, not a reused pid.

    bwrap itself may have exited already (it exits with the program, while
    the namespace's first process waits for the program's orphans), so the
    first process's parent is then no longer bwrap: it is recognised by its
    PID namespace, which bwrap named.
    """
    try:
      if namespace is not None and os.stat(f"/proc/{pid}/ns/pid").st_ino == int(namespace):
        return True
    except (OSError, ValueError):
      pass
    try:
      with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      return False
    return parent == self.popen.pid

  def read(self) -> None:
    """Reads what the child wrote (non-blocking) into ``inbox``."""
    try:
      chunk = os.read(self.from_child, 1 << 16)
    except BlockingIOError:
      return
    except OSError:
      chunk = b""
    if not chunk:
      self.eof = True
    self.inbox += chunk

  def line(self, raw: bool = False):
    """The next whole line, parsed as JSON (``raw``: the bytes, unparsed),
    ``None`` if there is none yet; raises ``_Flood`` past
    :data:`MAX_MESSAGE` bytes."""
    end = self.inbox.find(b"\n", 0, MAX_MESSAGE + 1)
    if end < 0:
      if len(self.inbox) > MAX_MESSAGE:
        raise _Flood(self.role)
      return None
    data = bytes(self.inbox[:end])
    del self.inbox[: end + 1]
    if raw:
      return data
    try:
      return json.loads(data)
    except (ValueError, RecursionError):
      return {"malformed": True}

  def read_stderr(self) -> None:
    """Keeps the first :data:`MAX_STDERR` bytes of ``bwrap``'s errors."""
    try:
      chunk = os.read(self.popen.stderr.fileno(), 1 << 16)
    except (BlockingIOError, OSError):
      return
    if len(self.stderr) < MAX_STDERR:
      self.stderr += chunk[: MAX_STDERR - len(self.stderr)]

  def flush(self) -> None:
    """Writes what it can of ``outbox`` (non-blocking)."""
    try:
      written = os.write(self.to_child, self.outbox)
    except (BlockingIOError, InterruptedError):
      return
    except OSError:
      written = len(self.outbox)
    del self.outbox[:written]

  def why_dead(self) -> str:
    """Why the child ended without an answer (``bwrap``'s message if any)."""
    text = " ".join(self.stderr.decode("utf-8", "replace").split())[:300]
    code = self.popen.poll()
    return text or (f"exit code {code}" if code is not None else "closed its channel")


class _Flood(Exception):
  """A line longer than :data:`MAX_MESSAGE` from a sandbox."""


def _drive(procs: list, timeout: float, isolation: dict) -> Result:
  """The caller's loop: waits for readiness, relays the checker's calls to
  the program and the program's answers back, and returns at the verdict or
  the deadline."""
  program = procs[0]
  checker = procs[1] if len(procs) > 1 else None
  start = time.monotonic()
  deadline, ready_at = start + STARTUP_S, None
  ready, loaded, awaiting, pending, nonce = set(), None, False, None, b""

  def result(passed: bool, status: str) -> Result:
    seconds = time.monotonic() - (ready_at or start)
    return Result(passed, status, round(seconds, 3), isolation)

  while True:
    now = time.monotonic()
    if now >= deadline:
      return result(
        False,
        "timeout" if ready_at else f"sandbox: the interpreter was not ready within {STARTUP_S:g} s",
      )
    want_program = len(ready) < len(procs) or loaded is None or awaiting
    readers = {p.popen.stderr.fileno(): p.read_stderr for p in procs}
    if want_program and not program.eof:
      readers[program.from_child] = program.read
    if checker is not None and not checker.eof:
      readers[checker.from_child] = checker.read
    writers = {p.to_child: p.flush for p in procs if p.outbox}
    try:
      readable, writable, _ = select.select(
        list(readers), list(writers), [], min(deadline - now, 0.5)
      )
    except InterruptedError:
      continue
    for fd in readable:
      readers[fd]()
    for fd in writable:
      writers[fd]()
    try:
      while True:  # the program's lines
        if not want_program:
          break
        message = program.line(raw=awaiting)
        if message is None:
          break
        if awaiting:  # an answer: relayed to the checker as bytes, never parsed here
          # It must open with the call's nonce, which the program learnt from
          # the call: a line written before the call (answers made up in
          # advance, left in the pipe) answers no call.
          if not message.startswith(nonce):
            return result(False, "error: the program sent a line that answers no call")
          checker.outbox += b"{" + message[len(nonce) :] + b"\n"
          awaiting = False
        elif program not in ready:
          ready.add(program)
        elif loaded is None:
          loaded = type(message) is dict and message.get("loaded") is True
          if not loaded:
            return result(False, _program_error(message))
          if checker is None:
            return result(True, "passed")
        want_program = len(ready) < len(procs) or loaded is None or awaiting
      while checker is not None:  # the checker's lines (trusted)
        message = checker.line()
        if message is None:
          break
        if checker not in ready:
          ready.add(checker)
        elif type(message) is dict and "status" in message:
          status = str(message["status"])
          return result(status == "passed", status)
        else:
          pending = message
    except _Flood as e:
      return result(False, f"error: the {e.args[0]} sent a line over {MAX_MESSAGE} bytes")
    if ready_at is None and len(ready) == len(procs):
      ready_at = time.monotonic()
      deadline = ready_at + timeout
    if pending is not None and loaded and not awaiting:
      token = secrets.token_hex(16)
      nonce = b'{"nonce": "' + token.encode() + b'", '  # how the answer opens
      program.outbox += json.dumps({"nonce": token, **pending}).encode() + b"\n"
      pending, awaiting = None, True
    if program.eof and (loaded is None or awaiting) and not program.inbox:
      return result(
        False,
        "crashed: the program ended without an answer (" + program.why_dead() + ")"
        if program in ready
        else "sandbox: " + program.why_dead(),
      )
    if checker is not None and checker.eof and not checker.inbox:
      return result(
        False, "sandbox: the checker ended without a verdict (" + checker.why_dead() + ")"
      )


def _program_error(message) -> str:
  """The status for a program that raised at its top level (its own report:
  only ever a failure)."""
  if type(message) is not dict:
    return "error: a malformed report"
  kind = str(message.get("type", ""))[:100]
  kind = kind if kind.isidentifier() else "Error"
  if kind == "MemoryError":
    return "memory"
  text = " ".join(str(message.get("message", "")).split())[:300]
  return f"error: {kind}: {text}".rstrip(": ")


def _namespace_args(setup: _Setup, opened: list) -> list:
  """bwrap's namespace, user and privilege arguments."""
  args = [
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--uid",
    str(NOBODY),
    "--gid",
    str(NOBODY),
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--hostname",
    "sandbox",
  ]
  if setup.unshare is None:
    return ["--unshare-user", "--disable-userns"] + args
  fd = _user_namespace(setup.unshare)
  opened.append(fd)
  return ["--userns", str(fd)] + args


def _user_namespace(unshare: str) -> int:
  """A new user namespace mapping uid and gid 65534 to the machine's 65534
  (root only: ``bwrap`` itself would map them to root); returns a descriptor
  of it. ``unshare --user`` makes it in a short-lived process."""
  holder = subprocess.Popen(
    [unshare, "--user", "--", "sleep", "30"],
    stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    start_new_session=True,
  )
  try:
    own = os.stat("/proc/self/ns/user").st_ino
    deadline = time.monotonic() + STARTUP_S
    while os.stat(f"/proc/{holder.pid}/ns/user").st_ino == own:
      if holder.poll() is not None or time.monotonic() > deadline:
        raise OSError(f"{unshare} --user did not make a user namespace")
      time.sleep(0.0005)
    for name in ("uid_map", "gid_map"):
      with open(f"/proc/{holder.pid}/{name}", "w", encoding="ascii") as f:
        f.write(f"{NOBODY} {NOBODY} 1\n")
    return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
  finally:
    holder.kill()
    holder.wait()


def _memfd(data: bytes, opened: list) -> int:
  """An anonymous file holding ``data``, at offset 0 (bwrap reads it)."""
  fd = os.memfd_create("laplax-sandbox", 0)
  opened.append(fd)
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view) :]
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


@functools.cache
def _runner_source() -> str:
  with open(RUNNER, encoding="utf-8") as f:
    return f.read()


@functools.cache
def _seccomp_filter() -> bytes:
  """The classic-BPF seccomp program (``struct sock_filter[]``).

  Kills other architectures and x32; ``EPERM`` for :data:`_DENIED` and ``clone`` with
  a namespace flag; ``ENOSYS`` for ``clone3`` (libc falls back to ``clone``).
  """
  ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  allow, kill = 0x7FFF0000, 0x80000000
  eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
  code = [
    ("i", ld, 4),
    ("j", jeq, _X86_64, None, "kill"),
    ("i", ld, 0),
    ("j", jge, 0x40000000, "kill", None),
  ]
  code += [("j", jeq, nr, "eperm", None) for nr in sorted(_DENIED.values())]
  code += [
    ("j", jeq, _CLONE3, "enosys", None),
    ("j", jeq, _CLONE, None, "allow"),
    ("i", ld, 16),
    ("j", jset, _CLONE_NAMESPACES, "eperm", None),
    ("allow", ret, allow),
    ("eperm", ret, eperm),
    ("enosys", ret, enosys),
    ("kill", ret, kill),
  ]
  labels = {op[0]: i for i, op in enumerate(code) if op[0] not in ("i", "j")}
  out = []
  for i, op in enumerate(code):
    if op[0] == "j":
      _, kind, k, true, false = op
      jt = labels[true] - i - 1 if true else 0
      jf = labels[false] - i - 1 if false else 0
      out.append(struct.pack("<HBBI", kind, jt, jf, k))
    else:
      out.append(struct.pack("<HBBI", op[1], 0, 0, op[2]))
  return b"".join(out)


def _close(fd: int) -> None:
  try:
    os.close(fd)
  except OSError:
    pass


def _remove_tree(path: str | None) -> None:
  """Removes ``path`` however deep (an iterative walk by directory descriptors); never raises.

  Directories the program made unreadable are opened up first.
  """
  if path is None:
    return
  flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
  try:
    fd, names = os.open(path, flags), []
  except OSError:
    return
  try:
    while True:
      child = None
      with os.scandir(fd) as entries:
        for entry in entries:
          if entry.is_dir(follow_symlinks=False):
            child = child or entry.name
          else:
            try:
              os.unlink(entry.name, dir_fd=fd)
            except OSError:
              pass
      if child is not None:
        try:
          os.chmod(child, 0o700, dir_fd=fd, follow_symlinks=False)
        except (OSError, NotImplementedError):
          pass
        try:
          deeper = os.open(child, flags, dir_fd=fd)
        except OSError:
          break
        os.close(fd)
        fd = deeper
        names.append(child)
        continue
      if not names:
        break
      parent = os.open("..", flags, dir_fd=fd)
      os.close(fd)
      fd = parent
      os.rmdir(names.pop(), dir_fd=fd)
  except BaseException:
    pass
  finally:
    _close(fd)
  try:
    os.rmdir(path)
  except OSError:
    pass


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit 2 (argparse prints usage too)
    raise SandboxError(message)


def main(argv: list[str] | None = None) -> int:
  """``python -m laplax.sandbox FILE``: prints the :class:`Result`; exit 0, 1 or 2."""
  parser = _Parser(
    prog="python -m laplax.sandbox",
    description="Run a Python program in laplax's sandbox.",
  )
  parser.add_argument("file", help="the program to run")
  parser.add_argument(
    "--timeout",
    type=float,
    default=TIMEOUT_S,
    help=f"seconds the program may run (default {TIMEOUT_S:g})",
  )
  parser.add_argument(
    "--memory-mb",
    type=int,
    default=MEMORY_MB,
    help=f"address-space limit per process in MiB (default {MEMORY_MB})",
  )
  parser.add_argument(
    "--unsafe_no_sandbox",
    action="store_true",
    help="run without isolation (only where bubblewrap cannot be had)",
  )
  try:
    args = parser.parse_args(argv)
    check_limits(args.timeout, args.memory_mb)
    try:
      with open(args.file, encoding="utf-8") as f:
        source = f.read()
    except (OSError, UnicodeDecodeError) as e:
      raise SandboxError(f"cannot read {args.file} ({getattr(e, 'strerror', None) or e})") from None
    result = run_program(source, args.timeout, args.memory_mb, unsafe=args.unsafe_no_sandbox)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return USAGE_EXIT
  print(result.to_json(), flush=True)
  return 0 if result.passed else 1
