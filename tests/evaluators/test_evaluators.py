"""The evaluators chosen by name (laplax.evaluators.registry, config.evals):
every task's names exist, each stage gets its part of the list in order, a
run saved before config.evals existed keeps its evaluations, DINO's
features are computed once per round, and the numbers are those of the
definitions (k-NN and the linear probe on the teacher's features)."""

import json

import pytest

from laplax import optim, tasks
from laplax import state as state_lib
from laplax.config import validation as config_lib
from laplax.evaluators import probes, registry
from laplax.tasks import schema

from helpers.configs import load
from helpers.dino import TINY
from helpers.lm import GPT_CONFIG
from helpers.lm import TINY as GPT_TINY
from helpers.runs import read_metrics, run_in_process


def test_every_task_has_evaluators_and_defaults_to_some_of_them():
  """The registry is found from the modules: every evaluator declares its
  name, stages, tasks and settings; each task's default list is among the
  evaluators that take it, and its config gets their settings."""
  found = registry.registered()
  assert {
    "classification",
    "bits_per_byte",
    "samples",
    "multiple_choice",
    "knn",
    "linear_probe",
    "raw_pixel_knn",
    "segmentation",
    "patch_pca",
    "arc_easy",
    "arc_challenge",
    "mmlu",
    "gsm8k",
    "humaneval",
  } <= set(found)
  for name, cls in found.items():
    assert cls.name == name and set(cls.stages) <= {registry.TRAIN, registry.EVAL}
    assert set(cls.tasks) <= set(tasks.TASKS), name
  for name, cls in tasks.TASKS.items():
    defaults = registry.names(cls.base_config())
    assert defaults and set(defaults) <= set(registry.accepted(name)), name
    c = registry.complete(cls.base_config())
    assert dict(c.get("eval", {})) == registry.eval_defaults(name), name
  assert registry.eval_defaults("dino")["knn_k"] == 20
  assert "samples" in registry.accepted("lm") and "samples" not in registry.accepted("dino")
  assert registry.accepted("classification") == ("classification",)


@pytest.mark.parametrize(
  "saved,expected",
  [
    ({}, "knn,linear_probe,raw_pixel_knn,segmentation,patch_pca"),
    ({"linear_probe": False}, "knn,raw_pixel_knn,segmentation,patch_pca"),
    ({"linear_probe": True, "segmentation": False}, "knn,linear_probe,raw_pixel_knn,patch_pca"),
    ({"linear_probe": False, "segmentation": False}, "knn,raw_pixel_knn,patch_pca"),
  ],
)
def test_a_dino_run_saved_before_evals_keeps_what_its_switches_meant(saved, expected):
  """Completing a saved config (laplax.tasks.schema) turns the switches
  config.evals replaced into the list they meant, and drops them; a config
  with both keeps them for validation to refuse."""
  c = load("dino_fashion_mnist")
  with c.unlocked():
    del c.evals
    c.eval.update(saved)
  schema.complete(c)
  assert registry.names(c) == tuple(expected.split(","))
  assert "linear_probe" not in c.eval and "segmentation" not in c.eval
  tasks.validate(c)
  registry.validate(c)
  if saved:
    with c.unlocked():
      c.eval.update(saved)
    schema.complete(c)
    with pytest.raises(config_lib.ConfigError, match="was replaced by config.evals"):
      registry.validate(c)


def test_saved_image_and_language_runs_get_the_old_evaluations():
  for config, expected in (
    ("vit_fashion_mnist", ("classification",)),
    ("gpt_shakespeare", ("bits_per_byte", "samples")),
  ):
    c = load(config)
    with c.unlocked():
      del c.evals
    assert registry.names(schema.complete(c)) == expected


ALL_DINO = "knn,linear_probe,raw_pixel_knn,segmentation,patch_pca"


@pytest.fixture(scope="module")
def dino_run(fmnist_data_dir):
  """A tiny DINO task on Fashion-MNIST slices and its initial state."""
  from bench.common import apply_override

  c = registry.complete(load("dino_fashion_mnist"))
  overrides = [a for a in TINY if a.startswith("--config.")] + [
    f"--config.data.data_dir={fmnist_data_dir}",
    "--config.data.train_split=train[:300]",
    "--config.data.eval_split=test[:100]",
    "--config.eval_batch_size=100",
    "--config.eval.pca_images=2",
  ]
  for arg in overrides:
    apply_override(c, arg[len("--config.") :])
  with c.unlocked():
    c.evals = ALL_DINO
  run = tasks.validate(c)
  registry.validate(c)
  task = tasks.make_task(run, None)
  return task, state_lib.init_state(task, optim.make_optimizer(c), c.seed)


@pytest.mark.slow
def test_each_stage_runs_its_part_of_the_list_in_order(dino_run):
  task, _ = dino_run
  assert [e.name for e in registry.build(task, registry.TRAIN)] == ["knn", "linear_probe"]
  assert [e.name for e in registry.build(task, registry.EVAL)] == [
    "knn",
    "linear_probe",
    "raw_pixel_knn",
    "segmentation",
    "patch_pca",
  ]
  with task.config.unlocked():
    task.config.evals = "patch_pca,knn"
  try:
    assert [e.name for e in registry.build(task, registry.TRAIN)] == ["knn"]
    assert [e.name for e in registry.build(task, registry.EVAL)] == ["patch_pca", "knn"]
  finally:
    with task.config.unlocked():
      task.config.evals = ALL_DINO


@pytest.mark.slow
@pytest.mark.subprocess
def test_dino_numbers_are_the_definitions_on_features_computed_once(dino_run, tmp_path):
  """knn and linear_probe equal probes.* on the teacher's features; the
  features of each split are computed once per round (the patch tokens for
  the PCA ride with the eval split's); the figure is written and listed."""
  task, state = dino_run
  calls = []
  features = task.features

  def counted(params, split, *, with_tokens=0):
    calls.append((split, with_tokens))
    return features(params, split, with_tokens=with_tokens)

  task.features = counted
  try:
    evaluators = [registry.get(n)(task) for n in ("knn", "linear_probe", "patch_pca")]
    ctx = registry.Context(out_dir=str(tmp_path), say=lambda line: None)
    summary, texts = registry.run(evaluators, state, ctx)
  finally:
    del task.features
  c = task.config
  assert sorted(calls) == sorted([(c.data.train_split, 0), (c.data.eval_split, 2)])
  assert texts == {} and ctx.figures == [str(tmp_path / probes.PCA_FIGURE)]
  assert (tmp_path / probes.PCA_FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  _, params = task.backbone(state)
  train_x, train_y, _, _ = features(params, c.data.train_split)
  test_x, test_y, _, _ = features(params, c.data.eval_split)
  knn = probes.knn_accuracy(
    train_x,
    train_y,
    test_x,
    test_y,
    num_classes=10,
    k=c.eval.knn_k,
    temperature=c.eval.knn_temperature,
  )
  probe = probes.linear_probe(train_x, train_y, test_x, test_y, num_classes=10, seed=c.seed)
  assert summary == {
    "knn_accuracy": float(knn),
    "num_examples": 100,
    "linear_probe_accuracy": float(probe["accuracy"]),
  }


@pytest.mark.slow
def test_the_training_loop_and_eval_py_run_the_configs_evaluators(tmp_path, corpus, capfd):
  """A GPT whose config.evals drops samples writes no sample text at its
  evaluations (test_observability checks the default list writes one per
  evaluation), and eval.py writes the bits per byte of the last one."""
  workdir = tmp_path / "run"
  r = run_in_process(
    [
      "train.py",
      "--config",
      GPT_CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.source_dir={corpus}",
      f"--config.data.data_dir={tmp_path / 'tfds'}",
      "--config.total_steps=4",
      "--config.eval_every=2",
      "--config.evals=bits_per_byte",
    ]
    + GPT_TINY,
    capfd,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  records = read_metrics(workdir)
  evals = [x for x in records if x["split"] == "eval"]
  assert [x["step"] for x in evals] == [2, 4] and "bits_per_byte" in evals[-1]
  assert not [x for x in records if x["split"] == "sample"]
  r = run_in_process(["eval.py", "--workdir", str(workdir)], capfd)
  assert r.returncode == 0, r.stderr[-2000:]
  result = json.loads((workdir / "eval.json").read_text())
  assert result["bits_per_byte"] == pytest.approx(evals[-1]["bits_per_byte"], rel=1e-6)
  assert result["num_tokens"] == evals[-1]["num_tokens"]


NEW_EVALUATOR = """
from laplax.config import validation as config_lib
from laplax.evaluators.base import Evaluator


class TargetCount(Evaluator):
  name = "target_count"
  tasks = ("lm",)
  defaults = {"target_count_batches": 1}

  @classmethod
  def validate(cls, config):
    config_lib.check_int(config, "eval.target_count_batches", 1)

  def run(self, state, ctx):
    total = 0
    for i, batch in enumerate(self.task.eval_batches()):
      if i == self.settings["target_count_batches"]:
        break
      total += int(batch["mask"].sum())
    return {"target_count": total}
"""


@pytest.fixture
def new_evaluator(tmp_path, monkeypatch):
  """An evaluator in a module of its own (outside laplax), imported; removed
  from the registry afterwards (its class is collected)."""
  import gc
  import importlib
  import sys

  (tmp_path / "laplax_test_new_evaluator.py").write_text(NEW_EVALUATOR)
  monkeypatch.syspath_prepend(str(tmp_path))
  importlib.import_module("laplax_test_new_evaluator")
  yield "target_count"
  del sys.modules["laplax_test_new_evaluator"]
  gc.collect()
  assert "target_count" not in registry.registered()


def test_a_new_evaluator_is_one_module_and_one_config_entry(tmp_path, corpus, capfd, new_evaluator):
  """A module defining an evaluator and its name in config.evals: train.py
  runs it at each evaluation with its setting from the command line (no
  config file has the key), eval.py runs it with its saved setting or a new
  one; its numbers are the eval split's target tokens (all batches: the
  bits_per_byte evaluator's num_tokens; one batch: the first batch's)."""
  from laplax import loading

  workdir = tmp_path / "run"
  r = run_in_process(
    [
      "train.py",
      "--config",
      GPT_CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.source_dir={corpus}",
      f"--config.data.data_dir={tmp_path / 'tfds'}",
      "--config.total_steps=2",
      "--config.eval_every=2",
      f"--config.evals=bits_per_byte,{new_evaluator}",
      "--config.eval.target_count_batches=1000",
    ]
    + GPT_TINY,
    capfd,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  final = [x for x in read_metrics(workdir) if x["split"] == "eval"][-1]
  assert final["target_count"] == final["num_tokens"] > 0
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["eval"]["target_count_batches"] == 1000
  r = run_in_process(
    ["eval.py", "--workdir", str(workdir), "--config.eval.target_count_batches=1"], capfd
  )
  assert r.returncode == 0, r.stderr[-2000:]
  result = json.loads((workdir / "eval.json").read_text())
  first = next(iter(loading.load(str(workdir)).task.eval_batches()))
  assert result["target_count"] == int(first["mask"].sum()) < final["num_tokens"]
  r = run_in_process(
    ["eval.py", "--workdir", str(workdir), "--config.eval.target_count_batches=0"], capfd
  )
  assert r.returncode == 2 and "config.eval.target_count_batches=0" in r.stderr
