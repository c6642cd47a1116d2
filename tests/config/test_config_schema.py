"""The config schema (:mod:`laplax.tasks.schema`): a config is completed once,
on load and in ``train.py``, so that code downstream reads every key as an
attribute.

Invariants: completing a minimal config gives exactly the keys of the task's
base config (and of its data table), each at its default -- the spec's for the
model, :data:`~laplax.tasks.schema.OLD_RUN_VALUES` where a run saved before
the key existed behaved otherwise; the values a config has are kept; completing
twice changes nothing. A static scan keeps ``.get(key, default)`` reads of
configs out of ``laplax/``.
"""

from __future__ import annotations

import ast
import json
import pathlib
import shutil

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from laplax import tasks, utils
from laplax.cli import common as cli
from laplax.config import defaults
from laplax.config import validation as config_lib
from laplax.data.text import corpus as text
from laplax.data.text import fineweb
from laplax.data.vision import images, multicrop
from laplax.evaluators import registry
from laplax.models import spec as spec_lib
from laplax.proj.nanochat.data import mixture as chat_mixture
from laplax.tasks import base, schema
from laplax.workdir import files as workdir_lib

LIBRARY = pathlib.Path(__file__).resolve().parents[2] / "laplax"


def _flat(config) -> dict:
  return utils.flatten_dotted(json.loads(config.to_json()), keep_empty=True)


def _minimal(task: str, **data) -> ml_collections.ConfigDict:
  """What a run saved long ago may hold: its task, model family and data name."""
  family = tasks.TASKS[task].family
  return ml_collections.ConfigDict(
    {"task": task, "model": {"name": family}, **({"data": data} if data else {})}
  )


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_a_minimal_config_gets_every_base_key_at_its_default(task):
  """Every key of the base config, nothing else; each at the base config's
  value, but the model's at the spec's defaults and the keys of the old-run
  table at their old value."""
  got = _flat(schema.complete(_minimal(task)))
  base = _flat(tasks.TASKS[task].base_config())
  if task == "lm":  # saved before evals and its samples: none (upgrade_saved)
    assert got.pop("eval.sample_tokens") == 0
    got["eval"] = base["eval"]
  assert set(got) == set(base)
  model = utils.flatten_dotted({"model": spec_lib.config_defaults(tasks.TASKS[task].family)})
  old = {
    k: list(v) if isinstance(v, tuple) else v for k, v in schema.OLD_RUN_VALUES.items() if k in base
  }
  assert "optim.weight_decay_exclude" in old and "profile.start_step" in old
  for key, value in got.items():
    want = old[key] if key in old else model[key] if key in model else base[key]
    assert value == want, key
  assert not config_lib.unknown_keys(schema.complete(_minimal(task)), tasks.TASKS[task])


@pytest.mark.parametrize(
  "task,name,table",
  [
    ("lm", "fineweb_edu", fineweb.default_config),
    ("lm", "chat_mid", lambda: chat_mixture.default_config("chat_mid")),
    ("lm", "chat_sft", lambda: chat_mixture.default_config("chat_sft")),
    ("lm", "text_corpus", text.default_config),
    ("classification", "cifar10", lambda: images.default_config("cifar10")),
    ("classification", "imagenet2012", lambda: images.default_config("imagenet2012")),
  ],
)
def test_the_data_section_is_the_table_of_its_data_name(task, name, table):
  """``data`` gets the keys of the pipeline ``data.name`` names (beside the
  dataset code), not those of the base config's data set."""
  got = schema.complete(_minimal(task, name=name)).data.to_dict()
  want = table().to_dict()
  for key in schema.OLD_RUN_VALUES:
    section, _, leaf = key.partition(".")
    if section == "data" and leaf in want:
      want[leaf] = schema.OLD_RUN_VALUES[key]
  assert got == want


def test_dino_gets_the_multicrop_views_of_its_data_set():
  data = schema.complete(_minimal("dino", name="imagenet2012")).data
  assert data.multicrop.to_dict() == multicrop.default_multicrop_config("imagenet2012").to_dict()
  assert (data.multicrop.num_local, data.image_size, data.eval_split) == (10, 224, "validation")


def test_the_old_run_table_applies_to_the_keys_of_the_task_only():
  lm = registry.complete(schema.complete(_minimal("lm", name="chat_sft")))
  assert lm.eval.sample_tokens == 0 and lm.eval.sample_prompt_tokens == 16
  new = registry.complete(schema.complete(defaults.gpt_base_config()))
  assert new.eval.sample_tokens == 64  # a config with evals is not an old run
  assert lm.data.smoltalk_stop is None and lm.optim.weight_decay_exclude == ()
  vit = schema.complete(_minimal("classification"))
  assert "eval" not in vit and "smoltalk_stop" not in vit.data
  # A config that has the key keeps its value.
  c = _minimal("lm", name="chat_sft")
  c.data.smoltalk_stop = 7
  assert schema.complete(c).data.smoltalk_stop == 7


@pytest.mark.parametrize(
  "path", sorted((LIBRARY.parent / "configs").glob("*.py")), ids=lambda p: p.stem
)
def test_every_shipped_config_is_complete_already(path):
  """``train.py`` completes its config: for the configs of ``configs/`` that
  adds and changes nothing, so their runs are those of before the schema."""
  config = utils.config_from_file(str(path))
  before = _flat(config)
  assert _flat(schema.complete(config)) == before


@pytest.mark.parametrize("name", ["gpt_shakespeare", "dino_fashion_mnist", "vit_fashion_mnist"])
def test_given_values_stay_and_completing_twice_changes_nothing(name):
  """A config with keys dropped gets them back at their defaults, its other
  values untouched; completing the result again changes nothing."""
  full = utils.config_from_file(str(LIBRARY.parent / "configs" / f"{name}.py"))
  saved = json.loads(full.to_json())
  saved["optim"]["lr"] = 0.125
  del saved["keep_checkpoints"], saved["optim"]["weight_decay_exclude"]
  del saved["model"]["qk_norm"], saved["data"]["prefetch"], saved["profile"]
  once = schema.complete(ml_collections.ConfigDict(saved))
  twice = _flat(schema.complete(ml_collections.ConfigDict(json.loads(once.to_json()))))
  assert _flat(once) == twice
  assert once.optim.lr == 0.125 and once.model.width == full.model.width
  assert once.keep_checkpoints == 3 and once.optim.weight_decay_exclude == ()
  assert once.model.qk_norm is False and once.data.prefetch == full.data.prefetch
  assert (once.profile.start_step, once.profile.num_steps) == (1, 0)


def test_upgrade_saved_runs_before_the_fill(monkeypatch):
  """The task's hook sees the config before any default is added (a renamed
  key moves to its new name and is not overwritten by the default)."""
  seen = []

  def upgrade(config):
    seen.append(sorted(config.optim.keys()))
    config.optim.lr = config.optim.learning_rate
    del config.optim["learning_rate"]

  monkeypatch.setattr(tasks.ClassificationTask, "upgrade_saved", staticmethod(upgrade))
  c = _minimal("classification")
  c.optim = ml_collections.ConfigDict({"learning_rate": 0.5})
  schema.complete(c)
  assert seen == [["learning_rate"]] and c.optim.lr == 0.5 and "learning_rate" not in c.optim
  base.TaskBase.upgrade_saved(c)  # the default: nothing


def test_a_broken_config_is_left_for_validation():
  for broken in (
    {"model": {}},
    {"task": "regression", "model": {}},
    {"task": "lm", "model": 3},
    {"task": "lm", "model": {}, "data": {"name": 5}},
  ):
    c = ml_collections.ConfigDict(broken)
    assert schema.complete(c).to_dict() == broken


@pytest.mark.parametrize("name", [5, None, " "])
def test_a_data_name_that_names_no_data_set_is_one_config_error(name):
  """The data table is chosen by ``data.name``: validation refuses one that
  is not a name before it looks the table up."""
  config = defaults.gpt_base_config().to_dict()
  config["data"]["name"] = name
  with pytest.raises(config_lib.ConfigError, match="config.data.name="):
    tasks.validate(ml_collections.ConfigDict(config))


def test_load_saved_config_completes_an_old_config_json(tmp_path):
  """A config.json saved before some keys existed loads complete, validates,
  and still belongs to the same architecture as today's config."""
  config = utils.config_from_file(str(LIBRARY.parent / "configs" / "gpt_shakespeare.py"))
  saved = json.loads(config.to_json())
  del saved["eval"], saved["evals"], saved["checkpoint_verify"], saved["optim"]["schedule"]
  del saved["data"]["validation_every"], saved["model"]["rope_theta"], saved["wandb"]
  (tmp_path / workdir_lib.CONFIG_FILE).write_text(json.dumps(saved))
  loaded = registry.complete(workdir_lib.load_saved_config(str(tmp_path)))
  want = _flat(registry.complete(config))
  want["eval.sample_tokens"] = 0  # no samples before they existed
  assert _flat(loaded) == want
  tasks.validate(loaded, None, strict_keys=True)
  assert config_lib.architecture_diff(loaded.to_dict(), config) == []


def test_train_config_flag_is_completed_and_stays_locked(tmp_path):
  """``train.py``'s ``--config`` (a file whose config lacks keys) is
  completed before anything reads it."""
  path = tmp_path / "short.py"
  path.write_text(
    "from laplax.config import defaults\n\n\ndef get_config():\n"
    "  c = defaults.base_config()\n  del c.keep_checkpoints, c.optim.grad_accum_steps\n"
    "  return c\n"
  )
  argv = ["train.py", f"--config={path}", "--config.optim.lr=0.25"]
  values = flags.FlagValues()  # as laplax.sweep checks a train.py command line
  config_flags.DEFINE_config_file(
    "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
  )
  cli.parse_flags(argv, values, jax_config=False)
  config = cli.load_config_flag("config", values, argv)
  assert config.keep_checkpoints == 3 and config.optim.grad_accum_steps == 1
  assert config.optim.lr == 0.25 and config.is_locked
  assert _flat(config) == {**_flat(defaults.base_config()), "optim.lr": 0.25}


# Calls of ``X.get(KEY, DEFAULT)`` on a config that stay, by design, with the
# reason. (file relative to laplax/, enclosing function) -> reason.
ALLOWED = {
  (
    "tasks/dino.py",
    "upgrade_saved",
  ): "reads the switches config.evals replaced, which only an old run's config has",
  (
    "tasks/dino.py",
    "saved_evals",
  ): "reads the switches config.evals replaced, which only an old run's config has",
}


def config_get_calls(root: pathlib.Path) -> list[tuple[str, str, int, str]]:
  """``(file, function, line, call)`` of every ``X.get(key, default)`` in the
  ``.py`` files under ``root`` whose receiver ``X`` names a config (its source
  contains ``config``); for ``config_lib.get(config, key, default)`` (the dotted
  getter of :mod:`laplax.config.validation`) the default is the third argument."""
  found = []
  for path in sorted(root.rglob("*.py")):
    tree = ast.parse(path.read_text(), str(path))
    owner = {}
    for func in ast.walk(tree):
      if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for inner in ast.walk(func):
          owner[id(inner)] = func.name  # the innermost function wins (walked last)
    for node in ast.walk(tree):
      if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
      ):
        continue
      receiver = ast.unparse(node.func.value)
      if "config" not in receiver:
        continue
      given = len(node.args) + len(node.keywords)
      if given >= (3 if receiver.endswith(("config_lib", "validation")) else 2):
        found.append(
          (
            str(path.relative_to(root)),
            owner.get(id(node), "<module>"),
            node.lineno,
            ast.unparse(node),
          )
        )
  return found


def test_no_config_get_with_a_default_outside_the_allowed_places():
  """Downstream code reads a complete config: ``config.keep_checkpoints``,
  not ``config.get("keep_checkpoints", 3)`` (which repeats the default)."""
  found = config_get_calls(LIBRARY)
  bad = [
    f"laplax/{f}:{line} in {func}: {call}"
    for f, func, line, call in found
    if (f, func) not in ALLOWED
  ]
  assert not bad, "read these keys as attributes (laplax.tasks.schema):\n" + "\n".join(bad)
  assert {(f, func) for f, func, _, _ in found} <= set(ALLOWED)


def test_the_scan_finds_config_gets(tmp_path):
  (tmp_path / "m.py").write_text(
    "def f(config, data_config, config_lib, m):\n"
    "  a = config.get('keep_checkpoints', 3)\n"
    "  b = data_config.get('streams', 1)\n"
    "  c = config_lib.get(config, 'data.prefetch', 2)\n"
    "  d = config_lib.get(config, 'data.prefetch')\n"
    "  e = config.model.get('name')\n"
    "  return m.get('x', 1), config.keep_checkpoints\n"
  )
  assert [line for _, _, line, _ in config_get_calls(tmp_path)] == [2, 3, 4]


def _strip(saved: dict, keep: set[str]) -> dict:
  """``saved`` without every leaf key outside ``keep`` (and sections left empty)."""
  out = {}
  for key, value in saved.items():
    if isinstance(value, dict):
      inner = _strip(value, {k.partition(".")[2] for k in keep if k.startswith(key + ".")})
      if inner:
        out[key] = inner
    elif key in keep:
      out[key] = value
  return out


@pytest.mark.slow
def test_an_old_workdir_resumes_bitwise_and_is_evaluated(tmp_path):
  """A tiny GPT run of 4 steps; a copy of it at step 2 whose config.json holds
  only the keys every config had at the start (``REQUIRED``, the data set,
  the eval batch size)
  and its model's options that differ from the spec's defaults resumes to
  step 4 bitwise equal to the run, and eval.py scores it as the run's own
  last evaluation."""
  from helpers.resume import GPT_CONFIG, GPT_TINY, assert_bitwise_equal, saved_state
  from helpers.runs import run_in_process

  text = tmp_path / "text"
  text.mkdir()
  (text / "a.txt").write_text("To be, or not to be, that is the question. " * 60)
  (text / "b.txt").write_text("All the world's a stage, and all the men and women. " * 60)
  args = lambda workdir: (
    [
      "train.py",
      "--workdir",
      str(workdir),
      "--config",
      GPT_CONFIG,
      f"--config.data.source_dir={text}",
      f"--config.data.data_dir={tmp_path / 'tfds'}",
    ]
    + GPT_TINY
    + [
      "--config.total_steps=4",
      "--config.checkpoint_every=2",
      "--config.eval_every=4",
      "--config.log_every=1",
    ]
  )
  run = tmp_path / "run"
  assert run_in_process(args(run)).returncode == 0
  old = tmp_path / "old"
  shutil.copytree(run, old)
  shutil.rmtree(old / "checkpoints" / "4")
  saved = json.loads((run / workdir_lib.CONFIG_FILE).read_text())
  spec = utils.flatten_dotted({"model": spec_lib.config_defaults("gpt")})
  keep = (
    set(config_lib.REQUIRED)
    | {"model.name", "data.name", "eval_batch_size"}
    | {k for k, v in utils.flatten_dotted(saved).items() if k in spec and v != spec[k]}
  )
  (old / workdir_lib.CONFIG_FILE).write_text(json.dumps(_strip(saved, keep)))
  assert run_in_process(args(old)).returncode == 0  # resumed from step 2
  assert_bitwise_equal(saved_state(run)[1], saved_state(old)[1])
  (old / workdir_lib.CONFIG_FILE).write_text(json.dumps(_strip(saved, keep)))
  assert run_in_process(["eval.py", "--workdir", str(old)]).returncode == 0
  records = [json.loads(l) for l in (run / workdir_lib.METRICS_FILE).read_text().splitlines()]
  final = [r for r in records if r["split"] == "eval"][-1]
  result = json.loads((old / "eval.json").read_text())
  assert result["step"] == 4 and result["loss"] == final["loss"]
