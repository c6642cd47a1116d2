"""Observability: TensorBoard contents, the profiler trace, Weights & Biases
(offline), the warning filters and ``--jax_*`` options, read back from real runs.

One tiny GPT run (module fixture) trains 4 steps with an evaluation every 2,
an 8-token sample at each, a profile of steps 2-3 and, when ``wandb`` is
installed, an offline W&B run; then ``eval.py --analysis`` adds its figures.
"""

import glob
import gzip
import json
import os
import struct
import sys
import warnings

import jax
import numpy as np
import pytest
from absl import flags

from helpers.events import read_events
from helpers.runs import ROOT, read_metrics, run_in_process

GPT_CONFIG = os.path.join(ROOT, "configs", "gpt_shakespeare.py")
VIT_CONFIG = os.path.join(ROOT, "configs", "vit_fashion_mnist.py")
TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=64",
  "--config.model.max_length=32",
  "--config.batch_size=16",
  "--config.eval_batch_size=16",
  "--config.log_every=2",
  "--config.optim.warmup_steps=2",
  "--config.total_steps=4",
  "--config.eval_every=2",
  "--config.eval.sample_tokens=8",
  "--config.eval.sample_prompt_tokens=12",
  "--config.profile.start_step=2",
  "--config.profile.num_steps=2",
]
SENTENCE = "the cat sat on the mat. "
HAVE_WANDB = True
try:
  import wandb  # noqa: F401
except ImportError:
  HAVE_WANDB = False


def read_wandb_records(run_dir):
  """The protobuf records of an offline W&B run's ``run-*.wandb`` file (the
  LevelDB log format wandb writes: a 7-byte header, 32 KiB blocks of chunks
  ``crc32 | length uint16 | type uint8 | data``, type 1 = whole record,
  2/3/4 = first/middle/last piece)."""
  from wandb.proto import wandb_internal_pb2

  (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B"
  records, piece, pos, block = [], b"", 7, 32768
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a header is padding
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    if kind == 0:
      break
    piece += data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(piece)
      records.append(record)
      piece = b""
  return records


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
  """The tiny GPT run (with an offline W&B run when wandb is installed), then
  ``eval.py --analysis`` on it."""
  root = tmp_path_factory.mktemp("obs")
  corpus = root / "corpus"
  corpus.mkdir()
  for name in ("a", "b", "c"):
    (corpus / f"{name}.txt").write_text(SENTENCE * 150)
  workdir = root / "run"
  args = [
    "train.py",
    "--config",
    GPT_CONFIG,
    "--workdir",
    str(workdir),
    f"--config.data.source_dir={corpus}",
    f"--config.data.data_dir={root / 'tfds'}",
  ]
  args += TINY + (["--config.wandb.project=laplax-test"] if HAVE_WANDB else [])
  with pytest.MonkeyPatch.context() as mp:
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
      mp.setenv(key, str(root / key.lower()))
    mp.setenv("WANDB_MODE", "offline")
    r = run_in_process(args)
    assert r.returncode == 0
    r = run_in_process(
      [
        "eval.py",
        "--workdir",
        str(workdir),
        "--analysis",
        "--analysis_examples",
        "8",
        "--analysis_jacobian_dim",
        "0",
      ]
    )
    assert r.returncode == 0
  return workdir


@pytest.mark.slow
def test_tensorboard_has_the_scalars_config_hparams_and_samples(gpt_run):
  events = read_events(gpt_run)
  scalars = {
    (v.tag, s): v.simple_value for s, v in events if v.WhichOneof("value") == "simple_value"
  }
  records = read_metrics(gpt_run)
  for r in records:
    if r["split"] in ("train", "eval"):
      for k, v in r.items():
        if k not in ("step", "split"):
          assert scalars[(f"{r['split']}/{k}", r["step"])] == pytest.approx(v, rel=1e-6), k
  assert {s for (tag, s) in scalars if tag == "eval/loss"} == {2, 4}

  texts = {
    (v.tag, s): v.tensor.string_val[0].decode()
    for s, v in events
    if v.metadata.plugin_data.plugin_name == "text"
  }
  # The config as a Markdown code block of config.json's JSON.
  config_text = texts[("config/text_summary", 0)]
  saved = json.loads((gpt_run / "config.json").read_text())
  assert json.loads("\n".join(l[4:] for l in config_text.splitlines())) == saved

  # The hparams plugin's session-start summary: every key, flattened.
  from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

  (hp,) = [v for _, v in events if v.tag == "_hparams_/session_start_info"]
  hparams = HParamsPluginData.FromString(hp.metadata.plugin_data.content).session_start_info.hparams
  assert hparams["optim.lr"].number_value == pytest.approx(saved["optim"]["lr"])
  assert hparams["model.posemb"].string_value == "rope"
  assert hparams["eval.sample_tokens"].number_value == 8
  assert hparams["model.spectral.enabled"].bool_value is False
  assert hparams["optim.weight_decay_exclude"].string_value == json.dumps(
    saved["optim"]["weight_decay_exclude"]
  )
  assert len(hparams) == len(_flatten(saved))

  # A sample at each evaluation, also in metrics.jsonl.
  samples = {r["step"]: r["text"] for r in records if r["split"] == "sample"}
  assert sorted(samples) == [2, 4]
  for step, text in samples.items():
    assert texts[("sample/text_summary", step)] == "    " + text


@pytest.mark.slow
def test_train_records_have_the_input_wait_fraction(gpt_run):
  train = [r for r in read_metrics(gpt_run) if r["split"] == "train"]
  assert [r["step"] for r in train] == [2, 4]
  for r in train:
    assert 0.0 <= r["data_wait_fraction"] <= 1.0 and r["steps_per_sec"] > 0, r


def test_log_interval_divides_input_wait_by_wall_time():
  from laplax.train.timing import LogInterval

  now = [100.0]
  interval = LogInterval(clock=lambda: now[0])

  def fetch(seconds, value):
    now[0] += seconds
    return value

  assert interval.wait_for(lambda: fetch(0.5, "batch")) == "batch"
  now[0] += 1.5  # a step
  assert interval.wait_for(lambda: fetch(1.0, 7)) == 7
  now[0] += 1.0
  assert interval.record(2) == {"steps_per_sec": 0.5, "data_wait_fraction": 0.375}
  now[0] += 2.0  # the next interval starts at the record: no input wait in it
  assert interval.record(4) == {"steps_per_sec": 2.0, "data_wait_fraction": 0.0}
  with pytest.raises(StopIteration):  # a failing fetch still counts its wait
    interval.wait_for(lambda: next(iter([])) if fetch(1.0, True) else None)
  now[0] += 3.0
  assert interval.record(1)["data_wait_fraction"] == 0.25


def _flatten(d, prefix=""):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict) and v:
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


@pytest.mark.slow
def test_sample_is_the_greedy_continuation_of_the_validation_text(gpt_run):
  """The step-4 sample: the first 12 bytes of the validation document, then
  8 tokens that are each the argmax of the step-4 checkpoint's next-token
  logits (one full causal forward pass of the sample, no KV cache)."""
  import laplax

  text = [r["text"] for r in read_metrics(gpt_run) if r["split"] == "sample" and r["step"] == 4][0]
  assert text[:12] == SENTENCE[:12]
  run = laplax.load(str(gpt_run))
  assert run.step == 4
  tokens = np.asarray(run.task.tokenizer.encode(text), np.int32)
  assert len(tokens) == 12 + 8  # byte-level: one token a byte
  logits, _ = run.model.apply({"params": run.params}, tokens[None, :-1])
  np.testing.assert_array_equal(np.argmax(logits[0, 11:], axis=-1), tokens[12:])


def test_profile_trace_holds_the_annotated_steps(gpt_run):
  (trace_dir,) = glob.glob(os.path.join(str(gpt_run), "profile", "plugins", "profile", "*"))
  assert [p for p in os.listdir(trace_dir) if p.endswith(".xplane.pb")]
  (trace,) = glob.glob(os.path.join(trace_dir, "*.trace.json.gz"))
  with gzip.open(trace) as f:
    events = json.load(f)["traceEvents"]
  steps = sorted(
    int(e["args"]["step_num"])
    for e in events
    if e.get("name") == "train" and "step_num" in e.get("args", {})
  )
  assert steps == [2, 3]
  # The train step's XLA program ran inside the trace.
  assert any("train_step" in e.get("name", "") for e in events)


def test_analysis_figures_are_tensorboard_images(gpt_run):
  images = {
    v.tag: (s, v.image) for s, v in read_events(gpt_run) if v.WhichOneof("value") == "image"
  }
  pngs = sorted(os.path.basename(p)[:-4] for p in glob.glob(str(gpt_run / "analysis_*.png")))
  assert pngs and sorted(images) == pngs
  from PIL import Image

  for tag, (step, image) in images.items():
    data = (gpt_run / f"{tag}.png").read_bytes()
    assert step == 4 and image.encoded_image_string == data
    with Image.open(gpt_run / f"{tag}.png") as im:
      assert (image.width, image.height) == im.size


@pytest.mark.skipif(not HAVE_WANDB, reason="wandb is not installed")
def test_wandb_offline_run_holds_scalars_config_samples_and_images(gpt_run):
  run_dirs = sorted(glob.glob(str(gpt_run / "wandb" / "offline-run-*")))
  assert len(run_dirs) == 2  # train.py, then eval.py resuming the same run
  run_id = (gpt_run / "wandb_run_id").read_text().strip()
  train = read_wandb_records(run_dirs[0])
  (run_record,) = [r.run for r in train if r.WhichOneof("record_type") == "run"]
  assert run_record.run_id == run_id and run_record.project == "laplax-test"
  assert run_record.display_name == "run"
  config = {i.key: json.loads(i.value_json) for i in run_record.config.update}
  saved = json.loads((gpt_run / "config.json").read_text())
  assert config["optim"] == saved["optim"] and config["model"] == saved["model"]

  history = {}
  for r in train:
    if r.WhichOneof("record_type") == "history":
      row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
      history.setdefault(row["_step"], {}).update(row)
  for m in read_metrics(gpt_run):
    if m["split"] in ("train", "eval"):
      for k, v in m.items():
        if k not in ("step", "split"):
          assert history[m["step"]][f"{m['split']}/{k}"] == pytest.approx(v, rel=1e-6)
    if m["split"] == "sample":
      assert history[m["step"]]["sample"] == m["text"]

  evaluation = read_wandb_records(run_dirs[1])
  (run_record,) = [r.run for r in evaluation if r.WhichOneof("record_type") == "run"]
  assert run_record.run_id == run_id
  images = set()
  for r in evaluation:
    if r.WhichOneof("record_type") == "history":
      images |= {
        i.nested_key[0]
        for i in r.history.item
        if i.nested_key and i.nested_key[-1] == "_type" and json.loads(i.value_json) == "image-file"
      }
  pngs = {os.path.basename(p)[:-4] for p in glob.glob(str(gpt_run / "analysis_*.png"))}
  assert images == pngs
  assert len(glob.glob(os.path.join(run_dirs[1], "files", "media", "images", "*.png"))) == len(pngs)


def test_missing_wandb_is_one_line_exit_2_before_any_write(tmp_path, capfd, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails
  workdir = tmp_path / "run"
  r = run_in_process(
    ["train.py", "--config", VIT_CONFIG, "--workdir", str(workdir), "--config.wandb.project=p"],
    capfd,
  )
  assert r.returncode == 2
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "needs the wandb package" in lines[0], r.stderr
  assert "config.wandb.project" in lines[0]
  assert not workdir.exists()


def test_eval_figures_without_wandb_go_to_tensorboard_with_one_warning(
  gpt_run, tmp_path, capsys, monkeypatch
):
  """eval.py's figures of a run whose config names a W&B project, where wandb
  is missing: one warning line, the image in TensorBoard all the same."""
  from laplax.workdir import files as workdir_lib

  monkeypatch.setitem(sys.modules, "wandb", None)
  config = workdir_lib.load_saved_config(str(gpt_run))
  config.wandb.project = "laplax-test"
  figure = tmp_path / "analysis_variance.png"
  figure.write_bytes((gpt_run / "analysis_variance.png").read_bytes())
  workdir_lib.log_figures(str(tmp_path), config, 7, [str(figure)])
  lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("warning: ") and "wandb" in lines[0], lines
  ((step, value),) = read_events(tmp_path)
  assert (step, value.tag, value.image.encoded_image_string) == (
    7,
    "analysis_variance",
    figure.read_bytes(),
  )
  assert not (tmp_path / "wandb").exists()


@pytest.mark.parametrize(
  "config,flag,fragment",
  [
    (
      VIT_CONFIG,
      "--config.profile.num_steps=-1",
      "config.profile.num_steps=-1 must be an integer >= 0",
    ),
    (
      VIT_CONFIG,
      "--config.profile.start_step=0",
      "config.profile.start_step=0 must be an integer >= 1",
    ),
    (VIT_CONFIG, "--config.wandb.mode=cloud", "config.wandb.mode='cloud' is unknown"),
    (VIT_CONFIG, "--config.wandb.project=", "config.wandb.project='' must be a non-empty string"),
    (
      GPT_CONFIG,
      "--config.eval.sample_tokens=-1",
      "config.eval.sample_tokens=-1 must be an integer >= 0",
    ),
    (VIT_CONFIG, "--jax_no_such_option=1", "jax_no_such_option"),
  ],
)
def test_bad_observability_settings_one_line_exit_2(tmp_path, capfd, config, flag, fragment):
  workdir = tmp_path / "run"
  r = run_in_process(["train.py", "--config", config, "--workdir", str(workdir), flag], capfd)
  assert r.returncode == 2
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and fragment in lines[0], r.stderr
  assert not workdir.exists()


def test_jax_options_set_jax_config(gpt_run, capfd):
  from laplax.cli import common as cli

  before = jax.config.values
  try:
    argv = cli.jax_options(
      [
        "eval.py",
        "--jax_default_matmul_precision=highest",
        "--workdir",
        "w",
        "--jax_debug_nans=true",
        "--nojax_enable_x64",
      ]
    )
    assert argv == ["eval.py", "--workdir", "w"]
    assert jax.config.jax_default_matmul_precision == "highest"
    assert jax.config.jax_debug_nans is True and jax.config.jax_enable_x64 is False
    # eval.py (flags of its own) takes them too: compiles are logged.
    r = run_in_process(["eval.py", "--workdir", str(gpt_run), "--jax_log_compiles=true"], capfd)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Compiling jit(eval_sums)" in r.stderr
  finally:
    for name in (
      "jax_default_matmul_precision",
      "jax_debug_nans",
      "jax_enable_x64",
      "jax_log_compiles",
    ):
      jax.config.update(name, before[name])
  with pytest.raises(cli.UsageError, match="jax_debug_nans=maybe"):
    cli.jax_options(["train.py", "--jax_debug_nans=maybe"])


def test_only_the_named_noisy_warnings_are_silenced():
  """ml_collections' load_module DeprecationWarning (loading a --config file)
  is silenced; a warning JAX raises (an unusable donated buffer) is not."""
  from ml_collections import config_flags

  from laplax.cli import common as cli

  def load_config_file():
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values)
    values(["train.py", "--config", VIT_CONFIG])
    return values.config

  def noisy(caught):
    return [w for w in caught if "load_module() method is deprecated" in str(w.message)]

  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    load_config_file()
    assert noisy(caught) and noisy(caught)[0].category is DeprecationWarning  # it is real
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cli.silence_noisy_warnings()
    assert load_config_file().task == "classification"
    assert not noisy(caught)
    # A JAX warning still reaches the user.
    jax.jit(lambda x: x[:2], donate_argnums=0)(jax.numpy.ones(3))
    (donation,) = [w for w in caught if "donated buffers were not usable" in str(w.message)]
    assert donation.category is UserWarning
