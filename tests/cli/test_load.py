"""``laplax.load(workdir, step=None)``: a trained run in Python, on one device.

Tiny ViT, GPT and DINO runs are trained with ``train.py`` and evaluated with
``eval.py`` (subprocesses, started together); the model and parameters that
``laplax.load`` returns must reproduce ``eval.json`` through ``model.apply``,
equal the checkpoint's arrays bit for bit (the ViT run is trained sharded on
a 2-device FSDP mesh and loaded onto this process's one device), and every
bad workdir must raise one :class:`laplax.LoadError` of one line.
"""

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers.resume import DINO_CONFIG, DINO_TINY, GPT_CONFIG, GPT_TINY, TEXT
from helpers.runs import CONFIG, ROOT, TINY, run_in_process, xla_env

VIT = (
  ["--config", CONFIG]
  + TINY
  + [
    "--config.data.eval_split=test[:1000]",
    "--config.total_steps=6",
    "--config.checkpoint_every=3",
    "--config.eval_every=1000",
    "--config.mesh_shape=(1,2,1)",
  ]
)
GPT = (
  ["--config", GPT_CONFIG]
  + GPT_TINY
  + [
    "--config.total_steps=4",
    "--config.checkpoint_every=2",
    "--config.eval_every=1000",
    "--config.log_every=2",
  ]
)
DINO = (
  ["--config", DINO_CONFIG]
  + DINO_TINY
  + [
    "--config.total_steps=2",
    "--config.checkpoint_every=2",
    "--config.eval_every=1000",
    "--config.log_every=2",
    "--config.data.eval_split=test[:200]",
  ]
)


def _start(args, log, env=None):
  """``python ARGS`` in the repository, stdout and stderr into the file ``log``."""
  env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
  with open(log, "w") as f:
    return subprocess.Popen(
      [sys.executable] + args, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env
    )


def _wait(proc, log, what):
  assert proc.wait(timeout=300) == 0, (what, log.read_text()[-3000:])


def _train_then_eval(commands, logs):
  """Runs each ``(train argv, env, workdir)`` of ``commands`` (a dict), all
  at once, each followed by ``eval.py --workdir`` as soon as it finished."""
  procs = {
    name: _start(argv, logs / f"{name}_train.log", env) for name, (argv, env, _) in commands.items()
  }
  evals = {}
  while procs:
    for name, proc in list(procs.items()):
      if proc.poll() is not None:
        _wait(proc, logs / f"{name}_train.log", f"train.py of {name}")
        del procs[name]
        evals[name] = _start(
          ["eval.py", "--workdir", str(commands[name][2])], logs / f"{name}_eval.log"
        )
    time.sleep(0.05)
  for name, proc in evals.items():
    _wait(proc, logs / f"{name}_eval.log", f"eval.py of {name}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fmnist_data_dir):
  """``{"vit", "gpt", "dino"}``: workdirs trained by train.py and evaluated by
  eval.py (the three runs in parallel)."""
  root = tmp_path_factory.mktemp("load")
  corpus = root / "corpus"
  corpus.mkdir()
  for i, name in enumerate(("a", "b", "c")):
    (corpus / f"{name}.txt").write_text((TEXT[i:] + TEXT[:i]) * 40)
  dirs = {task: root / task for task in ("vit", "gpt", "dino")}
  train = {
    "vit": VIT + [f"--config.data.data_dir={fmnist_data_dir}"],
    "gpt": GPT + [f"--config.data.source_dir={corpus}", f"--config.data.data_dir={corpus}_tfds"],
    "dino": DINO + [f"--config.data.data_dir={fmnist_data_dir}"],
  }
  two_devices = {"XLA_FLAGS": xla_env(2)["XLA_FLAGS"]}
  _train_then_eval(
    {
      t: (
        ["train.py", "--workdir", str(dirs[t])] + train[t],
        two_devices if t == "vit" else None,
        dirs[t],
      )
      for t in dirs
    },
    root,
  )
  return dirs


def _eval_json(workdir):
  return json.loads((workdir / "eval.json").read_text())


def saved_state(workdir, step=None):
  """``(step, {path: array})`` of the saved state at ``step`` (default newest),
  read with orbax alone onto this process's first device (the checkpoint may
  be sharded over devices this process does not have)."""
  import jax
  import orbax.checkpoint as ocp

  ckpt = os.path.join(workdir, "checkpoints")
  if step is None:
    step = max(int(s) for s in os.listdir(ckpt) if s.isdigit())
  path = os.path.join(ckpt, str(step), "state")
  checkpointer = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  meta = checkpointer.metadata(path)
  meta = getattr(meta, "item_metadata", meta)
  target = jax.tree_util.tree_map(
    lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta
  )
  return step, _flat(checkpointer.restore(path, target))


def _flat(tree):
  import jax

  name = lambda path: "/".join(
    str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path
  )
  return {name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _assert_equal_to_saved(tree, saved, prefix):
  flat = {f"{prefix}/{k}": v for k, v in _flat(tree).items()}
  expected = {k: v for k, v in saved.items() if k.startswith(prefix + "/")}
  assert flat.keys() == expected.keys() and flat
  for k in flat:
    np.testing.assert_array_equal(flat[k], expected[k], err_msg=k)


def _on_one_device(tree):
  import jax

  device = jax.local_devices()[0]
  return all(x.sharding.device_set == {device} for x in jax.tree_util.tree_leaves(tree))


def _classifier_eval(run):
  """``(correct, summed loss, count)`` of a loaded ViT over its eval split,
  through ``model.apply`` and optax (not the task's evaluation code)."""
  import jax
  import optax

  apply = jax.jit(lambda p, x: run.model.apply({"params": p}, x, train=False)[0])
  correct = loss = count = 0.0
  for batch in run.task.eval_batches():
    logits = np.asarray(apply(run.params, batch["image"]), np.float32)
    mask = batch["mask"]
    correct += float(((logits.argmax(-1) == batch["label"]) * mask).sum())
    loss += float(
      (optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * mask).sum()
    )
    count += float(mask.sum())
  return correct, loss, count


@pytest.mark.slow
def test_vit_reproduces_eval_accuracy_and_loads_older_steps(runs):
  import laplax

  run = laplax.load(str(runs["vit"]))
  assert (run.step, run.latest_step, run.teacher) == (6, 6, None)
  assert run.config.model.width == 32 and run.config.is_locked
  assert type(run.model).__name__ == "ViT" and _on_one_device(run.state)
  correct, loss, count = _classifier_eval(run)
  result = _eval_json(runs["vit"])
  assert count == result["num_examples"] == 1000
  assert correct / count == result["accuracy"]
  assert loss / count == pytest.approx(result["loss"], rel=1e-5)
  _, saved = saved_state(runs["vit"], 6)
  _assert_equal_to_saved(run.params, saved, "params")

  older = laplax.load(str(runs["vit"]), step=3)
  assert (older.step, older.latest_step) == (3, 6)
  _, saved3 = saved_state(runs["vit"], 3)
  _assert_equal_to_saved(older.params, saved3, "params")
  _assert_equal_to_saved(older.state.opt_state, saved3, "opt_state")
  assert not np.array_equal(saved3["params/head/kernel"], saved["params/head/kernel"])
  with pytest.raises(dataclasses.FrozenInstanceError):
    older.step = 6


@pytest.mark.slow
def test_gpt_reproduces_eval_bits_per_byte(runs):
  import jax
  import optax

  import laplax

  run = laplax.load(str(runs["gpt"]))
  assert (run.step, run.teacher) == (4, None) and type(run.model).__name__ == "GPT"
  apply = jax.jit(lambda p, x: run.model.apply({"params": p}, x, train=False)[0])
  token_bytes = np.asarray(run.task.tokenizer.token_bytes, np.float64)
  nats = count = num_bytes = 0.0
  for batch in run.task.eval_batches():
    tokens, mask = batch["tokens"], batch["mask"]
    logits = apply(run.params, tokens[:, :-1])
    assert logits.shape == tokens[:, 1:].shape + (run.task.tokenizer.vocab_size,)
    loss = np.asarray(
      optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]), np.float64
    )
    nats += float((loss * mask).sum())
    count += float(mask.sum())
    num_bytes += float((token_bytes[tokens[:, 1:]] * mask).sum())
  result = _eval_json(runs["gpt"])
  assert count == result["num_tokens"]
  assert nats / count == pytest.approx(result["loss"], rel=1e-6)
  assert nats / np.log(2) / num_bytes == pytest.approx(result["bits_per_byte"], rel=1e-6)
  _assert_equal_to_saved(run.params, saved_state(runs["gpt"])[1], "params")


@pytest.mark.slow
def test_dino_loads_student_and_teacher_and_reproduces_knn(runs):
  import jax

  import laplax

  run = laplax.load(str(runs["dino"]))
  assert run.step == 2 and run.model == run.task.student
  _, saved = saved_state(runs["dino"])
  _assert_equal_to_saved(run.teacher, saved, "task_state/teacher")
  _assert_equal_to_saved(run.params, saved, "params")
  assert _on_one_device(run.teacher)
  result = _eval_json(runs["dino"])
  summary = run.evaluate("knn")
  assert summary == {"knn_accuracy": result["knn_accuracy"], "num_examples": result["num_examples"]}
  assert result["num_examples"] == 200
  from laplax.config.validation import ConfigError

  with pytest.raises(ConfigError, match="'bits_per_byte', not an evaluator of a dino run"):
    run.evaluate("knn,bits_per_byte")
  with pytest.raises(ConfigError, match="names no evaluator"):
    run.evaluate(" ,")
  batch = next(iter(run.task.eval_batches()))
  logits, _ = run.model.apply({"params": run.params}, batch["image"][None, :4], train=False)
  assert logits.shape == (1, 4, run.config.dino.out_dim) and np.isfinite(logits).all()
  feats, _ = jax.jit(lambda p, x: run.task.teacher.backbone.apply({"params": p}, x, train=False))(
    run.teacher["backbone"], batch["image"][:4]
  )
  assert feats.shape == (4, run.config.model.width)


def _one_line_load_error(workdir, expected, step=None):
  import laplax

  with pytest.raises(laplax.LoadError) as e:
    laplax.load(str(workdir), step=step)
  assert isinstance(e.value, ValueError)
  msg = str(e.value)
  assert "\n" not in msg and all(w in msg for w in expected), msg
  return msg


@pytest.mark.slow
def test_bad_workdirs_raise_one_line_load_errors(runs, tmp_path):
  vit = runs["vit"]
  _one_line_load_error(tmp_path / "missing", ["does not exist", "no laplax run"])
  assert not (tmp_path / "missing").exists()
  (tmp_path / "afile").write_text("x")
  _one_line_load_error(tmp_path / "afile", ["is a file"])
  (tmp_path / "empty").mkdir()
  _one_line_load_error(tmp_path / "empty", ["has no config.json"])
  (tmp_path / "list").mkdir()
  (tmp_path / "list" / "config.json").write_text("[1, 2]")
  _one_line_load_error(tmp_path / "list", ["not a laplax run's config"])
  (tmp_path / "corrupt").mkdir()
  (tmp_path / "corrupt" / "config.json").write_text('{"task": ')
  _one_line_load_error(tmp_path / "corrupt", ["unreadable"])
  (tmp_path / "untrained").mkdir()
  shutil.copy(vit / "config.json", tmp_path / "untrained")
  _one_line_load_error(tmp_path / "untrained", ["has no checkpoint"])
  assert not (tmp_path / "untrained" / "checkpoints").exists()
  _one_line_load_error(vit, ["step 5 is not saved", "saved steps: 0, 3, 6"], step=5)


def _truncate(directory):
  for p in directory.rglob("*"):
    if p.is_file() and p.stat().st_size > 0:
      with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)


def test_config_json_that_is_not_the_checkpoints_model_is_named(runs, tmp_path):
  """A config.json edited after training (another width): one LoadError line
  naming the first parameter whose saved shape is not the config's model's,
  not "unreadable checkpoint"."""
  workdir = tmp_path / "vit"
  shutil.copytree(runs["vit"], workdir)
  saved = json.loads((workdir / "config.json").read_text())
  width = saved["model"]["width"]
  saved["model"].update(width=2 * width, mlp_dim=2 * saved["model"]["mlp_dim"])
  (workdir / "config.json").write_text(json.dumps(saved))
  msg = _one_line_load_error(
    workdir, ["is not the model of its config.json", "put back the run's own config.json"]
  )
  assert "unreadable" not in msg, msg
  # The first difference in name order, with both shapes.
  shapes = re.search(r"\(([\w/]+): saved \(([\d, ]+)\), the config's model \(([\d, ]+)\)\)", msg)
  assert shapes, msg
  old, new = (tuple(int(d) for d in g.split(",") if d.strip()) for g in shapes.groups()[1:])
  assert width in old and 2 * width in new and len(old) == len(new), msg


@pytest.mark.slow
@pytest.mark.subprocess
def test_unreadable_checkpoints(runs, tmp_path):
  """The newest unreadable: the previous step is loaded (``latest_step``
  says which was skipped) and eval.py warns and evaluates it; an unreadable
  asked-for step or no readable step at all: a one-line LoadError."""
  import laplax

  workdir = tmp_path / "vit"
  shutil.copytree(runs["vit"], workdir)
  _truncate(workdir / "checkpoints" / "6")
  run = laplax.load(str(workdir))
  assert (run.step, run.latest_step) == (3, 6)
  _assert_equal_to_saved(run.params, saved_state(runs["vit"], 3)[1], "params")
  _one_line_load_error(workdir, ["checkpoint step 6", "is unreadable"], step=6)
  r = subprocess.run(
    [sys.executable, "eval.py", "--workdir", str(workdir)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "warning: the newest checkpoint (step 6) is unreadable; evaluating step 3" in r.stderr
  assert _eval_json(workdir)["step"] == 3
  _truncate(workdir / "checkpoints")
  _one_line_load_error(workdir, ["no readable checkpoint"])
  _one_line_load_error(workdir, ["checkpoint step 3", "is unreadable"], step=3)


@pytest.mark.subprocess
def test_import_laplax_is_light():
  """``import laplax`` imports neither JAX nor the trainer; ``laplax.load``
  is :func:`laplax.loading.load`, imported on first use."""
  code = (
    "import sys, laplax; assert 'jax' not in sys.modules and 'laplax.train' not "
    "in sys.modules; assert 'load' in dir(laplax); print('ok')"
  )
  r = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
  import laplax
  from laplax import loading as restore

  assert (laplax.load, laplax.Loaded, laplax.LoadError) == (
    restore.load,
    restore.Loaded,
    restore.LoadError,
  )
  with pytest.raises(AttributeError, match="no attribute 'lod'"):
    _ = laplax.lod


def _snapshot(directory):
  """``{relative path: bytes}`` of every file under ``directory``, and the
  relative paths of its directories."""
  files, dirs = {}, set()
  for p in directory.rglob("*"):
    if p.is_dir():
      dirs.add(str(p.relative_to(directory)))
    else:
      files[str(p.relative_to(directory))] = p.read_bytes()
  return files, dirs


def _chmod_tree(directory, writable):
  for p in [directory, *directory.rglob("*")]:
    mode = p.stat().st_mode
    p.chmod(mode | 0o200 if writable else mode & ~0o222)


@contextlib.contextmanager
def read_only_view(source, target):
  """``target``: a read-only bind mount of ``source`` (read-only even to
  root, whom chmod does not stop: ``os.access`` and every write get EROFS);
  ``None`` where mounting is not permitted. Unmounted at the end."""
  target.mkdir()
  bound = (
    bool(shutil.which("mount"))
    and subprocess.run(
      ["mount", "--bind", str(source), str(target)], capture_output=True
    ).returncode
    == 0
  )
  read_only = (
    bound
    and subprocess.run(
      ["mount", "-o", "remount,bind,ro", str(target)], capture_output=True
    ).returncode
    == 0
  )
  try:
    yield target if read_only and not os.access(target, os.W_OK) else None
  finally:
    # (By the flag: os.path.ismount does not see a bind mount within one file system.)
    if bound and subprocess.run(["umount", str(target)], capture_output=True).returncode:
      subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_not_writable_refusals_as_root(runs, tmp_path, capfd, fmnist_data_dir):
  """Root writes through chmod, so the read-only workdir of the test below
  proves nothing there; a read-only bind mount stops root too: eval.py
  without ``--out`` on it, eval.py ``--out`` into it and train.py with a new
  workdir in it are each refused in one line (exit 2), the mount unchanged,
  and ``laplax.load`` still reads it."""
  import laplax

  if os.geteuid() != 0:
    pytest.skip("not root: the chmod case of test_eval_step_and_out_only_read_the_workdir")
  source = tmp_path / "vit"
  shutil.copytree(runs["vit"], source)
  before = _snapshot(source)
  with read_only_view(source, tmp_path / "ro") as ro:
    if ro is None:
      pytest.skip("a read-only bind mount is not permitted here")
    cases = (
      (["eval.py", "--workdir", str(ro)], [f"{ro} is not writable", "give --out FILE"]),
      (
        ["eval.py", "--workdir", str(source), "--out", str(ro / "evals" / "e.json")],
        [f"{ro} is not writable"],
      ),
      (
        ["train.py", "--workdir", str(ro / "new")]
        + [a for a in VIT if not a.startswith("--config.mesh_shape")]  # one device here
        + [f"--config.data.data_dir={fmnist_data_dir}"],
        [f"--workdir {ro / 'new'} is not writable ({ro})"],
      ),
    )
    for argv, words in cases:
      r = run_in_process(argv, capfd)
      lines = [l for l in r.stderr.splitlines() if l.strip()]
      assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
      assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), lines[0]
    assert laplax.load(str(ro)).step == 6
  assert _snapshot(source) == before and not (source / "new").exists()


@pytest.mark.slow
def test_eval_step_and_out_only_read_the_workdir(runs, tmp_path, capfd):
  """``eval.py --step N --out FILE`` on a read-only workdir: the results of
  step N in FILE (the analysis' pictures next to it), the workdir unchanged
  byte for byte (the tests may run as root, whom chmod does not stop)."""
  import laplax

  workdir = tmp_path / "vit"
  shutil.copytree(runs["vit"], workdir)
  before = _snapshot(workdir)
  _chmod_tree(workdir, writable=False)
  try:
    out = tmp_path / "evals" / "step3" / "result.json"
    r = run_in_process(
      ["eval.py", "--workdir", str(workdir), "--step", "3", "--out", str(out)], capfd
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"wrote {out}" in r.stdout
    result = json.loads(out.read_text())
    correct, loss, count = _classifier_eval(laplax.load(str(runs["vit"]), step=3))
    assert (result["step"], result["num_examples"]) == (3, count)
    assert result["accuracy"] == correct / count
    assert result["loss"] == pytest.approx(loss / count, rel=1e-5)
    assert result["loss"] != _eval_json(runs["vit"])["loss"]  # step 6's

    latest = tmp_path / "evals" / "latest.json"
    r = run_in_process(["eval.py", "--workdir", str(workdir), "--out", str(latest)], capfd)
    assert r.returncode == 0, r.stderr[-3000:]
    newest, saved = json.loads(latest.read_text()), _eval_json(runs["vit"])
    assert newest["step"] == saved["step"] == 6
    assert newest["accuracy"] == saved["accuracy"]
    assert newest["loss"] == pytest.approx(saved["loss"], rel=1e-6)

    analysis = tmp_path / "analysis" / "a.json"
    r = run_in_process(
      [
        "eval.py",
        "--workdir",
        str(workdir),
        "--analysis",
        "--step",
        "0",
        "--analysis_layers",
        "0",
        "--analysis_examples",
        "32",
        "--analysis_jacobian_dim",
        "0",
        "--out",
        str(analysis),
      ],
      capfd,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    written = json.loads(analysis.read_text())
    assert (written["step"], written["num_sequences"]) == (0, 32)
    assert [entry["layer"] for entry in written["layers"]] == [0]
    pictures = sorted(p.name for p in analysis.parent.iterdir() if p.suffix == ".png")
    assert pictures and all(p.startswith("analysis_") for p in pictures), pictures
    assert all((analysis.parent / p).read_bytes()[:4] == b"\x89PNG" for p in pictures)

    for argv, words in (
      (["--step", "5"], ["--step 5 is not saved", "saved steps: 0, 3, 6"]),
      (["--step=-1"], ["--step=-1 must be >= 0"]),
      (["--out", str(tmp_path / "evals")], ["is a directory; give a file name"]),
      (["--out", str(out / "x.json")], ["is a file, not a directory"]),
      # /proc refuses new files even to root (os.access says writable)
      (["--out", "/proc/laplax_none/e.json"], ["cannot write in /proc"]),
    ):
      extra = [] if argv[0] == "--out" else ["--out", str(tmp_path / "bad" / "e.json")]
      r = run_in_process(["eval.py", "--workdir", str(workdir)] + argv + extra, capfd)
      lines = [l for l in r.stderr.splitlines() if l.strip()]
      assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
      assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "bad").exists()
    if os.geteuid() != 0:  # root may write anyway
      r = run_in_process(["eval.py", "--workdir", str(workdir)], capfd)
      assert r.returncode == 2 and "is not writable" in r.stderr and "--out" in r.stderr
  finally:
    _chmod_tree(workdir, writable=True)
  assert _snapshot(workdir) == before
