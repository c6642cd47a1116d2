"""Property-based tests of config validation (hypothesis).

Every generated bad config -- one key of a shipped config set to a value
outside its type or range, or two keys made inconsistent -- must be refused
by the CLI path (``cli.run`` around ``config.validate``) with exit code 2 and
one line naming the key, without a traceback; every generated good config
(random values inside the documented ranges, kept consistent) must pass.
"""

import copy

import hypothesis
import ml_collections
import pytest
from hypothesis import strategies as st

from laplax import spectral, tasks
from laplax.cli import common as cli
from laplax.config import run as run_lib
from laplax.models import layers
from laplax.models import spec as spec_lib

from helpers.configs import load

CONFIGS = ("vit_fashion_mnist", "gpt_shakespeare", "dino_fashion_mnist")
BASE = {name: load(name).to_dict() for name in CONFIGS}

not_int = st.one_of(st.text(max_size=3), st.floats(allow_nan=True), st.booleans(), st.none())
not_number = st.one_of(
  st.text(max_size=3),
  st.booleans(),
  st.none(),
  st.lists(st.integers(), max_size=2),
  st.just(float("inf")),
  st.just(float("nan")),
)
not_bool = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.floats())
unknown_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)


def _valid_targets(t):
  try:
    spectral.check_targets(t)
    return True
  except ValueError:
    return False


# (dotted key, strategy of bad values); the message must name the key.
BAD = [
  ("seed", st.one_of(st.integers(max_value=-1), not_int)),
  ("batch_size", st.one_of(st.integers(max_value=0), not_int)),
  ("total_steps", st.one_of(st.integers(max_value=-1), not_int)),
  ("log_every", st.one_of(st.integers(max_value=0), not_int)),
  ("eval_every", st.one_of(st.integers(max_value=0), not_int)),
  ("checkpoint_every", st.one_of(st.integers(max_value=0), not_int)),
  ("keep_checkpoints", st.one_of(st.integers(max_value=0), st.text(max_size=3))),
  ("model.num_heads", st.one_of(st.integers(max_value=0), not_int)),
  ("model.depth", st.one_of(st.integers(max_value=0), not_int)),
  ("model.width", st.one_of(st.integers(max_value=0), not_int)),
  # None is allowed here: 4 * width (laplax.models.spec.from_config).
  ("model.mlp_dim", st.one_of(st.integers(max_value=0), not_int.filter(lambda v: v is not None))),
  (
    "model.num_laplacian_heads",
    st.one_of(st.integers(max_value=-1), st.integers(min_value=1000), st.text(max_size=3)),
  ),
  ("model.dropout", st.one_of(st.floats(max_value=-1e-9), st.floats(min_value=1.0), not_number)),
  ("model.dtype", unknown_name.filter(lambda s: s not in spec_lib.DTYPES)),
  ("model.implementation", unknown_name.filter(lambda s: s not in ("xla", "cudnn", "reference"))),
  ("model.spectral.mode", unknown_name.filter(lambda s: s not in spectral.MODES)),
  ("model.spectral.lam", st.one_of(st.floats(max_value=-1e-9), not_number)),
  ("model.spectral.enabled", not_bool),
  (
    "model.spectral.targets",
    st.one_of(
      st.text(max_size=4).filter(lambda t: not _valid_targets(t)), st.integers(), st.none()
    ),
  ),
  ("model.remat", unknown_name.filter(lambda s: s not in layers.REMAT_POLICIES)),
  ("model.scan_layers", not_bool),
  ("optim.lr", st.one_of(st.floats(max_value=0.0), not_number)),
  ("optim.b1", st.one_of(st.floats(min_value=1.0 + 1e-9), st.floats(max_value=-1e-9))),
  ("optim.b2", st.one_of(st.floats(min_value=1.0 + 1e-9), st.floats(max_value=-1e-9))),
  ("optim.weight_decay", st.floats(max_value=-1e-9)),
  ("optim.warmup_steps", st.one_of(st.integers(max_value=-1), not_int)),
  # None is allowed here: configs of older runs have no such key (1 then).
  (
    "optim.grad_accum_steps",
    st.one_of(st.integers(max_value=0), not_int.filter(lambda v: v is not None)),
  ),
  ("optim.skip_nonfinite", not_bool),
  ("debug.nan_at_step", st.one_of(st.integers(max_value=0), st.text(max_size=3))),
  ("debug.stall_at_step", st.one_of(st.integers(max_value=0), st.text(max_size=3))),
  ("check_memory", not_bool),
  # None is allowed for the observability keys: configs of older runs lack them.
  (
    "profile.start_step",
    st.one_of(st.integers(max_value=0), not_int.filter(lambda v: v is not None)),
  ),
  (
    "profile.num_steps",
    st.one_of(st.integers(max_value=-1), not_int.filter(lambda v: v is not None)),
  ),
  ("wandb.mode", unknown_name.filter(lambda s: s not in run_lib.WANDB_MODES)),
  ("wandb.project", st.one_of(st.just(""), st.just("  "), st.integers(), st.booleans())),
  ("task", unknown_name.filter(lambda s: s not in tasks.task_names())),
]


def _set(d, dotted, value):
  node = d
  *parents, last = dotted.split(".")
  for p in parents:
    node = node[p]
  node[last] = value


def _check_cli(config_dict, capsys):
  """(exit code, stderr lines) of the CLI's handling of validating ``config_dict``."""
  config = ml_collections.ConfigDict(config_dict)
  with pytest.raises(SystemExit) as exit_info:
    cli.run(lambda guard: 0 if tasks.validate(config, num_devices=1) else 1)
  err = capsys.readouterr().err
  return exit_info.value.code, [l for l in err.splitlines() if l.strip()]


@hypothesis.settings(
  max_examples=150,
  deadline=None,
  suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@pytest.mark.slow
@hypothesis.given(name=st.sampled_from(CONFIGS), data=st.data())
def test_every_bad_value_is_one_line_exit_2(name, data, capsys):
  key, strategy = data.draw(st.sampled_from(BAD), label="key")
  value = data.draw(strategy, label="value")
  d = copy.deepcopy(BASE[name])
  _set(d, key, value)
  code, lines = _check_cli(d, capsys)
  assert code == 2, (key, value)
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  assert "Traceback" not in lines[0]
  # The line names the exact key it refuses, with the value given.
  assert lines[0].startswith(f"error: config.{key}="), (key, value, lines[0])


# (change, the keys the line must name: the first as "error: config.KEY", the
# others anywhere in it).
INCONSISTENT = [
  # heads that do not divide the width
  (
    lambda d: _set(d, "model.num_heads", d["model"]["width"] + 1),
    ["model.width=", "model.num_heads="],
  ),
  # more Laplacian heads than heads
  (
    lambda d: _set(d, "model.num_laplacian_heads", d["model"]["num_heads"] + 1),
    ["model.num_laplacian_heads=", "num_heads="],
  ),
  # a per-layer list of the wrong length
  (
    lambda d: _set(d, "model.num_laplacian_heads", [0] * (d["model"]["depth"] + 1)),
    ["model.num_laplacian_heads ", "model.depth="],
  ),
  # a batch that the micro-batches do not divide
  (
    lambda d: _set(d, "optim.grad_accum_steps", d["batch_size"] + 1),
    ["batch_size=", "config.optim.grad_accum_steps="],
  ),
  # a mesh larger than the one device
  (lambda d: _set(d, "mesh_shape", (2, 1, 1)), ["mesh_shape="]),
  # a head mask of the wrong shape
  (
    lambda d: _set(d, "model.laplacian_mask", ((True,),) * (d["model"]["depth"] + 1)),
    ["model.laplacian_mask ", "depth="],
  ),
  # a misspelt key in a config file
  (lambda d: _set(d, "model.num_haeds", d["model"]["num_heads"]), ["model.num_haeds "]),
  (lambda d: _set(d, "optimizer", {"lr": 1.0}), ["optimizer.lr "]),
]


@hypothesis.settings(
  max_examples=40,
  deadline=None,
  suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(name=st.sampled_from(CONFIGS), which=st.integers(0, len(INCONSISTENT) - 1))
def test_inconsistent_keys_are_one_line_exit_2(name, which, capsys):
  d = copy.deepcopy(BASE[name])
  change, keys = INCONSISTENT[which]
  change(d)
  code, lines = _check_cli(d, capsys)
  assert code == 2 and len(lines) == 1, lines
  assert lines[0].startswith("error: config." + keys[0]), (keys, lines[0])
  assert all(k in lines[0] for k in keys[1:]), (keys, lines[0])


@st.composite
def good_configs(draw):
  """A shipped config with random values inside every documented range."""
  d = copy.deepcopy(BASE[draw(st.sampled_from(CONFIGS))])
  m = d["model"]
  heads = draw(st.sampled_from([1, 2, 4, 8]))
  m["num_heads"] = heads
  m["width"] = heads * draw(st.sampled_from([8, 16, 32]))
  m["depth"] = draw(st.integers(1, 6))
  m["mlp_dim"] = draw(st.integers(1, 512))
  m["num_laplacian_heads"] = draw(
    st.one_of(
      st.integers(0, heads),
      st.lists(st.integers(0, heads), min_size=m["depth"], max_size=m["depth"]),
    )
  )
  m["dropout"] = draw(st.floats(0.0, 0.99))
  m["dtype"] = draw(st.sampled_from(spec_lib.DTYPES))
  m["implementation"] = draw(st.sampled_from([None, "xla", "reference"]))
  m["spectral"]["enabled"] = draw(st.booleans())
  m["spectral"]["lam"] = draw(st.floats(0.0, 1e3))
  m["remat"] = draw(st.sampled_from(["none", "full", "dots_saveable"]))
  m["scan_layers"] = draw(st.booleans())
  accum = draw(st.integers(1, 4))
  d["batch_size"] = accum * draw(st.integers(1, 64))
  d["optim"]["grad_accum_steps"] = accum
  d["optim"]["lr"] = draw(st.floats(1e-6, 1.0))
  d["optim"]["b2"] = draw(st.floats(0.0, 1.0))
  d["optim"]["warmup_steps"] = draw(st.integers(0, 1000))
  d["optim"]["skip_nonfinite"] = draw(st.booleans())
  d["debug"]["nan_at_step"] = draw(st.one_of(st.none(), st.integers(1, 10**6)))
  d["debug"]["stall_at_step"] = draw(st.one_of(st.none(), st.integers(1, 10**6)))
  d["check_memory"] = draw(st.booleans())
  d["profile"]["start_step"] = draw(st.integers(1, 10**6))
  d["profile"]["num_steps"] = draw(st.integers(0, 100))
  d["wandb"]["mode"] = draw(st.sampled_from([None, *run_lib.WANDB_MODES]))
  d["wandb"]["project"] = draw(
    st.one_of(st.none(), st.text(min_size=1, max_size=8).filter(str.strip))
  )
  d["seed"] = draw(st.integers(0, 2**31 - 1))
  d["total_steps"] = draw(st.integers(0, 10**6))
  for key in ("log_every", "eval_every", "checkpoint_every"):
    d[key] = draw(st.integers(1, 10**4))
  return d


@hypothesis.settings(
  max_examples=100,
  deadline=None,
  suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(d=good_configs())
def test_every_good_config_passes(d, capsys):
  code, lines = _check_cli(d, capsys)
  assert code == 0, lines
