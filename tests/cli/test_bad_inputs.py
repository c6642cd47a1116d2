"""A corpus of bad inputs to train.py and eval.py, run as a user runs them.

Each one must print exactly one line on stderr, starting with ``error:``,
that says what is wrong (the expected words below), exit with code 2 without
a traceback, and change no file of an existing workdir, dataset directory or
config file (nor create the workdir it was given).

Every bad input runs in this process through the entry point of ``python
train.py`` / ``python eval.py`` (``test_train.run_in_process``: ``sys.argv``
set and the flags reset), which saves the ~4 s of imports a subprocess spends
before it reads its arguments; ten of them also run as subprocesses.
"""

import json
import os
import shutil
import socket

import pytest

from laplax.workdir import lock as lock_lib

from helpers.resume import DINO_CONFIG, DINO_TINY, GPT_TINY
from helpers.runs import CONFIG, ROOT, TINY, run, run_in_process, train_args

GPT_CONFIG = os.path.join(ROOT, "configs", "gpt_shakespeare.py")
FMNIST_SOURCE = "/usr/share/datasets/fashion-mnist"


def _snapshot(*dirs):
  out = {}
  for d in dirs:
    if os.path.isfile(d):
      with open(d, "rb") as fh:
        out[d] = fh.read()
    for root, _, files in os.walk(d):
      for f in files:
        p = os.path.join(root, f)
        with open(p, "rb") as fh:
          out[p] = fh.read()
  return out


def _one_line_exit_2(r, expected):
  assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, r.stderr[-3000:]
  assert lines[0].startswith("error: ") and "Traceback" not in r.stderr
  assert any(e in lines[0] for e in expected), lines[0]


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory, fmnist_data_dir):
  workdir = tmp_path_factory.mktemp("existing") / "run"
  r = run(
    train_args(
      workdir,
      fmnist_data_dir,
      "--config.total_steps=5",
      "--config.eval_every=5",
      "--config.checkpoint_every=5",
    )
  )
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir


# Config values: (extra flags, words the error line must contain). Each runs
# on the existing workdir and on a new one.
BAD_CONFIGS = {
  "missing dataset files": (
    ["--config.data.source_dir=/nonexistent/fmnist", "--config.data.data_dir={fresh}"],
    ["apt-get install -y dataset-fashion-mnist"],
  ),
  "too many laplacian heads": (["--config.model.num_laplacian_heads=3"], ["num_laplacian_heads"]),
  "unknown config key": (["--config.model.num_haeds=4"], ["num_haeds"]),
  "unknown nested section": (["--config.optimizer.lr=1"], ["optimizer"]),
  "patch size does not divide the image": (["--config.model.patch_size=5"], ["not divisible by"]),
  "bad value type": (["--config.model.depth=two"], ["depth takes an int (the config's: 4)"]),
  "config file argument of a bad type": (
    ["--config", CONFIG + ":laplacian=abc"],
    ["'abc' is a str where laplacian takes an int; give an int"],
  ),
  "non-boolean head mask": (["--config.model.laplacian_mask=(('no', 'no'),)"], ["laplacian_mask"]),
  "no checkpoints kept": (["--config.keep_checkpoints=0"], ["keep_checkpoints"]),
  "negative crop padding": (["--config.data.crop_padding=-1"], ["crop_padding"]),
  "config file argument": (["--config", CONFIG + ":foo=1"], ["foo=1"]),
  "zero batch": (["--config.batch_size=0"], ["batch_size"]),
  "negative total steps": (["--config.total_steps=-1"], ["total_steps"]),
  "zero log interval": (["--config.log_every=0"], ["log_every"]),
  "heads do not divide the width": (
    ["--config.model.num_heads=3", "--config.model.num_laplacian_heads=0"],
    ["num_heads"],
  ),
  "dropout of 1.5": (["--config.model.dropout=1.5"], ["dropout"]),
  "zero learning rate": (["--config.optim.lr=0.0"], ["optim.lr"]),
  "beta2 above 1": (["--config.optim.b2=1.5"], ["optim.b2"]),
  "unknown dtype": (["--config.model.dtype=float16"], ["model.dtype"]),
  "unknown attention implementation": (["--config.model.implementation=flash"], ["implementation"]),
  "cudnn without a GPU": (["--config.model.implementation=cudnn"], ["needs an NVIDIA GPU"]),
  "unknown spectral mode": (["--config.model.spectral.mode=diag"], ["spectral.mode"]),
  "unknown remat policy": (["--config.model.remat=sometimes"], ["model.remat"]),
  "micro-batches do not divide the batch": (
    ["--config.optim.grad_accum_steps=3"],
    ["grad_accum_steps"],
  ),
  "mesh larger than the devices": (["--config.mesh_shape=(3,1,1)"], ["mesh_shape"]),
  "non-positive NaN step": (["--config.debug.nan_at_step=0"], ["nan_at_step"]),
  "non-boolean skip_nonfinite": (["--config.optim.skip_nonfinite=maybe"], ["skip_nonfinite"]),
  "negative seed": (["--config.seed=-1"], ["seed"]),
  "unknown task": (["--config.task=regression"], ["task"]),
  "unknown flag": (["--foo=1"], ["foo"]),
  "unknown dataset": (["--config.data.name=cifar11"], ["cifar11"]),
  "missing split": (["--config.data.train_split=validation"], ["validation"]),
  "malformed sharding rules": (["--config.sharding_rules=((1,2),)"], ["sharding_rules"]),
  "infinite learning rate": (["--config.optim.lr=inf"], ["optim.lr"]),
  "infinite spectral lambda": (["--config.model.spectral.lam=inf"], ["spectral.lam"]),
  "empty data_dir": (["--config.data.data_dir="], ["data.data_dir"]),
  "non-boolean checkpoint_verify": (["--config.checkpoint_verify=maybe"], ["checkpoint_verify"]),
  # Issue 32: checked against the data and the machine before anything is written.
  "batch larger than the training split": (
    ["--config.batch_size=100000000"],
    ["is larger than the 60000 images of the training split"],
  ),
  "a model far too large for this machine": (  # 34e9 parameters, refused untraced
    ["--config.model.width=65536", "--config.model.depth=2"],
    ["--config.check_memory=False skips this check"],
  ),
  "non-boolean check_memory": (["--config.check_memory=maybe"], ["check_memory"]),
  "non-positive stall step": (["--config.debug.stall_at_step=0"], ["stall_at_step"]),
}


# The bad config values also run as subprocesses (the rest only in-process).
SUBPROCESS_CONFIGS = (
  "missing dataset files",
  "unknown config key",
  "unknown flag",
  "mesh larger than the devices",
  "batch larger than the training split",
)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(
  "name,how",
  [(n, "in-process") for n in sorted(BAD_CONFIGS)]
  + [(n, "subprocess") for n in SUBPROCESS_CONFIGS],
)
def test_bad_config_one_line_exit_2_nothing_changed(
  name, how, existing_run, tmp_path, fmnist_data_dir, capfd
):
  extra, expected = BAD_CONFIGS[name]
  extra = [e.replace("{fresh}", str(tmp_path / "fresh_tfds")) for e in extra]
  before = _snapshot(existing_run, fmnist_data_dir)
  # In-process on both workdirs; the subprocess sample on the new one only
  # (where the message must be the case's own and nothing may be created).
  workdirs = (
    (existing_run, tmp_path / "new_run") if how == "in-process" else (tmp_path / "new_run",)
  )
  for workdir in workdirs:
    argv = train_args(workdir, fmnist_data_dir, "--config.total_steps=10", *extra)
    r = run(argv) if how == "subprocess" else run_in_process(argv, capfd)
    # On the existing workdir its own architecture check may answer first.
    _one_line_exit_2(r, expected + (["different architecture"] if workdir == existing_run else []))
  assert _snapshot(existing_run, fmnist_data_dir) == before
  assert not (tmp_path / "new_run").exists()
  assert not (tmp_path / "fresh_tfds").exists() or not os.listdir(tmp_path / "fresh_tfds")


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, fmnist_data_dir, existing_run):
  """Broken config files, datasets and workdirs, made once."""
  d = tmp_path_factory.mktemp("bad")
  (d / "no_get_config.py").write_text("x = 1\n")
  (d / "syntax_error.py").write_text("def get_config(:\n")
  (d / "raises.py").write_text("def get_config(arg=None):\n  raise KeyError('width')\n")
  (d / "afile").write_text("not a directory\n")
  (d / "returns_none.py").write_text("def get_config(arg=None):\n  pass\n")
  (d / "misspelt.py").write_text(
    "from laplax.config.defaults import base_config\n\n"
    "def get_config(arg=None):\n  c = base_config()\n  c.model.num_haeds = 8\n"
    "  return c\n"
  )
  # A prepared dataset whose train file lost its second half.
  shutil.copytree(
    os.path.join(fmnist_data_dir, "fashion_mnist_idx"), d / "corrupt_tfds" / "fashion_mnist_idx"
  )
  train = [p for p in (d / "corrupt_tfds").rglob("*train.array_record*")][0]
  with open(train, "r+b") as f:
    f.truncate(os.path.getsize(train) // 2)
  # Source files with a truncated gzip.
  shutil.copytree(FMNIST_SOURCE, d / "corrupt_source")
  gz = d / "corrupt_source" / "train-images-idx3-ubyte.gz"
  with open(gz, "r+b") as f:
    f.truncate(os.path.getsize(gz) // 3)
  # A workdir whose config.json is not JSON, and one with only unreadable checkpoints.
  shutil.copytree(existing_run, d / "bad_config_run")
  (d / "bad_config_run" / "config.json").write_text("{not json")
  shutil.copytree(existing_run, d / "list_config_run")
  (d / "list_config_run" / "config.json").write_text("[]")
  shutil.copytree(existing_run, d / "no_config_run")
  os.remove(d / "no_config_run" / "config.json")
  shutil.copytree(existing_run, d / "checkpoints_file_run")
  shutil.rmtree(d / "checkpoints_file_run" / "checkpoints")
  (d / "checkpoints_file_run" / "checkpoints").write_text("x")
  shutil.copytree(existing_run, d / "metrics_dir_run")
  os.remove(d / "metrics_dir_run" / "metrics.jsonl")
  os.mkdir(d / "metrics_dir_run" / "metrics.jsonl")
  shutil.copytree(existing_run, d / "unreadable_run")
  for p in (d / "unreadable_run" / "checkpoints").rglob("*"):
    if p.is_file() and p.stat().st_size > 0:
      with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)
  # Workdirs locked by a live process (this one) and by another host.
  for name, host in (("locked_run", socket.gethostname()), ("foreign_lock_run", "elsewhere")):
    shutil.copytree(existing_run, d / name)
    (d / name / lock_lib.LOCK_FILE).write_text(
      json.dumps(
        {
          "host": host,
          "pid": os.getpid(),
          "started_iso": "2026-12-02T00:00:00",
          "proc_start": lock_lib._proc_start(os.getpid()),
        }
      )
    )
  # A tiny text corpus (three documents) for the GPT's size checks.
  for i, name in enumerate(("a", "b", "c")):
    (d / "tiny_corpus").mkdir(exist_ok=True)
    (d / "tiny_corpus" / f"{name}.txt").write_text(("To be, or not to be. " * 40)[i:])
  # One flipped bit in the biggest data file of every checkpoint.
  shutil.copytree(existing_run, d / "flipped_run")
  for step_dir in (d / "flipped_run" / "checkpoints").iterdir():
    biggest = max(
      (p for p in step_dir.rglob("*") if p.is_file() and "/d/" in str(p)),
      key=lambda p: p.stat().st_size,
    )
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 1
    biggest.write_bytes(bytes(data))
  return d


def _train(workdir, *extra, data_dir="{fmnist}", config=CONFIG):
  return (
    ["train.py", "--config", config, "--workdir", workdir, f"--config.data.data_dir={data_dir}"]
    + TINY
    + ["--config.total_steps=5"]
    + list(extra)
  )


def _gpt(workdir, *extra):
  return (
    [
      "train.py",
      "--config",
      GPT_CONFIG,
      "--workdir",
      workdir,
      "--config.data.source_dir={bad}/tiny_corpus",
      "--config.data.data_dir={new}_tfds",
    ]
    + GPT_TINY
    + list(extra)
  )


# Paths, files and workdirs: (argv, words the error line must contain).
BAD_PATHS = {
  "config file missing": (
    ["train.py", "--config", "{bad}/nope.py", "--workdir", "{new}"],
    ["does not exist"],
  ),
  "config without get_config": (
    ["train.py", "--config", "{bad}/no_get_config.py", "--workdir", "{new}"],
    ["get_config"],
  ),
  "config with a syntax error": (
    ["train.py", "--config", "{bad}/syntax_error.py", "--workdir", "{new}"],
    ["SyntaxError"],
  ),
  "config that raises": (
    ["train.py", "--config", "{bad}/raises.py", "--workdir", "{new}"],
    ["KeyError"],
  ),
  "config file with a misspelt key": (
    ["train.py", "--config", "{bad}/misspelt.py", "--workdir", "{new}"],
    ["model.num_haeds"],
  ),
  "config that returns None, with an override": (
    [
      "train.py",
      "--config",
      "{bad}/returns_none.py",
      "--workdir",
      "{new}",
      "--config.total_steps=3",
    ],
    ["returned NoneType"],
  ),
  "no --workdir": (["train.py", "--config", CONFIG], ["--workdir is required"]),
  "workdir is a file": (_train("{bad}/afile"), ["is a file"]),
  "workdir under a file": (_train("{bad}/afile/run"), ["is a file"]),
  "data_dir is a file": (_train("{new}", data_dir="{bad}/afile"), ["data_dir", "is a file"]),
  "truncated prepared dataset": (_train("{new}", data_dir="{bad}/corrupt_tfds"), ["corrupt"]),
  "truncated source file": (
    _train("{new}", "--config.data.source_dir={bad}/corrupt_source", data_dir="{new}_tfds"),
    ["Corrupt Fashion-MNIST file"],
  ),
  "missing text corpus": (
    _train(
      "{new}",
      "--config.data.source_dir=/nonexistent/texts",
      data_dir="{new}_tfds",
      config=GPT_CONFIG,
    )[:6]
    + ["--config.data.source_dir=/nonexistent/texts"],
    ["does not exist"],
  ),
  "workdir with a corrupt config.json": (_train("{bad}/bad_config_run"), ["unreadable"]),
  "workdir whose checkpoints are all unreadable": (
    _train("{bad}/unreadable_run"),
    ["no readable checkpoint"],
  ),
  "workdir with a JSON list as config.json": (
    _train("{bad}/list_config_run"),
    ["not a laplax run's config"],
  ),
  "eval of a workdir with a JSON list as config.json": (
    ["eval.py", "--workdir", "{bad}/list_config_run"],
    ["not a laplax run's config"],
  ),
  "workdir with checkpoints but no config.json": (
    _train("{bad}/no_config_run", "--config.model.width=64"),
    ["no config.json"],
  ),
  "workdir whose checkpoints is a file": (
    _train("{bad}/checkpoints_file_run"),
    ["should be a directory"],
  ),
  "workdir whose metrics.jsonl is a directory": (
    _train("{bad}/metrics_dir_run"),
    ["should be a file"],
  ),
  "eval of a missing workdir": (["eval.py", "--workdir", "{new}"], ["no "]),
  "eval of a workdir with a corrupt config.json": (
    ["eval.py", "--workdir", "{bad}/bad_config_run"],
    ["unreadable"],
  ),
  "eval of a workdir whose checkpoints are unreadable": (
    ["eval.py", "--workdir", "{bad}/unreadable_run"],
    ["no readable checkpoint"],
  ),
  "workdir locked by a live train.py": (_train("{bad}/locked_run"), ["is in use by train.py"]),
  "workdir locked by another host": (_train("{bad}/foreign_lock_run"), ["--force_unlock"]),
  "workdir whose checkpoints fail their checksums": (
    _train("{bad}/flipped_run"),
    ["checksum mismatch"],
  ),
  "GPT batch larger than the windows of its training split": (
    _gpt("{new}", "--config.batch_size=100000000"),
    ["distinct windows"],
  ),
  "GPT context longer than its text split": (
    _gpt("{new}", "--config.model.max_length=100000"),
    ["--config.model.max_length"],
  ),
  "DINO k-NN bank smaller than eval.knn_k": (
    ["train.py", "--config", DINO_CONFIG, "--workdir", "{new}", "--config.data.data_dir={fmnist}"]
    + DINO_TINY
    + ["--config.data.train_split=train[:16]"],
    ["eval.knn_k=20 is larger than the 16 images of the k-NN bank"],
  ),
  "eval of a workdir whose checkpoints fail their checksums": (
    ["eval.py", "--workdir", "{bad}/flipped_run"],
    ["checksum mismatch"],
  ),
}


# Every bad path runs in-process, and these also as subprocesses.
SUBPROCESS_PATHS = (
  "config file missing",
  "config with a syntax error",
  "truncated prepared dataset",
  "workdir whose checkpoints are all unreadable",
  "eval of a workdir whose checkpoints are unreadable",
  "workdir locked by a live train.py",
  "GPT batch larger than the windows of its training split",
)


def _path_cases():
  for name in sorted(BAD_PATHS):
    yield name, "in-process"
    if name in SUBPROCESS_PATHS:
      yield name, "subprocess"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("name,how", list(_path_cases()))
def test_bad_path_one_line_exit_2_nothing_changed(
  name, how, bad_files, tmp_path, fmnist_data_dir, capfd
):
  argv, expected = BAD_PATHS[name]
  subs = {"{bad}": str(bad_files), "{new}": str(tmp_path / "new_run"), "{fmnist}": fmnist_data_dir}
  for key, value in subs.items():
    argv = [a.replace(key, value) for a in argv]
  before = _snapshot(bad_files, fmnist_data_dir)
  _one_line_exit_2(run(argv) if how == "subprocess" else run_in_process(argv, capfd), expected)
  assert _snapshot(bad_files, fmnist_data_dir) == before
  assert not (tmp_path / "new_run").exists()


def test_corpus_has_at_least_30_bad_inputs():
  assert len(BAD_CONFIGS) + len(BAD_PATHS) >= 30
  assert set(SUBPROCESS_CONFIGS) <= set(BAD_CONFIGS)
  assert set(SUBPROCESS_PATHS) <= set(BAD_PATHS)
