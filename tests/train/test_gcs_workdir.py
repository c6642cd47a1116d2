"""``--workdir gs://BUCKET/PATH`` against a real GCS emulator on 127.0.0.1.

``gcp-storage-emulator`` runs in a process of its own, behind the
:class:`helpers.gcs.FaultProxy` that answers chosen requests with 503, 429
or 403 as a failing GCS does. The emulator ignores ``ifGenerationMatch``, so
the preconditions are checked as the requests that carry them (a real GCS
answers 412 to a second create). No test may leave a local folder ``gs:``.
"""

import importlib.util
import json
import os
import signal
import time

import numpy as np
import pytest

# Not imported here: gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT (the fixture's) at import.
if not all(importlib.util.find_spec(m) for m in ("gcsfs", "gcp_storage_emulator")):
  pytest.skip(
    "needs gcsfs and gcp-storage-emulator (requirements-test.txt)", allow_module_level=True
  )

from laplax import store  # noqa: E402
from laplax.workdir import files, lease  # noqa: E402
from laplax.workdir import lock as lock_lib  # noqa: E402

from helpers.gcs import gcs_fixture  # noqa: E402, F401  (the fixture gcs)
from helpers.resume import assert_bitwise_equal, start  # noqa: E402
from helpers.runs import CONFIG, ROOT, TINY, run_in_process  # noqa: E402

# Every step logged, a checkpoint every 3 steps (as tests/train/test_resume.py).
COMMON = ["--config.log_every=1", "--config.checkpoint_every=3", "--config.eval_every=1000"]
TOTAL = 9


@pytest.fixture(autouse=True)
def _no_local_gs_folder(gcs):
  """After every test: no folder ``gs:`` where a path was mistaken for a local one."""
  gcs.proxy.clear()
  yield
  gcs.proxy.clear()
  for where in {ROOT, os.getcwd()}:
    assert not os.path.exists(os.path.join(where, "gs:")), where


def _url(gcs, name):
  return f"gs://{gcs.bucket}/{name}"


def _args(workdir, data_dir, *extra):
  return (
    ["train.py", "--config", CONFIG, "--workdir", str(workdir)]
    + [f"--config.data.data_dir={data_dir}"]
    + TINY
    + COMMON
    + [f"--config.total_steps={TOTAL}", "--config.data.eval_split=test[:500]"]
    + list(extra)
  )


def _train_records(workdir):
  """The train records without the timing fields (wall-clock rates differ per run)."""
  out = []
  for line in files.read_metric_lines(str(workdir)):
    r = json.loads(line)
    if r["split"] == "train":
      out.append({k: v for k, v in r.items() if k not in ("steps_per_sec", "data_wait_fraction")})
  return out


def _saved_state(workdir, step=None):
  """``(step, {path: array})`` of a checkpoint (default the newest), local or gs://."""
  import jax
  import orbax.checkpoint as ocp

  ckpt = store.join(str(workdir), "checkpoints")
  if step is None:
    step = max(int(n) for n in store.listdir(ckpt) if n.isdigit())
  tree = ocp.StandardCheckpointer().restore(store.join(ckpt, str(step), "state"))
  name = lambda path: "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
  flat = {name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  return step, flat


def test_small_files_are_single_objects_and_creates_are_conditional(gcs):
  """write/read/list/remove through the one path layer; create and replace send
  ``ifGenerationMatch`` (0: absent; G: still generation G)."""
  w = _url(gcs, "layer")
  store.write(store.join(w, "config.json"), '{"a": 1}')
  assert store.read_text(store.join(w, "config.json")) == '{"a": 1}'
  assert store.isdir(w) and not store.isfile(w) and store.listdir(w) == ["config.json"]
  gen = store.create(store.join(w, "train.lock"), "x")
  assert gen == store.generation(store.join(w, "train.lock"))
  new = store.replace(store.join(w, "train.lock"), "y", gen)
  assert new != gen and store.read_text(store.join(w, "train.lock")) == "y"
  sent = [line for line in gcs.proxy.seen if "train.lock" in line or "ifGenerationMatch" in line]
  assert any("ifGenerationMatch=0" in line for line in sent), sent
  assert any(f"ifGenerationMatch={gen}" in line for line in sent), sent
  store.rmtree(w)
  assert store.listdir(w) == [] and not store.exists(w)


def test_503_and_429_are_retried(gcs):
  """An upload answered 503, then 429, is retried (gcsfs's backoff) and lands once."""
  path = store.join(_url(gcs, "retry"), "eval.json")
  gcs.proxy.fail(503, 1, match="upload")
  gcs.proxy.fail(429, 1, match="upload")
  store.write(path, "{}")
  assert [s for s, _ in gcs.proxy.failed[-2:]] == [503, 429]
  assert store.read_text(path) == "{}"


def test_missing_bucket_and_forbidden_are_one_line_with_nothing_lost(gcs, fmnist_data_dir, capfd):
  """train.py on a bucket that does not exist, and on a store answering 403:
  exit 2, one ``error:`` line naming the bucket and the fix; what was there stays."""
  r = run_in_process(_args("gs://no-such-bucket/run", fmnist_data_dir), capfd)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "gs://no-such-bucket does not exist" in lines[0], r.stderr[-2000:]
  w = _url(gcs, "forbidden")
  store.write(store.join(w, "config.json"), "{}")
  gcs.proxy.fail(403, 1000)
  try:
    r = run_in_process(_args(w, fmnist_data_dir), capfd)
  finally:
    gcs.proxy.clear()
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "permission denied" in lines[0] and "403" in lines[0], r.stderr
  assert (
    store.listdir(w) == ["config.json"] and store.read_text(store.join(w, "config.json")) == "{}"
  )


def test_exit_line_counts_only_committed_steps(gcs):
  """The exit line of a hard stop (:func:`laplax.signals.checkpoint_status`) on
  gs://: a step directory is complete once orbax's ``commit_success.txt`` is
  in it; one without it (a write cut short, or still being committed) is named
  as the unfinished write, never as the last complete checkpoint."""
  from laplax import signals

  w = _url(gcs, "status")
  ckpt = store.join(w, "checkpoints")
  store.write(store.join(ckpt, "3", "state", "x"), "x")
  assert signals.checkpoint_status(w) == (
    f"no checkpoint saved in {w}; the unfinished write of step 3 is ignored and removed at "
    f"the next start"
  )
  for step in ("0", "3"):
    store.write(store.join(ckpt, step, "commit_success.txt"), "ok")
  store.write(store.join(ckpt, "6", "state", "x"), "x")
  assert signals.checkpoint_status(w) == (
    f"last complete checkpoint: step 3 in {ckpt}, later steps not saved; the unfinished "
    f"write of step 6 is ignored and removed at the next start"
  )


def _lock_record(host, pid, renewed, lease_s=60.0):
  return {"host": host, "pid": pid, "started": renewed, "renewed": renewed, "lease_s": lease_s}


def test_second_writer_is_refused_and_a_stale_lease_is_taken_over(gcs, caplog):
  """A live lock (this process, or another host within its lease) refuses a
  start in one line; one whose lease ran out is taken over with a warning,
  renewed by the heartbeat (generation-checked) and removed on release."""
  import socket

  w = _url(gcs, "locked")
  path = store.join(w, lock_lib.LOCK_FILE)
  store.write(path, json.dumps(_lock_record(socket.gethostname(), os.getppid(), time.time())))
  with pytest.raises(lock_lib.LockError, match=f"process {os.getppid()} on host"):
    lock_lib.check(w)
  store.write(path, json.dumps(_lock_record("tpu-vm-7", 12, time.time())))
  with pytest.raises(lock_lib.LockError, match="tpu-vm-7.*lease runs"):
    lock_lib.WorkdirLock(w).__enter__()
  store.write(path, json.dumps(_lock_record("tpu-vm-7", 12, time.time() - 61)))
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("LAPLAX_LOCK_LEASE_S", "0.4")
    held = lock_lib.WorkdirLock(w).__enter__()
  try:
    assert "whose lease ran out" in caplog.text
    first = lease.read(path)
    assert first[0]["token"] == held.record["token"] and first[0]["lease_s"] == 0.4
    deadline = time.monotonic() + 60
    while lease.read(path)[1] == first[1] and time.monotonic() < deadline:
      time.sleep(0.05)
    renewed = lease.read(path)
    assert renewed[1] != first[1] and renewed[0]["renewed"] > first[0]["renewed"]
    assert renewed[0]["token"] == held.record["token"]
    with pytest.raises(lock_lib.LockError, match=f"in use|process {os.getpid()}"):
      lock_lib.WorkdirLock(w).__enter__()  # a second writer while the first holds it
    assert lease.read(path)[0]["token"] == held.record["token"]
  finally:
    held.release()
  assert not store.exists(path)


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigkill_on_gs_resumes_to_the_local_runs_metrics_and_state_bitwise(
  gcs, tmp_path, fmnist_data_dir, capfd
):
  """A run on gs:// killed with SIGKILL, then the same command: the final state
  and the train records (but their timing fields) equal the uninterrupted local
  run's bit for bit; eval.py, laplax.load and config.init_from read the gs://
  workdir."""
  local = tmp_path / "local"
  r = run_in_process(_args(local, fmnist_data_dir), capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  w = _url(gcs, "runs/vit")
  args = _args(w, fmnist_data_dir)
  proc = start(args, tmp_path / "killed.log")
  deadline = time.monotonic() + 240
  while proc.poll() is None and time.monotonic() < deadline:
    if any(json.loads(l)["step"] >= 5 for l in files.read_metric_lines(w)):
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  log = (tmp_path / "killed.log").read_text()
  assert store.exists(store.join(w, lock_lib.LOCK_FILE)), log[-3000:]  # left by the kill
  r = run_in_process(args, capfd)  # same host, dead process: taken over at once
  assert r.returncode == 0, r.stderr[-3000:] + log[-3000:]
  assert "resumed from step" in r.stderr + r.stdout, r.stderr[-3000:]
  assert _train_records(w) == _train_records(local)
  ref_step, ref = _saved_state(local)
  step, state = _saved_state(w)
  assert step == ref_step == TOTAL
  assert_bitwise_equal(ref, state)
  assert not store.exists(store.join(w, lock_lib.LOCK_FILE))
  assert any(n.startswith("events.out") for n in store.listdir(store.join(w, "tensorboard")))

  r = run_in_process(["eval.py", "--workdir", w], capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  on_gs = json.loads(store.read_text(store.join(w, "eval.json")))
  r = run_in_process(["eval.py", "--workdir", str(local)], capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  assert on_gs == json.loads((local / "eval.json").read_text())

  ft = tmp_path / "finetuned"
  r = run_in_process(
    _args(ft, fmnist_data_dir, f"--config.init_from={w}", "--config.total_steps=1"), capfd
  )
  assert r.returncode == 0, r.stderr[-3000:]
  initial = _saved_state(ft, 0)[1]
  params = [k for k in state if k.startswith("params/")]
  assert params and all(np.array_equal(initial[k], state[k]) for k in params)

  import laplax

  a, b = laplax.load(w), laplax.load(str(local))
  assert a.step == b.step == TOTAL
  for x, y in zip(
    __import__("jax").tree_util.tree_leaves(a.params),
    __import__("jax").tree_util.tree_leaves(b.params),
    strict=True,
  ):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_local_only_folders_refuse_gs_in_one_line(gcs, tmp_path, capfd):
  """A gs:// TFDS data_dir (read by grain's array_record source from local
  disk): one line naming the copy to make, nothing written. The chat takes a
  gs:// workdir that exists; the sweep one of a bucket that exists
  (tests/cli/test_sweep_gcs.py runs one)."""
  r = run_in_process(_args(tmp_path / "run", _url(gcs, "tfds")), capfd)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "gcloud storage cp -r gs://" in lines[0], r.stderr[-2000:]
  assert not (tmp_path / "run").exists() and store.listdir(_url(gcs, "tfds")) == []
  from laplax import sweep
  from laplax.proj.nanochat.chat import cli as chat_cli

  args = sweep._parse_args(["--config", CONFIG, "--workdir", _url(gcs, "sweep/"), "--seeds", "0"])
  assert args.workdir == _url(gcs, "sweep")
  with pytest.raises(store.StoreError, match="bucket gs://no-such-bucket does not exist"):
    sweep._check_sweep_file(
      sweep._parse_args(["--config", CONFIG, "--workdir", "gs://no-such-bucket/s"])
    )
  args = chat_cli.parser().parse_args(["--workdir", _url(gcs, "chat")])
  with pytest.raises(Exception, match=f"--workdir {args.workdir} is not a directory"):
    chat_cli.check(args)
  store.write(store.join(args.workdir, "config.json"), "{}")
  chat_cli.check(args)


def test_an_unreachable_store_is_one_line_naming_the_network():
  """A connection that fails (here: refused by a closed port on 127.0.0.1, as a
  failed DNS lookup fails) is worded as the network's fault, not the bucket's,
  and gcsfs's own retry tracebacks are silenced."""
  import asyncio
  import logging
  import socket

  import aiohttp

  with socket.socket() as s:  # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]

  async def connect():
    async with aiohttp.ClientSession() as session:
      await session.get(f"http://127.0.0.1:{port}/b/x")

  try:
    asyncio.run(connect())
  except aiohttp.ClientConnectionError as e:
    refused = e
  with pytest.raises(store.StoreError) as info:
    with store.errors("gs://bucket/run/train.lock"):
      raise refused
  message = str(info.value)
  assert message.startswith("cannot reach the object store") and "\n" not in message
  assert "gs://bucket/run/train.lock" in message and "network" in message
  store._gcs()
  assert logging.getLogger("gcsfs").getEffectiveLevel() > logging.ERROR
