"""FLOPs budgets (nanochat's --target-flops): the FLOPs per token against
nanochat's estimate counted by hand and against the parameters the GPT
builds, the number of updates of a budget, nanochat's precedence
(--num-iterations, then the budget, then the parameter-data ratio), and the
sweep's budget grid with its results.csv column."""

import jax
import pytest
from absl import flags
from ml_collections import config_flags

from laplax import sweep, tasks
from laplax.cli import common as cli
from laplax.config import defaults
from laplax.config import run as run_lib
from laplax.config import validation as config_lib

from helpers.configs import load
from helpers.runs import ROOT

D20 = f"{ROOT}/configs/gpt_d20.py"


def _tiny_fork(**model):
  """The fork's recipe at depth 2 (width 128, one head of 128), vocabulary
  100 padded to 128, context 256: windows [128, full]."""
  c = load("gpt_d20", "recipe=nanochat-fork,depth=2,laplacian=0")
  c.data.vocab_size = 100
  c.model.max_length = 256
  c.model.update(model)
  return c


def test_flops_per_token_is_nanochat_s_estimate_by_hand():
  """estimate_flops of the fork (nanochat/gpt.py L387-417) written out for a
  small case, and the facts of the fork's d12 / d20 / d24 at 2048 tokens."""
  c = _tiny_fork()
  d, mlp, vpad = 128, 512, 128
  # Linear weights: 2 blocks of W_Q, W_K, W_V, W_O and the MLP; the gate of
  # the one value-embedding layer (layer 1: 1 % 2 == (2 - 1) % 2), 12 x 1
  # head; the smear gate 24; lm_head [128, 128].
  matmul = 2 * (4 * d * d + 2 * d * mlp) + 12 * 1 + 24 + vpad * d
  # Layer 0 is S: ceil(256 / 4 / 128) * 128 = 128 tokens; layer 1 (the last) full.
  attention = 12 * 1 * 128 * 128 + 12 * 1 * 128 * 256
  assert defaults.gpt_flops_per_token(c) == 6 * matmul + attention == 3_047_640
  plain = _tiny_fork(value_embeds=False, smear=False, window_pattern=None)
  assert defaults.gpt_flops_per_token(plain) == 6 * (matmul - 36) + 2 * 12 * 128 * 256
  for depth, flops in ((12, 759_696_048), (20, 2_886_212_784), (24, 4_775_225_616)):
    assert defaults.gpt_flops_per_token(load("gpt_d20", f"recipe=nanochat-fork,depth={depth}")) == (
      flops
    )


@pytest.mark.parametrize(
  "model",
  [
    {},
    {"mlp_activation": "gelu_glu", "tie_embeddings": True, "use_bias": True},
    {"num_heads": 4, "num_kv_heads": 2},  # grouped-query: W_K, W_V of 64 columns
  ],
)
def test_the_counted_weights_are_the_gpt_s_matrices(model):
  """6 x (the weights counted) is the FLOPs per token without attention: every
  parameter with two or more dimensions the GPT builds, less the token and
  value-embedding tables (lookups), plus lm_head a tied table stands for."""
  c = _tiny_fork(**model)
  task = tasks.TASKS["lm"].from_shapes(c)
  params = jax.eval_shape(task.init, jax.random.PRNGKey(0))
  counted = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if leaf.ndim >= 2 and not name.startswith(("token_embedding", "value_embed")):
      counted += leaf.size
  if c.model.tie_embeddings:
    counted += 128 * 128
  attention = 12 * 128 * 128 + 12 * 128 * 256
  assert defaults.gpt_flops_per_token(c) == 6 * counted + attention


def test_updates_of_a_budget_by_hand_and_python_rounding():
  """d12 at 1e18 FLOPs: 1e18 / (759,696,048 x 256 x 2048) = 2510.6 -> 2511
  updates, the ratio's 2,520 off; a budget of exactly 2.5 steps rounds to 2
  (Python's round, as base_train.py)."""
  assert load("gpt_d20", "recipe=nanochat-fork,depth=12").total_steps == 2520
  c = load("gpt_d20", "recipe=nanochat-fork,depth=12,target_flops=1e18")
  assert (c.batch_size, c.model.max_length, c.target_flops) == (256, 2048, 1e18)
  assert c.total_steps == round(1e18 / (759_696_048 * 256 * 2048)) == 2511
  c.target_flops = 2.5 * 759_696_048 * 256 * 2048
  assert defaults.target_flops_steps(c) == 2
  c.target_flops = 3.5 * 759_696_048 * 256 * 2048
  assert defaults.target_flops_steps(c) == 4
  # 3a5e0bc's d20 (no windows, untied, 65,536 tokens): 6 (N - N_wte) + 12 l h q t.
  d20 = load("gpt_d20", "target_flops=1e19")
  per_token = 6 * (560_988_160 - 65536 * 1280) + 12 * 20 * 10 * 128 * 2048
  assert d20.total_steps == round(1e19 / (per_token * 256 * 2048))


def _from_command_line(argv):
  """The config train.py builds from ``argv`` (after ``train.py``)."""
  argv = ["train.py"] + argv
  values = flags.FlagValues()
  config_flags.DEFINE_config_file(
    "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
  )
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  cli.parse_flags(argv, values, jax_config=False)
  config = cli.load_config_flag("config", values, argv)
  cli.model_from_init(config, argv)
  cli.apply_target_flops(config, argv)
  return config


def test_precedence_steps_then_budget_then_ratio():
  """--config.total_steps wins over the budget (nanochat's --num-iterations);
  the budget over the ratio; a --config.target_flops override counts on the
  final config (here with the batch halved: twice the updates)."""
  fork = f"{D20}:recipe=nanochat-fork,depth=12"
  assert _from_command_line(["--config", fork]).total_steps == 2520
  c = _from_command_line(["--config", fork + ",target_flops=1e18"])
  assert c.total_steps == 2511
  c = _from_command_line(["--config", fork + ",target_flops=1e18", "--config.total_steps=7"])
  assert (c.total_steps, c.target_flops) == (7, 1e18)
  c = _from_command_line(
    ["--config", fork, "--config.target_flops=1e18", "--config.batch_size=128"]
  )
  assert c.total_steps == round(1e18 / (759_696_048 * 128 * 2048)) == 5021


def test_a_budget_of_no_update_is_one_error_line():
  c = _tiny_fork()
  c.target_flops = 1.0
  defaults.apply_target_flops(c)
  with pytest.raises(config_lib.ConfigError) as e:
    run_lib.check_target_flops(c)
  assert "config.target_flops=1 is less than half a step" in str(e.value)
  assert "\n" not in str(e.value)
  c.target_flops = -1.0
  with pytest.raises(config_lib.ConfigError, match=r"config.target_flops=-1.0 must be a finite"):
    run_lib.check_target_flops(c)


def test_the_sweep_s_budget_grid_and_results_column(tmp_path):
  """--grid :target_flops=... as the fork's FLOPS_BUDGETS: every cell trains
  the updates of its budget (the overrides of the CPU sweep counted), and
  results.csv says the budget (``optimal`` without one)."""
  overrides = [
    "--config.model.max_length=64",
    "--config.batch_size=16",
    "--config.data.vocab_size=2048",
  ]
  runs = sweep.plan(
    f"{D20}:recipe=nanochat-fork,laplacian=0",
    sweep.parse_grid([":target_flops=1e12,4e12", ":depth=1,2"]),
    [1],
    overrides,
    str(tmp_path),
  )
  assert [r.name for r in runs] == [
    "target_flops=1e12,depth=1,seed=1",
    "target_flops=1e12,depth=2,seed=1",
    "target_flops=4e12,depth=1,seed=1",
    "target_flops=4e12,depth=2,seed=1",
  ]
  configs = sweep.check_runs(runs)
  for r in runs:
    c = configs[r.name]
    budget = dict(r.cell)[":target_flops"]
    per_token = defaults.gpt_flops_per_token(c)
    assert (c.batch_size, c.model.max_length, c.data.vocab_size) == (16, 64, 2048)
    assert c.total_steps == round(float(budget) / (per_token * 16 * 64)) > 0
  # depth 1, width 128: 6 (4 x 128^2 + 2 x 128 x 512 + 12 + 24 + 2048 x 128) + 12 x 128 x 64.
  assert defaults.gpt_flops_per_token(configs[runs[0].name]) == 2_851_032
  results = {r.name: {"metrics": {"bits_per_byte": 2.0}} for r in runs[:2]}
  rows = sweep.result_rows(runs, configs, results)
  assert [row["flops_budget"] for row in rows] == ["1e+12", "1e+12"]
  assert rows[0]["num_iterations"] == configs[runs[0].name].total_steps
  assert rows[0]["params_wte"] is None  # no checkpoint: the groups are blank
  plain = sweep.plan(
    f"{D20}:recipe=nanochat-fork,depth=1,laplacian=1", [], [1], overrides, str(tmp_path)
  )
  configs = sweep.check_runs(plain)
  row = sweep.result_rows(plain, configs, {plain[0].name: {"metrics": {}}})[0]
  assert row["flops_budget"] == "optimal"


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_the_horizon_counts_the_model_s_own_key_and_value_heads(kv_heads):
  """The fork's horizon parameters (num_scaling_params' transformer matrices
  + lm_head) are those the GPT builds, with grouped-query attention too, and
  fewer parameters give a shorter horizon."""
  arg = "recipe=nanochat-fork,depth=4,laplacian=0" + (f",kv_heads={kv_heads}" if kv_heads else "")
  c = load("gpt_d20", arg)
  task = tasks.TASKS["lm"].from_shapes(c)
  params = jax.eval_shape(task.init, jax.random.PRNGKey(0))
  counted = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if name.startswith(("block", "lm_head")):
      counted += leaf.size
  assert defaults.nanochat_fork_scaling_params(4, c.data.vocab_size, kv_heads) == counted
  full = defaults.nanochat_fork_horizon(4)["steps"]
  assert (c.total_steps < full) if kv_heads else (c.total_steps == full)
