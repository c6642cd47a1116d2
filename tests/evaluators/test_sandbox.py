"""laplax.evaluators.sandbox: each attack of issue 41 run as a real process
under bubblewrap (as this machine's user; root here): nothing outside the
work directory is read or written, no connection is made, no process
outlives the run, the caller's memory stays bounded, every wrong HumanEval
answer fails whatever it forges, and without bubblewrap nothing runs.

No test asserts a duration; limits are generous."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
import uuid

import pytest

from laplax.evaluators import sandbox, sandbox_child

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
        import _socket
        errors = []
        for family, address in ((_socket.AF_INET, ("127.0.0.1", {tcp.getsockname()[1]})),
                                (_socket.AF_UNIX, {path!r}), (_socket.AF_UNIX, "\\0" + {path!r})):
            s = _socket.socket(family, _socket.SOCK_STREAM)
            try:
                s.connect(address)
                errors.append("connected")
            except OSError as e:
                errors.append(type(e).__name__)
        raise RuntimeError(" ".join(errors))
    """
    result = run(program)
    assert "connected" not in result.status and "Error" in result.status, result
    for listener in (tcp, unix):
      with pytest.raises(BlockingIOError):
        listener.accept()
  finally:
    tcp.close()
    unix.close()
    os.unlink(path)


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
    [sys.executable, "-m", "laplax.evaluators.sandbox", str(program)],
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
    [sys.executable, "-m", "laplax.evaluators.sandbox", str(program)],
    capture_output=True,
    text=True,
    cwd=ROOT,
  )
  result = json.loads(r.stdout)
  assert r.returncode == 1 and result["status"] == "error: AssertionError: arithmetic"
  bad = subprocess.run(
    [sys.executable, "-m", "laplax.evaluators.sandbox", "--timeout", "0", str(program)],
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
from laplax.evaluators import sandbox
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
