"""laplax.evaluators.sandbox: programs that misbehave are stopped or refused, reported as
not passed, and nothing outside their temporary directory changes.

Each hostile program runs with isolation as this machine allows it and, where
the guard alone must hold, with the namespaces turned off (what a machine
without them gets). Limits are generous and no test asserts a duration.
"""

import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

from laplax.evaluators import sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(source: str, timeout: float = 5.0, **kwargs) -> sandbox.Result:
  return sandbox.run_program(textwrap.dedent(source), timeout=timeout, **kwargs)


def run_each(programs: list) -> list:
  """``run`` of each program, four at a time (each is its own process)."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
    return list(pool.map(run, programs))


def assert_none_passed(programs: list, refusal: tuple) -> None:
  """Runs the programs; each must fail with one of the ``refusal`` errors."""
  for program, result in zip(programs, run_each(programs)):
    assert not result.passed, (program, result)
    assert any(name in result.status for name in refusal), (program, result)


def snapshot(directory) -> dict:
  """Every path under ``directory`` with its mode, size and contents."""
  state = {}
  for parent, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(parent, name)
      st = os.lstat(path)
      body = open(path, "rb").read() if os.path.isfile(path) else None
      state[os.path.relpath(path, directory)] = (st.st_mode, st.st_size, body)
  return state


@pytest.fixture
def sentinel():
  """A directory anyone may reach and write (so that only the sandbox can
  refuse), holding files and a subdirectory; yields its path and checks
  that it is unchanged after the test."""
  root = tempfile.mkdtemp(prefix="laplax-sentinel-")
  try:
    os.mkdir(os.path.join(root, "sub"))
    for name in ("keep.txt", "sub/deep.txt"):
      with open(os.path.join(root, name), "w") as f:
        f.write(name)
      os.chmod(os.path.join(root, name), 0o666)
    for path in (root, os.path.join(root, "sub")):
      os.chmod(path, 0o777)
    before = snapshot(root)
    yield root
    assert snapshot(root) == before
  finally:
    shutil.rmtree(root)


@pytest.fixture(params=["as allowed", "guard only"])
def mode(request, monkeypatch):
  """Runs a test with the namespaces this machine allows, then without."""
  if request.param == "guard only":
    monkeypatch.setattr(sandbox, "NAMESPACES", False)
  return request.param


@pytest.fixture(scope="module")
def isolation() -> dict:
  result = run("pass")
  assert result.passed, result
  return result.isolation


def _nobody_python():
  """An interpreter whose installation ``nobody`` can read (root only)."""
  if os.geteuid() != 0:
    return None
  for python in (sys.executable, "/usr/bin/python3"):
    if os.path.exists(python):
      old = sandbox.PYTHON
      sandbox.PYTHON = python
      try:
        if run("pass").isolation.get("user") == "nobody":
          return python
      finally:
        sandbox.PYTHON = old
  return None


def test_a_correct_program_passes_and_a_wrong_one_fails(mode):
  good, wrong, exits, early, crash = run_each([
      "x = sorted([3, 1, 2])\nassert x == [1, 2, 3]",
      "assert sorted([3, 1, 2]) == [3, 2, 1], 'not sorted'",
      "raise SystemExit(0)",  # nanochat: any BaseException fails
      "import os\nos._exit(0)",  # ends before the sandbox reports success
      "import ctypes\nctypes.string_at(0)"])
  assert good.passed and good.status == "passed", good
  assert not wrong.passed and wrong.status == "error: AssertionError: not sorted"
  assert not exits.passed and exits.status == "error: SystemExit: 0"
  assert not early.passed and early.status.startswith("crashed: exit code 0"), early
  assert not crash.passed and crash.status == "crashed: killed by signal SIGSEGV"


def test_syntax_errors_and_failed_set_up_are_reported(tmp_path):
  syntax = run("def f(:\n  pass")
  assert not syntax.passed and syntax.status.startswith("error: SyntaxError"), syntax
  # The sandboxed interpreter, given a program file that does not exist,
  # reports why on its pipe instead of dying silently.
  read_end, write_end = os.pipe()
  settings = {"program": str(tmp_path / "missing.py"), "work": str(tmp_path),
              "fd": write_end, "timeout": 1.0, "memory": 256 << 20, "namespaces": False}
  done = subprocess.run([sys.executable, "-I", sandbox.CHILD, json.dumps(settings)],
                        pass_fds=(write_end,), capture_output=True, timeout=120)
  os.close(write_end)
  with os.fdopen(read_end) as pipe:
    report = json.loads(pipe.readline())
  assert done.returncode == 1
  assert report["status"].startswith("sandbox: error: FileNotFoundError"), report


def test_program_runs_like_nanochat_exec(tmp_path):
  """``exec(program, {})``: ``__name__`` is not ``"__main__"``, standard
  modules import, the working directory is an empty writable directory."""
  result = run("""
      import collections, hashlib, math, re, typing, os
      import ssl, urllib.request, logging.handlers  # import fine
      import multiprocessing, numpy  # call os.getcwd / os.putenv on import
      assert __name__ != "__main__"
      assert os.listdir(".") == []
      with open("scratch.txt", "w") as f:
        f.write("inside")
      assert open("scratch.txt").read() == "inside"
      os.mkdir("d")
      """)
  assert result.passed, result


def test_loop_forever_is_stopped(mode):
  result = run("while True:\n  pass", timeout=1)
  assert not result.passed and result.status == "timeout"


def test_program_catching_the_timeout_is_killed(mode):
  result = run("""
      import time
      while True:
        try:
          time.sleep(60)
        except BaseException:
          pass
      """, timeout=1)
  assert not result.passed and result.status.startswith("killed: time limit"), result


def test_allocating_10_gb_fails_with_memory_error(mode):
  result = run("x = bytearray(10 * 2**30)\nx[-1] = 1")
  assert not result.passed and result.status == "memory"


def test_guarded_calls_are_refused_outside_imports():
  assert_none_passed(["import os\nos.getcwd()", "import os\nos.putenv('A', '1')",
                      "import os\nos.chdir('/')"], ("SandboxRefused",))


STARTS_PROCESSES = [
    "import os\nos.fork()",
    "import subprocess\nsubprocess.run(['true'])",
    "import os\nos.system('true')",
    "import os\nos.posix_spawn('/bin/true', ['true'], {})",
    "import os\nos.execv('/bin/true', ['true'])",
    "import posix\nposix.fork()",
    "import multiprocessing\np = multiprocessing.Process(target=print)\np.start()\np.join()",
]


def test_starting_processes_is_refused(mode):
  assert_none_passed(STARTS_PROCESSES, ("SandboxRefused",))


def _living(name: str) -> list:
  """Pids of the processes named ``name`` that are not zombies."""
  pids = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as f:
        head, tail = f.read().rsplit(")", 1)
    except (OSError, ValueError):
      continue
    if head.split("(", 1)[1] == name and tail.split()[0] != "Z":
      pids.append(pid)
  return pids


def _all_gone(name: str) -> bool:
  """Whether every process named ``name`` has died (a kill is asynchronous:
  waits for it, up to a minute on a loaded machine)."""
  deadline = time.monotonic() + 60
  while _living(name) and time.monotonic() < deadline:
    time.sleep(0.1)
  return not _living(name)


def test_fork_bomb_through_ctypes_dies_with_the_program(mode, isolation):
  """Forks that bypass the guard (ctypes) end with the program: its process
  group is killed, or (a PID namespace) the kernel kills them all, even the
  ones that left the process group."""
  name = "lpx" + uuid.uuid4().hex[:10]  # a process name (comm) to look for
  leave_group = isolation["processes"] == "pid namespace" and mode == "as allowed"
  result = run(f"""
      import ctypes, time
      libc = ctypes.CDLL(None)
      forked = 0
      for _ in range(20):
        pid = libc.fork()
        if pid == 0:
          libc.prctl(15, b"{name}", 0, 0, 0)  # PR_SET_NAME
          if {leave_group}:
            libc.setsid()
          time.sleep(120)
        forked += pid > 0
      raise RuntimeError(f"forked {{forked}}")
      """)
  try:
    assert not result.passed and result.status == "error: RuntimeError: forked 20", result
    assert _all_gone(name)
  finally:  # a failing sandbox must not leave the test's processes behind
    for pid in _living(name):
      os.kill(int(pid), signal.SIGKILL)


def test_fork_bomb_meets_the_process_limit():
  """As ``nobody``, ``RLIMIT_NPROC`` stops forking at 64 more processes."""
  python = _nobody_python()
  if python is None:
    pytest.skip("no interpreter that the nobody user can read, or not root")
  old, sandbox.PYTHON = sandbox.PYTHON, python
  try:
    result = run("""
        import ctypes, os, time
        libc = ctypes.CDLL(None)
        forked = 0
        for _ in range(200):
          pid = libc.fork()
          if pid == 0:
            time.sleep(600)
          forked += pid > 0
        assert forked == 200, f"forked {forked}"
        """)
  finally:
    sandbox.PYTHON = old
  assert result.isolation["user"] == "nobody"
  forked = int(result.status.rsplit(" ", 1)[-1])
  assert not result.passed and 0 < forked <= sandbox.NPROC, result


@pytest.fixture
def listener():
  server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  server.bind(("127.0.0.1", 0))
  server.listen(8)
  server.setblocking(False)
  yield server
  with pytest.raises(BlockingIOError):  # no connection ever arrived
    server.accept()
  server.close()


def test_socket_to_a_loopback_port_is_refused(listener, mode):
  port = listener.getsockname()[1]
  result = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}))")
  assert not result.passed and "SandboxRefused" in result.status


def test_no_network_even_past_the_guard(listener, isolation):
  """The C-level socket module bypasses the guard; the network namespace
  still has no route to the machine's loopback."""
  if isolation["network"] != "namespace":
    pytest.skip(f"no network namespace here: {isolation['network']}")
  port = listener.getsockname()[1]
  result = run(f"import _socket\n_socket.socket().connect(('127.0.0.1', {port}))")
  assert not result.passed and "Network is unreachable" in result.status, result


def test_reading_standard_input_fails(mode):
  assert_none_passed([
      "input()", "import sys\nsys.stdin.read()", "import sys\nsys.stdin.readline()",
      "import sys\nfor line in sys.stdin:\n  pass",
      "import os\nassert os.read(0, 1) != b''",  # the real descriptor: /dev/null
  ], ("OSError", "AssertionError"))


WRITES_OUTSIDE = [
    "open({new!r}, 'w').write('x')",
    "open({keep!r}, 'a').write('x')",
    "open({keep!r}, 'r+').write('x')",
    "open('../../x', 'w').write('x')",
    "import pathlib\npathlib.Path({new!r}).write_text('x')",
    "import os\nos.open({new!r}, os.O_CREAT | os.O_WRONLY)",
    "import io\nio.FileIO({keep!r}, 'w')",
    "import os\nos.mkdir({new!r})",
    "import os\nos.makedirs({new!r} + '/a/b')",
    "import os\nos.utime({keep!r}, (0, 0))",
    "import os\nos.symlink('x', {new!r})",
    "import os\nos.link('../../x', 'here')",
    "import shutil\nopen('here', 'w').write('x')\nshutil.copy('here', {new!r})",
    "import os\nos.symlink({keep!r}, 'link')\nopen('link', 'w').write('x')",
    "import os\nos.truncate({keep!r}, 0)",
    "import os\nos.chmod({keep!r}, 0)",
]


def test_writes_outside_the_temporary_directory_are_refused(sentinel):
  keep, new = os.path.join(sentinel, "keep.txt"), os.path.join(sentinel, "new")
  assert_none_passed([p.format(keep=keep, new=new) for p in WRITES_OUTSIDE],
                     ("PermissionError", "SandboxRefused"))


def test_one_write_outside_without_namespaces(sentinel, monkeypatch):
  monkeypatch.setattr(sandbox, "NAMESPACES", False)
  result = run(f"open({os.path.join(sentinel, 'keep.txt')!r}, 'w').write('x')")
  assert not result.passed and "PermissionError" in result.status


PAST_THE_GUARD = [  # calls of the C library: only the kernel can refuse them
    "libc.open({new!r}, 0o101, 0o644)",  # O_CREAT | O_WRONLY
    "libc.unlink({keep!r})",
    "libc.rename({keep!r}, {new!r})",
    "libc.rmdir({sub!r})",
    "libc.mkdir({new!r}, 0o777)",
    "libc.open({shm!r}, 0o101, 0o644)",  # a tmpfs of its own
]


def test_writes_past_the_guard_are_refused_by_the_kernel(sentinel, isolation):
  """With the files read-only but the temporary directory (a mount namespace),
  writes through ``ctypes`` fail with ``EROFS``, whoever the program runs as."""
  if not isolation["files"].startswith("read-only"):
    pytest.skip(f"no read-only mount namespace here: {isolation['files']}")
  shm = f"/dev/shm/laplax-sandbox-{uuid.uuid4().hex}"
  paths = {"keep": os.path.join(sentinel, "keep.txt").encode(),
           "new": os.path.join(sentinel, "new").encode(),
           "sub": os.path.join(sentinel, "sub").encode(), "shm": shm.encode()}
  programs = ["import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               f"if {template.format(**paths)} >= 0:\n"
               "  raise RuntimeError('the call succeeded')\n"
               "raise OSError(ctypes.get_errno(), '')" for template in PAST_THE_GUARD]
  try:
    for program, result in zip(programs, run_each(programs)):
      assert result.status == "error: OSError: [Errno 30]", (program, result)
    assert not os.path.exists(shm)
  finally:
    if os.path.exists(shm):
      os.remove(shm)


def test_writes_past_the_guard_refused_as_nobody(sentinel, monkeypatch):
  """As ``nobody`` without namespaces, a write through ``ctypes`` into a
  directory only root may write is refused by the kernel (``EACCES``)."""
  python = _nobody_python()
  if python is None:
    pytest.skip("no interpreter that the nobody user can read, or not root")
  target = os.path.join(sentinel, "sub")
  os.chmod(target, 0o755)
  monkeypatch.setattr(sandbox, "PYTHON", python)
  monkeypatch.setattr(sandbox, "NAMESPACES", False)
  result = run(f"""
      import ctypes
      libc = ctypes.CDLL(None, use_errno=True)
      fd = libc.open({os.path.join(target, "new").encode()!r}, 0o101, 0o644)
      assert fd >= 0, ctypes.get_errno()
      """)
  os.chmod(target, 0o777)  # as the sentinel fixture left it
  assert result.isolation["user"] == "nobody"
  assert not result.passed and result.status == "error: AssertionError: 13"  # EACCES


DELETES = [
    "import os\nos.system('rm -rf {root}')",
    "import shutil\nshutil.rmtree({root!r})",
    "import shutil\nshutil.move({keep!r}, 'here')",
    "import os\nos.remove({keep!r})",
    "import os\nos.unlink({keep!r})",
    "import os\nos.rmdir({root!r} + '/sub')",
    "import os\nos.removedirs({root!r} + '/sub')",
    "import os\nos.rename({keep!r}, {root!r} + '/moved')",
    "import os\nos.replace({keep!r}, {root!r} + '/moved')",
    "import subprocess\nsubprocess.run(['rm', '-rf', {root!r}])",
    "import os\nos.execv('/bin/rm', ['rm', '-rf', {root!r}])",
]


def test_deleting_files_is_refused(sentinel):
  keep = os.path.join(sentinel, "keep.txt")
  assert_none_passed([p.format(root=sentinel, keep=keep) for p in DELETES],
                     ("SandboxRefused",))


def test_rm_rf_without_namespaces(sentinel, monkeypatch):
  monkeypatch.setattr(sandbox, "NAMESPACES", False)
  result = run(f"import os\nos.system('rm -rf {sentinel}')")
  assert not result.passed and "SandboxRefused" in result.status


_PARENT = """
import json, os, sys
sys.path.insert(0, {root!r})
from laplax.evaluators import sandbox
sandbox.NAMESPACES = {namespaces}
for program in {programs!r}:
  result = sandbox.run_program(program.replace("PARENT", str(os.getpid())))
  print(json.dumps([program, result.passed, result.status]), flush=True)
"""
KILLS_PARENT = [
    "import os, signal\nos.kill(PARENT, signal.SIGKILL)",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "import os, signal\nos.killpg(0, signal.SIGKILL)",
    "import os, signal\nos.killpg(os.getpgid(PARENT), signal.SIGKILL)",
]
# Past the guard: only a PID namespace (or another user) keeps the caller safe.
KILLS_PARENT_THROUGH_CTYPES = "import ctypes\nassert ctypes.CDLL(None).kill(PARENT, 9) == 0"


def test_killing_the_parent_is_refused(mode, isolation):
  """The caller outlives programs that signal it (``PARENT``: its pid): a
  separate process runs them and reports each."""
  namespaces = mode == "as allowed"
  programs = list(KILLS_PARENT)
  if namespaces and isolation["processes"] == "pid namespace":
    programs.append(KILLS_PARENT_THROUGH_CTYPES)
  script = _PARENT.format(root=ROOT, namespaces=namespaces, programs=programs)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  reports = [json.loads(line) for line in done.stdout.splitlines()]
  assert [r[0] for r in reports] == programs  # the caller ran them all
  for program, passed, status in reports:
    assert not passed and status.startswith("error: "), (program, status)


def test_temporary_directory_is_removed(tmp_path, monkeypatch):
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  import tempfile
  monkeypatch.setattr(tempfile, "tempdir", None)
  assert run("open('left', 'w').write('x')").passed
  assert os.listdir(tmp_path) == []


def test_limits_must_be_positive():
  with pytest.raises(sandbox.SandboxError, match="time limit"):
    sandbox.run_program("pass", timeout=0)
  with pytest.raises(sandbox.SandboxError, match="memory limit"):
    sandbox.run_program("pass", memory_mb=-1)


def test_command_line_prints_one_json_line(tmp_path):
  good, bad = tmp_path / "good.py", tmp_path / "bad.py"
  good.write_text("assert 2 + 2 == 4\n")
  bad.write_text("assert 2 + 2 == 5\n")
  for path, code in ((good, 0), (bad, 1)):
    done = subprocess.run([sys.executable, "-m", "laplax.evaluators.sandbox", str(path),
                           "--timeout", "5", "--memory-mb", "256"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == {"passed", "status", "seconds", "isolation"}
    assert result["passed"] is (code == 0)


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: file"),
    (["missing.py"], "cannot read the program missing.py"),
    (["{good}", "--timeout", "soon"], "argument --timeout: invalid float value"),
    (["{good}", "--timeout", "-1"], "the time limit must be a positive number"),
    (["{good}", "--memory-mb", "0"], "the memory limit must be a positive number"),
    (["{good}", "--network"], "unrecognized arguments: --network"),
    (["{binary}"], "cannot read the program"),
])
def test_command_line_bad_input_is_one_line_exit_2(argv, message, tmp_path,
                                                  monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "good.py").write_text("pass\n")
  (tmp_path / "binary.py").write_bytes(b"\xff\xfe\x00")
  argv = [a.format(good=tmp_path / "good.py", binary=tmp_path / "binary.py")
          for a in argv]
  assert sandbox.main(argv) == sandbox.USAGE_EXIT
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and message in err, err
