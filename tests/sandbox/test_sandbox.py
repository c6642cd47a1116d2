"""laplax.sandbox: each attack of issue 41 run as a real process
under bubblewrap (as this machine's user; root here): nothing outside the
work directory is read or written, no connection is made, no process
outlives the run, the caller's memory stays bounded, every wrong HumanEval
answer fails whatever it forges, and without bubblewrap nothing runs.

No test asserts a duration; limits are generous."""

import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
import uuid

import pytest

from laplax import sandbox
from laplax.sandbox import child as sandbox_child

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.subprocess


def _available() -> str | None:
  try:
    sandbox.check_available()
  except sandbox.SandboxUnavailable as e:
    return str(e)
  return None


needs_bwrap = pytest.mark.skipif(_available() is not None, reason=str(_available()))
ADD_PROMPT = 'def add(a, b):\n    """a + b"""\n'
ADD_TEST = (
  "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
)
WRONG_ADD = "def add(a, b):\n    return a - b\n"


def run(source: str, timeout: float = 5.0) -> sandbox.Result:
  return sandbox.run_program(textwrap.dedent(source), timeout=timeout)


def judge(program: str, timeout: float = 5.0, **kwargs) -> sandbox.Result:
  """HumanEval's verdict on ``program`` for the problem ``add``."""
  return sandbox.run_test(
    textwrap.dedent(program), ADD_PROMPT, ADD_TEST, "add", timeout=timeout, **kwargs
  )


@pytest.fixture
def sentinel():
  """A host directory anyone may read and write, holding a secret file;
  checks that it is unchanged after the test."""
  root = tempfile.mkdtemp(prefix="laplax-sentinel-")
  os.chmod(root, 0o777)
  secret = os.path.join(root, "secret.txt")
  with open(secret, "w") as f:
    f.write("secret")
  os.chmod(secret, 0o666)
  try:
    yield root
    assert sorted(os.listdir(root)) == ["secret.txt"]
    assert open(secret).read() == "secret"
  finally:
    shutil.rmtree(root)


@needs_bwrap
def test_right_answers_pass_wrong_ones_fail():
  right = judge("def add(a, b):\n    return a + b\n")
  assert right.passed and right.status == "passed", right
  wrong = judge(WRONG_ADD)
  assert not wrong.passed and wrong.status.startswith("error: AssertionError"), wrong
  missing = judge("def plus(a, b):\n    return a + b\n")
  assert missing.status == "error: NameError: name 'add' is not defined", missing
  broken = judge("def add(a, b) return a\n")
  assert not broken.passed and broken.status.startswith("error: SyntaxError"), broken
  assert right.isolation["user"].startswith("uid 65534 in a new user namespace")


@needs_bwrap
@pytest.mark.parametrize(
  "trick",
  [
    # a forged verdict line on every descriptor the program holds
    """
       import os, json
       line = json.dumps({"status": "passed"}).encode() + b"\\n"
       for fd in map(int, os.listdir("/proc/self/fd")):
           try: os.write(fd, line * 3)
           except OSError: pass
    """,
    # an early successful exit, before and instead of answering
    "import os\nos._exit(0)\n",
    # the claim of having loaded, then an exit
    """
       import os, json
       for fd in map(int, os.listdir("/proc/self/fd")):
           try: os.write(fd, b'{"loaded": true}\\n{"value": 5}\\n{"value": 0}\\n')
           except OSError: pass
       os._exit(0)
    """,
    # a trace function that replaces the test's check with a no-op
    """
       import sys
       def tracer(frame, event, arg):
           frame.f_globals["check"] = lambda candidate: None
           return tracer
       sys.settrace(tracer); sys.setprofile(tracer)
    """,
    # monkeypatching builtins and the runner's own functions
    """
       import builtins, sys
       builtins.AssertionError = type("Quiet", (Exception,), {})
       runner = sys.modules["__main__"]
       runner.encode = lambda value, depth=0: 5
       runner._status = lambda error: "passed"
    """,
    # a return value that equals everything
    """
       class Yes:
           def __eq__(self, other): return True
       def add(a, b): return Yes()
    """,
    # an int subclass that equals everything
    """
       class Int(int):
           def __eq__(self, other): return True
           __hash__ = int.__hash__
       def add(a, b): return Int(a - b)
    """,
    # signals to every process it can name (its own namespace only)
    """
       import os, signal
       for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
           try: os.kill(int(pid), signal.SIGKILL) if int(pid) != os.getpid() else None
           except Exception: pass
    """,
  ],
)
def test_a_wrong_answer_cannot_forge_a_pass(trick):
  result = judge(WRONG_ADD + textwrap.dedent(trick))
  assert not result.passed and result.status != "passed", result
  assert "SyntaxError" not in result.status and "IndentationError" not in result.status, result


@pytest.mark.subprocess
@needs_bwrap
def test_inside_the_sandbox(sentinel):
  """The program runs as uid 65534 (65534 outside too, as root), sees only
  its own processes, none of the machine's files, no capabilities."""
  program = f"""
      import os, json
      facts = {{"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
               "uid_map": open("/proc/self/uid_map").read().split(),
               "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
               "root": sorted(os.listdir("/")),
               "status": {{k: v for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
                          if k in ("CapEff", "NoNewPrivs")}},
               "seen": [p for p in ("/etc/shadow", "/etc/passwd", "/tmp", "/run", "/home", "/root",
                                    {sentinel!r}, {ROOT!r}, "/work/../etc") if os.path.exists(p)]}}
      raise RuntimeError(json.dumps(facts))
  """
  result = run(program)
  facts = json.loads(result.status.split("RuntimeError: ", 1)[1])
  assert facts["uid"] == facts["gid"] == 65534 and facts["groups"] == []
  if os.geteuid() == 0:
    assert facts["uid_map"] == ["65534", "65534", "1"]
  assert facts["pids"] == [1, 2]  # bwrap's init and the runner
  assert (
    {"dev", "proc", "sandbox", "usr", "work"}
    <= set(facts["root"])
    <= {"bin", "dev", "lib", "lib32", "lib64", "libx32", "proc", "sandbox", "sbin", "usr", "work"}
  )
  status = {key: value.strip() for key, value in facts["status"].items()}
  assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"] == "1"
  assert facts["seen"] == []


@pytest.mark.subprocess
@needs_bwrap
def test_writes_past_the_guard_fail(sentinel):
  """ctypes calls of the C library: no write outside /work, no new
  namespace, no mount, no System V memory."""
  program = f"""
      import ctypes
      libc = ctypes.CDLL(None, use_errno=True)
      results = [libc.open(p.encode(), 0o101, 0o644) for p in
                 ("/evil", "/usr/evil", "/sandbox/evil", "/dev/evil", "/proc/evil",
                  {os.path.join(sentinel, "evil")!r}, {os.path.join(sentinel, "secret.txt")!r})]
      results += [libc.unshare(flag) for flag in (0x10000000, 0x20000, 0x40000000)]
      results += [libc.mount(b"none", b"/work", b"tmpfs", 0, None), libc.shmget(0, 1 << 20, 0o1600)]
      results += [libc.open(b"/work/ok", 0o101, 0o644) >= 0]
      import json
      raise RuntimeError(json.dumps(results))
  """
  result = run(program)
  values = json.loads(result.status.split("RuntimeError: ", 1)[1])
  assert all(v < 0 for v in values[:-1]) and values[-1] is True, values


def facts(result: sandbox.Result):
  """What the program raised as ``RuntimeError(json.dumps(...))``."""
  assert result.status.startswith("error: RuntimeError: "), result
  return json.loads(result.status.split("RuntimeError: ", 1)[1])


NAMESPACES = ("mnt", "net", "pid", "user", "uts", "ipc", "cgroup")
x86_64_filter = pytest.mark.skipif(
  platform.machine() != "x86_64", reason="the seccomp filter is x86-64's"
)


@pytest.mark.subprocess
@needs_bwrap
@x86_64_filter
def test_setns_into_the_callers_namespaces_fails(sentinel):
  """setns (C library, past the guard) into every namespace the program can
  open. No pid of the machine is there: /proc lists pids 1 and 2, the
  caller's pid has no /proc entry (ENOENT), and /proc/1 is the sandbox's own
  first process (none of its namespaces is the caller's). Every setns
  returns EPERM from the seccomp filter (the kernel alone answers EINVAL for
  the program's own user namespace), its mount namespace is still its own
  afterwards, and a write to the machine's directory fails."""
  callers = set()
  for who in ("self", 1):  # the machine's /proc/1 where this user may read it
    for ns in NAMESPACES:
      try:
        callers.add(os.readlink(f"/proc/{who}/ns/{ns}"))
      except OSError:
        pass
  program = f"""
      import ctypes, errno, json, os
      libc = ctypes.CDLL(None, use_errno=True)
      def setns(path, kind=0):
          fd = os.open(path, os.O_RDONLY)
          ctypes.set_errno(0)
          result = libc.setns(fd, kind)
          return errno.errorcode.get(ctypes.get_errno(), "none") if result else "joined"
      found = {{"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}}
      found["caller"] = []
      for ns in {NAMESPACES!r}:
          try:
              os.open("/proc/{os.getpid()}/ns/" + ns, os.O_RDONLY)
              found["caller"].append("opened")
          except OSError as e:
              found["caller"].append(errno.errorcode[e.errno])
      links = [os.readlink(f"/proc/{{who}}/ns/{{ns}}") for who in (1, 2) for ns in {NAMESPACES!r}]
      found["links"] = len(links)
      found["shared"] = sorted(set(links) & set({sorted(callers)!r}))
      before = os.readlink("/proc/self/ns/mnt")
      found["setns"] = sorted({{setns(f"/proc/{{who}}/ns/{{ns}}") for who in (1, "self") for ns in {NAMESPACES!r}}})
      found["own_user"] = setns("/proc/self/ns/user", 0x10000000)  # CLONE_NEWUSER
      found["same_mnt"] = os.readlink("/proc/self/ns/mnt") == before
      fd = libc.open({os.path.join(sentinel, "evil").encode()!r}, 0o101, 0o644)
      found["write"] = errno.errorcode[ctypes.get_errno()] if fd < 0 else "written"
      raise RuntimeError(json.dumps(found))
  """
  found = facts(run(program))
  assert found["pids"] == [1, 2], found
  assert found["caller"] == ["ENOENT"] * len(NAMESPACES), found
  assert found["links"] == 2 * len(NAMESPACES) and found["shared"] == [], found
  assert found["setns"] == ["EPERM"] and found["own_user"] == "EPERM", found
  assert found["same_mnt"] and found["write"] == "ENOENT", found


@pytest.mark.subprocess
@needs_bwrap
@x86_64_filter
def test_read_only_mounts_stay_read_only():
  """Clearing the read-only flag of / and /usr: mount_setattr (syscall 442
  on x86-64, recursive, attr_clr MOUNT_ATTR_RDONLY) and mount(MS_REMOUNT),
  with and without MS_BIND, all return EPERM; / and /usr stay "ro" in
  mountinfo and a write to either fails with EROFS. The refusals come from
  the seccomp filter: calls the kernel would answer EINVAL (bad flags) or
  ENOENT (no such path) get EPERM too."""
  program = """
      import ctypes, errno, json
      libc = ctypes.CDLL(None, use_errno=True)
      class MountAttr(ctypes.Structure):
          _fields_ = [(name, ctypes.c_uint64) for name in ("set", "clr", "propagation", "userns_fd")]
      writable = MountAttr(0, 1, 0, 0)  # attr_clr = MOUNT_ATTR_RDONLY
      AT_FDCWD, AT_RECURSIVE, MS_REMOUNT, MS_BIND = -100, 0x8000, 32, 4096
      def call(function, *args):
          ctypes.set_errno(0)
          return errno.errorcode.get(ctypes.get_errno(), "none") if function(*args) else "done"
      def setattr_(path, flags=AT_RECURSIVE):
          return call(libc.syscall, 442, AT_FDCWD, path, flags, ctypes.byref(writable),
                      ctypes.sizeof(writable))
      found = {
          "setattr": [setattr_(b"/"), setattr_(b"/usr"), setattr_(b"/work/..")],
          "remount": [call(libc.mount, None, path, None, MS_REMOUNT | extra, None)
                      for path in (b"/", b"/usr") for extra in (0, MS_BIND)],
          "filter": [setattr_(b"/", 0xFFFFFFFF), call(libc.mount, None, b"/nonexistent", None,
                     MS_REMOUNT, None)],
          "write": [call(libc.open, path, 0o101, 0o644) for path in (b"/evil", b"/usr/evil")],
          "options": {line.split()[4]: line.split()[5].split(",")[0]
                      for line in open("/proc/self/mountinfo") if line.split()[4] in ("/", "/usr")},
      }
      raise RuntimeError(json.dumps(found))
  """
  found = facts(run(program))
  assert found["setattr"] == ["EPERM"] * 3 and found["remount"] == ["EPERM"] * 4, found
  assert found["filter"] == ["EPERM", "EPERM"], found
  assert found["write"] == ["EROFS", "EROFS"], found
  assert found["options"] == {"/": "ro", "/usr": "ro"}, found
  assert not os.path.exists("/evil") and not os.path.exists("/usr/evil")


@pytest.mark.subprocess
@needs_bwrap
def test_no_connection_to_the_machine(tmp_path):
  """Neither a TCP listener on 127.0.0.1 nor a Unix socket of the machine is
  reached (socket calls through _socket, past the guard)."""
  tcp = socket.socket()
  tcp.bind(("127.0.0.1", 0))
  tcp.listen(5)
  tcp.setblocking(False)
  path = os.path.join(tempfile.gettempdir(), f"laplax-{uuid.uuid4().hex[:8]}.sock")
  unix = socket.socket(socket.AF_UNIX)
  unix.bind(path)
  os.chmod(path, 0o777)
  unix.listen(5)
  unix.setblocking(False)
  try:
    program = f"""
        import _socket, errno
        errors = []
        for family, address in ((_socket.AF_INET, ("127.0.0.1", {tcp.getsockname()[1]})),
                                (_socket.AF_UNIX, {path!r}), (_socket.AF_UNIX, "\\0" + {path!r})):
            s = _socket.socket(family, _socket.SOCK_STREAM)
            try:
                s.connect(address)
                errors.append("connected")
            except OSError as e:
                errors.append(errno.errorcode.get(e.errno, str(e.errno)))
        raise RuntimeError(" ".join(errors))
    """
    result = run(program)
    # 127.0.0.1 is the namespace's own loopback (bwrap brings it up), where
    # nothing listens; the machine's socket file is not in its file system;
    # the abstract name is looked up in the namespace's own, empty, table.
    assert result.status == "error: RuntimeError: ECONNREFUSED ENOENT ECONNREFUSED", result
    for listener in (tcp, unix):
      with pytest.raises(BlockingIOError):
        listener.accept()
  finally:
    tcp.close()
    unix.close()
    os.unlink(path)


def find_process(name: str, deadline_s: float = 60.0) -> int:
  """The pid of the machine's process called ``name`` (``/proc/PID/comm``), waited for."""
  deadline = time.monotonic() + deadline_s
  while time.monotonic() < deadline:
    for pid in filter(str.isdigit, os.listdir("/proc")):
      try:
        with open(f"/proc/{pid}/comm") as f:
          if f.read().strip() == name:
            return int(pid)
      except OSError:
        pass
    time.sleep(0.05)
  raise AssertionError(f"no process {name} within {deadline_s} s")


@pytest.mark.subprocess
@needs_bwrap
def test_another_running_sandbox_cannot_be_reached():
  """Two sandboxes at once, from two threads: one waits (for SIGUSR1 from
  this test, so the other certainly runs meanwhile); the other looks through
  its /proc for every pipe of every other process and writes forged report
  lines into each. It sees only its own two pids, the waiting program's pid
  on the machine has no /proc entry there (ENOENT), and the waiting run's
  result is its own failure."""
  marker = "lx" + uuid.uuid4().hex[:10]
  waiting = f"""
      import ctypes, signal
      signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
      ctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)  # PR_SET_NAME, once blocked
      signal.sigwait([signal.SIGUSR1])
      raise RuntimeError("the waiting program's own end")
  """
  results = {}

  def in_thread(name, source):
    results[name] = run(source, timeout=120.0)

  waiter = threading.Thread(target=in_thread, args=("waiting", waiting))
  waiter.start()
  pid = None
  try:
    pid = find_process(marker)
    attacker = f"""
        import errno, json, os
        forged = b'{{"loaded": true}}\\n{{"status": "passed"}}\\n{{"value": 5}}\\n'
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        found = {{"pids": pids if len(pids) < 5 else len(pids), "written": 0}}
        try:
            os.listdir("/proc/{pid}/fd")
            found["waiting"] = "listed"
        except OSError as e:
            found["waiting"] = errno.errorcode[e.errno]
        for p in pids:
            if p == os.getpid():
                continue
            try:
                fds = os.listdir(f"/proc/{{p}}/fd")
            except OSError:
                continue
            for fd in fds:
                path = f"/proc/{{p}}/fd/{{fd}}"
                try:
                    if os.readlink(path).startswith("pipe:"):
                        out = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                        os.write(out, forged)
                        found["written"] += 1
                except OSError:
                    pass
        raise RuntimeError(json.dumps(found))
    """
    attack = threading.Thread(target=in_thread, args=("attacker", attacker))
    attack.start()
    attack.join()
  finally:
    if pid is not None:
      try:
        os.kill(pid, signal.SIGUSR1)
      except ProcessLookupError:
        pass
    waiter.join()
  found = facts(results["attacker"])
  assert found["pids"] == [1, 2] and found["waiting"] == "ENOENT", found
  assert results["waiting"].status == "error: RuntimeError: the waiting program's own end", results
  assert not results["waiting"].passed


@pytest.mark.subprocess
@needs_bwrap
def test_no_process_outlives_the_run_and_forks_are_capped():
  """Forked children (C library fork, past the guard) that sleep die with
  the run; at most NPROC tasks exist at once."""
  marker = "lx" + uuid.uuid4().hex[:10]
  program = f"""
      import ctypes, time
      libc = ctypes.CDLL(None, use_errno=True)
      made = 0
      for _ in range(40):
          pid = libc.fork()
          if pid == 0:
              libc.prctl(15, {marker.encode()!r}, 0, 0, 0)  # PR_SET_NAME
              time.sleep(60)
              libc._exit(0)
          made += pid > 0
      raise RuntimeError(made)
  """
  result = run(program)
  made = int(result.status.split("RuntimeError: ", 1)[1])
  assert 1 <= made < sandbox.NPROC, result
  assert marker not in process_names()


def process_names():
  """The names (``/proc/PID/comm``) of the machine's processes."""
  names = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/comm") as f:
        names.append(f.read().strip())
    except OSError:
      pass
  return names


@pytest.mark.subprocess
@needs_bwrap
def test_orphans_die_when_bwrap_exited_before_the_cleanup(monkeypatch):
  """The timing a loaded machine makes: the program exits (so bwrap exits)
  while its forked children live on under the namespace's first process,
  before the caller cleans up. The first process, now the machine init's
  child, is still found (by its PID namespace) and killed with them."""
  marker = "lx" + uuid.uuid4().hex[:10]
  close = sandbox._Proc.close

  def late_close(self):
    deadline = time.monotonic() + 30
    while self.popen.poll() is None and time.monotonic() < deadline:
      time.sleep(0.01)
    assert self.popen.poll() is not None, "bwrap did not exit with its program"
    close(self)

  monkeypatch.setattr(sandbox._Proc, "close", late_close)
  result = run(
    f"""
      import ctypes, time
      libc = ctypes.CDLL(None, use_errno=True)
      if libc.fork() == 0:
          libc.prctl(15, {marker.encode()!r}, 0, 0, 0)  # PR_SET_NAME
          time.sleep(60)
          libc._exit(0)
      raise RuntimeError("the program ends, its child does not")
    """
  )
  assert "RuntimeError" in result.status, result
  assert marker not in process_names()


@pytest.mark.subprocess
@needs_bwrap
def test_answers_written_before_the_calls_answer_nothing():
  """A program that claims to have loaded and writes the right answers for
  add's checks (5, 0) before any call, then exits. Waiting first lets the
  checker be ready, so the lines stay in the caller's buffer until the calls
  come (the timing a loaded machine made, which once passed this wrong
  program): no line carries the call's nonce, so none answers a call."""
  result = judge(
    """
      import os, time
      time.sleep(1.5)
      for fd in map(int, os.listdir("/proc/self/fd")):
          try:
              os.write(fd, b'{"loaded": true}\\n{"value": 5}\\n{"value": 0}\\n')
          except OSError:
              pass
      os._exit(0)
    """
  )
  assert not result.passed, result
  assert result.status == "error: the program sent a line that answers no call", result


@pytest.mark.subprocess
@needs_bwrap
def test_time_limit_holds_with_signals_blocked():
  result = run(
    """
      import signal
      signal.pthread_sigmask(signal.SIG_BLOCK, range(1, signal.NSIG))
      while True:
          pass
  """,
    timeout=1.0,
  )
  assert not result.passed and result.status == "timeout", result


@pytest.mark.subprocess
@needs_bwrap
def test_memory_and_the_work_directory_are_bounded():
  assert run("x = bytearray(10 * 1024 ** 3)").status == "memory"
  result = run("""
      with open("/work/fill", "wb") as f:
          for _ in range(1400):
              f.write(b"x" * (1 << 20))
  """)
  assert not result.passed and ("File too large" in result.status or "No space" in result.status), (
    result
  )


@pytest.mark.subprocess
@needs_bwrap
def test_the_process_trees_memory_is_bounded():
  """The program (HumanEval's path) forks (C library, past the guard) as many
  children as the task cap allows, each writing 200 MiB and holding it. At
  most NPROC - 1 children exist (the program is a task too), each within its
  MEMORY_MB address space, so the tree holds at most NPROC x MEMORY_MB (8 x
  256 MiB). The worst case docs/evaluation.md states for one sandbox: 8 x
  256 MiB of address space plus the 64 MiB work tmpfs plus kernel buffers of
  8 x 64 descriptors. The run ends, the verdict is a fail and no child
  outlives it."""
  marker = "lx" + uuid.uuid4().hex[:10]
  program = f"""
      import ctypes, errno, json, os
      libc = ctypes.CDLL(None, use_errno=True)
      r, w = os.pipe()
      made, refused = 0, None
      for _ in range(40):
          pid = libc.fork()
          if pid == 0:
              libc.prctl(15, {marker.encode()!r}, 0, 0, 0)  # PR_SET_NAME
              try:
                  held = b"\\1" * (200 << 20)  # written, so resident
                  os.write(w, b"t")
              except MemoryError:
                  os.write(w, b"m")
              while True:
                  libc.pause()
          if pid < 0:
              refused = errno.errorcode[ctypes.get_errno()]
              break
          made += 1
      got = b""
      while len(got) < made:  # one byte from each child, once it holds its 200 MiB
          got += os.read(r, made - len(got))
      raise RuntimeError(json.dumps({{"made": made, "touched": got.count(b"t"), "refused": refused}}))
  """
  result = judge(program, timeout=120.0)
  assert not result.passed, result
  found = facts(result)
  assert 1 <= found["made"] <= sandbox.NPROC - 1 and found["refused"] == "EAGAIN", found
  assert found["touched"] == found["made"], found  # 200 MiB fits one process's limit
  assert sandbox.NPROC * sandbox.MEMORY_MB <= 2048  # the documented 8 x 256 MiB
  assert marker not in process_names()


@pytest.mark.subprocess
@needs_bwrap
def test_a_flood_does_not_grow_the_caller():
  """Over-long lines end the run; endless valid lines are never buffered."""
  flood = """
      import os
      fds = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
      for fd in fds:
          try:
              {}
          except OSError:
              pass
  """
  tracemalloc.start()
  try:
    long_line = run(flood.format("[os.write(fd, b'x' * (1 << 20)) for _ in range(40)]"))
    many = judge(
      WRONG_ADD
      + textwrap.dedent(
        flood.format("[os.write(fd, b'{\"value\": 5}\\\\n' * 100000) for _ in range(20)]")
      )
    )
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert not long_line.passed and "over" in long_line.status, long_line
  assert not many.passed, many
  assert peak < 16 * sandbox.MAX_MESSAGE, peak


@pytest.mark.subprocess
@needs_bwrap
def test_a_flood_while_answering_does_not_grow_the_caller():
  """The candidate floods valid answer lines from inside its call (HumanEval's
  path, run_test): the caller relays one line per call and reads the program
  only while it awaits an answer, so the rest of the flood (31 MB) stays in
  the program, blocked on a full pipe, while the checker works. The lines
  carry the first call's nonce (read from the runner's frame): the first
  answers add(2, 3) (5, right); the next, read at the second call, answers
  no call: a fail."""
  program = """
      def add(a, b):
          import os, sys
          nonce = sys._getframe(1).f_locals["nonce"]
          line = ('{"nonce": "%s", "value": 5}\\n' % nonce).encode() * 100000
          for fd in range(3, 64):
              try:
                  for _ in range(20):
                      os.write(fd, line)
              except OSError:
                  pass
          return a - b
  """
  # The pause gives a caller that read the program between calls time to take in the flood.
  test = (
    "def check(candidate):\n    import time\n    assert candidate(2, 3) == 5\n"
    "    time.sleep(2)\n    assert candidate(-1, 1) == 0\n"
  )
  tracemalloc.start()
  try:
    result = sandbox.run_test(textwrap.dedent(program), ADD_PROMPT, test, "add", timeout=60.0)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert not result.passed, result
  assert result.status == "error: the program sent a line that answers no call", result
  assert peak < 4 * sandbox.MAX_MESSAGE, peak


def test_plain_data_round_trips_and_nothing_else_passes():
  values = [
    None,
    True,
    3,
    -2.5,
    float("inf"),
    "é",
    b"\x00\xff",
    (1, [2, {"a": {3}}]),
    frozenset({1}),
    {(1, 2): [1.5]},
    1 + 2j,
    [[[]]],
  ]
  for value in values:
    back = sandbox_child.decode(json.loads(json.dumps(sandbox_child.encode(value))))
    assert back == value and type(back) is type(value)

  class Int(int):
    pass

  for bad in (Int(3), [Int(3)], object(), iter([1]), {"k": lambda: 1}):
    with pytest.raises(sandbox_child.NotPlainData):
      sandbox_child.encode(bad)
  for bad in ({"eval": "1"}, {"tuple": 3}, {"a": 1, "b": 2}, {"dict": [[1]]}):
    with pytest.raises(sandbox_child.NotPlainData):
      sandbox_child.decode(bad)


def test_without_bubblewrap_nothing_runs(monkeypatch, tmp_path):
  monkeypatch.setattr(sandbox, "BWRAP", "no-such-bwrap")
  marker = tmp_path / "ran"
  program = f"import ctypes\nctypes.CDLL(None).open({str(marker).encode()!r}, 0o101, 0o644)\n"
  with pytest.raises(sandbox.SandboxUnavailable, match="no no-such-bwrap on PATH"):
    sandbox.run_program(program)
  with pytest.raises(sandbox.SandboxUnavailable, match="--unsafe_no_sandbox"):
    sandbox.run_test(program, ADD_PROMPT, ADD_TEST, "add")
  assert not marker.exists()
  unsafe = sandbox.run_program(program, unsafe=True)  # the explicit opt-out runs it
  assert unsafe.passed and marker.exists() and unsafe.isolation["sandbox"].startswith("none")


CHECK_AVAILABLE = """
import json
from laplax import sandbox
try:
  sandbox.check_available()
  print(json.dumps({"refused": None}))
except sandbox.SandboxUnavailable as e:
  print(json.dumps({"refused": str(e)}))
"""


def _refusal(unshare_args: list, setup: str) -> str:
  """check_available()'s refusal in a process started by ``unshare
  UNSHARE_ARGS sh -c SETUP`` (which then runs Python)."""
  r = subprocess.run(
    ["unshare", *unshare_args, "sh", "-c", setup + ' && exec "$0" -c "$1"', sys.executable]
    + [CHECK_AVAILABLE],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=300,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  refused = json.loads(r.stdout.splitlines()[-1])["refused"]
  assert refused is not None and "\n" not in refused
  assert refused.endswith("; or pass --unsafe_no_sandbox"), refused
  return refused


@pytest.mark.skipif(
  os.geteuid() != 0 or shutil.which("unshare") is None or _available() is not None,
  reason="needs root, util-linux unshare and a working sandbox (to mask /proc here)",
)
def test_a_masked_proc_is_named_as_the_cause():
  """A container masks paths of /proc (Docker binds /dev/null over /proc/keys):
  the kernel then refuses a new /proc in a new user namespace. The refusal
  names the mount (bubblewrap's own line), not user namespaces."""
  refused = _refusal(["--mount", "--propagation", "private"], "mount --bind /dev/null /proc/keys")
  assert "can create namespaces but cannot mount /proc in them" in refused, refused
  assert "Can't mount proc" in refused and "masked" in refused and "sysctl" not in refused


@pytest.mark.skipif(
  shutil.which("unshare") is None or _available() is not None,
  reason="needs util-linux unshare and a working sandbox",
)
def test_namespaces_that_cannot_be_made_are_named_as_the_cause():
  """In a user namespace whose user.max_user_namespaces is 0 no namespace can
  be made: the refusal says so and how to enable them."""
  refused = _refusal(["--user", "--map-root-user"], "echo 0 > /proc/sys/user/max_user_namespaces")
  assert "cannot create namespaces (bwrap: " in refused and "sysctl" in refused, refused
  assert "/proc" not in refused.split("(bwrap:")[0]
  assert sandbox._why_not(shutil.which(sandbox.BWRAP)) == ""  # both steps work here


def test_unsafe_cleanup_survives_5000_nested_directories(monkeypatch):
  """The caller removes what the program left, however deep (on a tmpfs when
  there is one: removing 5000 levels on ext4 takes seconds)."""
  base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
  tmp_path = tempfile.mkdtemp(dir=base)
  monkeypatch.setattr(tempfile, "tempdir", tmp_path)
  result = sandbox.run_program(
    textwrap.dedent("""
      import ctypes
      libc = ctypes.CDLL(None)
      for _ in range(5000):
          libc.mkdir(b"d", 0o700)
          libc.chdir(b"d")
  """),
    unsafe=True,
  )
  assert result.passed, result
  assert os.listdir(tmp_path) == []
  os.rmdir(tmp_path)


@pytest.mark.subprocess
def test_command_line_refuses_in_one_line_without_bubblewrap(tmp_path):
  program = tmp_path / "p.py"
  program.write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
  env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": ROOT}
  r = subprocess.run(
    [sys.executable, "-m", "laplax.sandbox", str(program)],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
  )
  assert r.returncode == 2 and r.stdout == ""
  assert r.stderr.count("\n") == 1 and "no bwrap on PATH" in r.stderr, r.stderr
  assert not (tmp_path / "ran").exists()


@pytest.mark.subprocess
@needs_bwrap
def test_command_line_prints_one_json_line(tmp_path):
  program = tmp_path / "p.py"
  program.write_text("assert 1 + 1 == 3, 'arithmetic'\n")
  r = subprocess.run(
    [sys.executable, "-m", "laplax.sandbox", str(program)],
    capture_output=True,
    text=True,
    cwd=ROOT,
  )
  result = json.loads(r.stdout)
  assert r.returncode == 1 and result["status"] == "error: AssertionError: arithmetic"
  bad = subprocess.run(
    [sys.executable, "-m", "laplax.sandbox", "--timeout", "0", str(program)],
    capture_output=True,
    text=True,
    cwd=ROOT,
  )
  assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "time limit" in bad.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_eval_py_refuses_humaneval_without_bubblewrap(tmp_path):
  """eval.py --chat_tasks humaneval on a machine without bwrap: one line,
  exit 2, nothing loaded or written."""
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  try:
    import gpt_shakespeare
  finally:
    sys.path.pop(0)
  from laplax.workdir import files

  config = gpt_shakespeare.get_config()
  config.data.tokenizer = "nanochat"
  files.write_config(config, str(tmp_path))
  before = sorted(os.listdir(tmp_path))
  env = {**os.environ, "PATH": str(tmp_path / "nothing")}
  r = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "eval.py"),
      "--workdir",
      str(tmp_path),
      "--chat_tasks",
      "humaneval",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
  )
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "no bwrap on PATH" in lines[0] and "--unsafe_no_sandbox" in lines[0]
  assert sorted(os.listdir(tmp_path)) == before
  # The opt-out passes the check (and warns); this workdir then has no checkpoint.
  r = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "eval.py"),
      "--workdir",
      str(tmp_path),
      "--chat_tasks",
      "humaneval",
      "--unsafe_no_sandbox",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
  )
  assert r.returncode == 2 and "no bwrap" not in r.stderr and "has no checkpoint" in r.stderr
  assert "warning: --unsafe_no_sandbox" in r.stderr
  assert sorted(os.listdir(tmp_path)) == before


NOBODY_SCRIPT = r"""
import json, os, socket, sys, tempfile
sys.path.insert(0, sys.argv[1])
from laplax import sandbox
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1)
listener.setblocking(False)
target = sys.argv[2]
probe = sandbox.run_program(
    "import ctypes, json, os, _socket\n"
    "libc = ctypes.CDLL(None)\n"
    "s = _socket.socket()\n"
    "try:\n    s.connect(('127.0.0.1', %d)); c = 'connected'\n"
    "except OSError as e:\n    c = type(e).__name__\n"
    "raise RuntimeError(json.dumps([os.getuid(), libc.open(%r.encode(), 0o101, 0o644), c,"
    " len([p for p in os.listdir('/proc') if p.isdigit()])]))\n"
    % (listener.getsockname()[1], target))
forged = sandbox.run_test(
    "def add(a, b):\n    return a - b\nimport os\nfor fd in range(3, 64):\n"
    "    try: os.write(fd, b'{\"status\": \"passed\"}\\n')\n    except OSError: pass\n",
    "def add(a, b):\n    pass\n", "def check(c):\n    assert c(1, 2) == 3\n", "add")
try:
    listener.accept()
    accepted = True
except BlockingIOError:
    accepted = False
print(json.dumps({"uid": os.getuid(), "probe": probe.status, "forged": forged.passed,
                  "accepted": accepted, "user": probe.isolation.get("user")}))
"""


@pytest.mark.subprocess
@needs_bwrap
@pytest.mark.skipif(
  os.geteuid() != 0
  or shutil.which("setpriv") is None
  or not os.access("/usr/bin/python3", os.X_OK),
  reason="needs root, setpriv and /usr/bin/python3 to become nobody",
)
def test_as_nobody_the_same_holds(tmp_path):
  """A non-root caller (nobody, through setpriv, with Debian's Python and this
  checkout): its program is uid 65534 inside, writes nothing outside, makes
  no connection, sees only its own processes, and cannot forge a verdict."""
  os.chmod(tmp_path, 0o777)
  target = str(tmp_path / "evil")
  r = subprocess.run(
    [
      "setpriv",
      "--reuid",
      "65534",
      "--regid",
      "65534",
      "--clear-groups",
      "/usr/bin/python3",
      "-I",
      "-c",
      NOBODY_SCRIPT,
      ROOT,
      target,
    ],
    capture_output=True,
    text=True,
    cwd="/",
  )
  if r.returncode != 0 and "ModuleNotFoundError" in r.stderr:
    pytest.skip("nobody cannot import this checkout: " + r.stderr.splitlines()[-1])
  assert r.returncode == 0, r.stderr[-2000:]
  facts = json.loads(r.stdout)
  uid, opened, connection, pids = json.loads(facts["probe"].split("RuntimeError: ", 1)[1])
  assert facts["uid"] == 65534 and uid == 65534 and "(the caller) outside" in facts["user"]
  assert opened < 0 and connection != "connected" and pids <= 3
  assert not facts["accepted"] and not facts["forged"]
  assert not os.path.exists(target)
