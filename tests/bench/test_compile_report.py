"""bench/compile_report.py: ahead-of-time compilation on 8 fake CPU devices.

The report compiles the sharded train step from abstract inputs and prints
per-device memory and FLOPs; the compiled FLOPs must agree with the analytic
``6 N D`` + attention count within 10% (issue 5), and bad input must give one
line and exit code 2.
"""

import json
import os
import re
import sys

import jax
import pytest

from helpers.runs import ROOT, run

sys.path.insert(0, ROOT)
from bench import compile_report  # noqa: E402

REPORT = os.path.join(ROOT, "bench", "compile_report.py")
# Width 256 so that matmuls dominate as at paper scale (at width 64 the
# softmax, norms, cross-entropy and Adam add 15% to the 6 N D count).
SMALL_GPT = [
  "--config",
  "configs/gpt_shakespeare.py",
  "--set",
  "model.width=256",
  "--set",
  "model.mlp_dim=1024",
  "--set",
  "model.depth=2",
]


@pytest.mark.slow
@pytest.mark.subprocess
def test_compile_report_flops_match_analytic_count_on_fake_devices():
  # One micro-batch: cost_analysis() counts a while loop's body once (the
  # report says so when the default's 4 micro-batches make a loop).
  proc = run(
    [REPORT, "--cpu-devices", "8", "--mesh", "(2,2,2)"]
    + SMALL_GPT
    + ["--set", "optim.grad_accum_steps=1"]
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = proc.stdout
  assert "cpu x 8" in out and "(2, 2, 2)" in out
  per_device, total, analytic, ratio = (
    float(x)
    for x in re.search(
      r"FLOPs per step: (\S+) per device, (\S+) in all; analytic (\S+); "
      r"ratio compiled/analytic (\S+)",
      out,
    ).groups()
  )
  assert abs(total - 8 * per_device) <= 1e-3 * total
  assert 0.9 <= ratio <= 1.1, out
  # Analytic count by hand: 2 blocks of 4 * 256^2 (attention) + 2 * 256 * 1024
  # (MLP) weights plus the tied 256 x 256 output table, 32 x 64 tokens, and
  # 12 * depth * length * width per token for Q K^T and P V.
  tokens = 32 * 64
  n = 2 * (4 * 256 * 256 + 2 * 256 * 1024) + 256 * 256
  expected = 6 * n * tokens + 12 * 2 * 64 * 256 * tokens
  assert abs(analytic - expected) <= 1e-3 * expected  # printed to 4 digits
  assert re.search(r"per-device memory: arguments \S+ \w+B", out)


@pytest.mark.slow
@pytest.mark.subprocess
def test_compile_report_bad_mesh_is_one_line_exit_2():
  proc = run([REPORT, "--cpu-devices", "8", "--mesh", "(3,1,1)"] + SMALL_GPT)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "mesh_shape" in lines[0], proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_compile_report_takes_the_sft_config():
  # configs/gpt_d20_sft.py at a small width: its batch carries SFT's "targets"
  # and its step accumulates 8 micro-batches of 4 (nanochat's 8 GPUs x 4).
  proc = run(
    [
      REPORT,
      "--cpu-devices",
      "2",
      "--mesh",
      "(2,1,1)",
      "--config",
      "configs/gpt_d20_sft.py:laplacian=1",
      "--set",
      "model.width=64",
      "--set",
      "model.mlp_dim=256",
      "--set",
      "model.depth=1",
      "--set",
      "model.num_heads=2",
      "--set",
      "model.max_length=64",
      "--set",
      "data.vocab_size=512",
    ]
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "batch 32" in proc.stdout and "grad_accum_steps 8" in proc.stdout
  assert re.search(r"per-device memory: arguments \S+ \w+B", proc.stdout)


@pytest.mark.slow
@pytest.mark.subprocess
def test_compile_report_json_reports_every_field_on_fake_devices():
  # --json: one JSON object per config (bench/aot_tables.py builds the docs'
  # table from them); the peak is arguments + outputs - donated + temporaries.
  proc = run(
    [REPORT, "--cpu-devices", "2", "--mesh", "(1,2,1)", "--json"]
    + SMALL_GPT
    + ["--set", "optim.grad_accum_steps=1", "--set", "model.loss_chunk=16"]
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 1, proc.stdout
  record = json.loads(lines[0])
  assert tuple(record) == compile_report.JSON_KEYS
  assert record["config"] == "configs/gpt_shakespeare.py" and record["fits"] is True
  assert record["platform"] == "cpu" and record["num_devices"] == 2 and record["mesh"] == [1, 2, 1]
  assert record["loss_chunk"] == 16 and record["topology"] is None and record["error"] is None
  assert record["overrides"][-1] == "model.loss_chunk=16"
  expected = (
    record["argument_bytes"] + record["output_bytes"] - record["alias_bytes"] + record["temp_bytes"]
  )
  assert record["peak_bytes"] == expected > 0
  assert record["flops_total"] == 2 * record["flops_per_device"] > 0
  assert 0.9 <= record["flops_total"] / record["analytic_flops"] <= 1.1
  assert record["jax_version"] == jax.__version__ and record["compile_s"] >= 0


def _analytic(config_arg, remat=False):
  from bench.common import analytic_flops, load_config

  config = load_config(config_arg)
  config.batch_size = 1
  task = compile_report.make_task(config)
  params = jax.eval_shape(lambda: task.init(jax.random.key(0)))
  return analytic_flops(config, task, params, remat)


@pytest.mark.parametrize(
  "config_arg, published_gmacs",
  [
    # The papers' forward cost at 224 px (multiply-adds, which they call FLOPs):
    # Swin-T 4.5G (Liu et al. 2021, Table 1), DaViT-Tiny 4.5G (Ding et al.
    # 2022, Table 1), XCiT-S12/16 4.8G (El-Nouby et al. 2021, Table 1).
    ("configs/swin_imagenet.py:size=T", 4.5),
    ("configs/davit_imagenet.py:size=T", 4.5),
    ("configs/xcit_imagenet.py:size=small12", 4.8),
  ],
)
def test_analytic_flops_of_the_vision_families_match_their_papers(config_arg, published_gmacs):
  _, train_flops = _analytic(config_arg)
  gmacs = train_flops / 6 / 1e9  # 3 forwards (forward + backward) of 2 FLOPs a multiply-add
  assert abs(gmacs - published_gmacs) <= 0.03 * published_gmacs, gmacs  # 0.1G rounding: 1%


def test_analytic_flops_of_a_masked_lm_count_the_head_on_the_predicted_tokens_only():
  count, flops = _analytic("configs/bert_cramming.py")
  from bench.common import load_config

  config = load_config("configs/bert_cramming.py")
  m = config.model
  length, width, depth = m.max_length, m.width, m.depth
  predicted = round(config.mlm.probability * length)  # cramming's rule: 32 of 128
  vocab = config.data.vocab_size
  blocks = count - vocab * width  # every kernel but the tied table
  expected = 6 * blocks * length + 6 * vocab * width * predicted
  expected += 12 * depth * length * length * width
  assert predicted < length and abs(flops - expected) <= 1e-9 * expected


def test_analytic_flops_of_xcit_count_the_attention_over_channels():
  # Halving the heads doubles d: only the XCA term 12 d width N per token changes.
  from bench.common import analytic_flops, load_config

  def count(heads):
    config = load_config("configs/xcit_imagenet.py:size=small12")
    config.batch_size, config.model.num_heads = 1, heads
    task = compile_report.make_task(config)
    params = jax.eval_shape(lambda: task.init(jax.random.key(0)))
    return analytic_flops(config, task, params, False)[1]

  width, blocks, tokens = 384, 12, (224 // 16) ** 2
  expected = 12 * blocks * (width // 4 - width // 8) * width * tokens
  assert abs(count(4) - count(8) - expected) <= 1e-9 * expected


def test_analytic_flops_of_davit_count_both_attentions():
  # size=tiny at 28 px: stride-4 stem, stages of one dual block (a spatial
  # then a channel block) on grids 7 and 4 of width 32 * 2^s, heads 2 * 2^s.
  # Doubling the heads halves the channel groups' d = width / heads: only the
  # channel blocks' 12 d width per position changes. Doubling the window to 14
  # changes only the spatial blocks' 12 ws^2 width per position of the grid
  # padded to whole windows (7 -> 14 for both grids). DaViT has no parameter
  # that depends on either.
  from bench.common import analytic_flops, load_config

  def count(heads=2, window=7):
    config = load_config("configs/davit_imagenet.py:size=tiny")
    config.batch_size, config.model.num_heads, config.model.window_size = 1, heads, window
    task = compile_report.make_task(config)
    params = jax.eval_shape(lambda: task.init(jax.random.key(0)))
    return analytic_flops(config, task, params, False)[1]

  base = count()
  stages = [(32, 7), (64, 4)]  # (width, grid); d = 16 with 2 * 2^s heads, 8 with 4 * 2^s
  channel = sum(12 * (16 - 8) * w * g * g for w, g in stages)
  assert abs(base - count(heads=4) - channel) <= 1e-9 * channel
  spatial = sum(12 * (14 * 14 * 14**2 - 7 * 7 * 7**2) * w for w, _ in stages)
  assert abs(count(window=14) - base - spatial) <= 1e-9 * spatial
