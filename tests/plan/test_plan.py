"""``python -m laplax.plan``: the paper configs on the machines they are for,
the roofline against a hand computation, and its one-line errors."""

import ast
import subprocess
import sys

import pytest

from helpers.runs import ROOT

#: Every paper config (docs/scale-out.md, "Plan a run").
PAPER_CONFIGS = [
  "configs/deit3_imagenet.py",
  "configs/deit3_cifar.py",
  "configs/swin_imagenet.py",
  "configs/xcit_imagenet.py",
  "configs/davit_imagenet.py",
  "configs/dino_vits16_imagenet.py",
  "configs/gpt_d20.py",
  "configs/gpt_d20_mid.py",
  "configs/gpt_d20_sft.py",
  "configs/gpt_d20.py:recipe=nanochat-fork",
  "configs/bert_cramming.py:size=paper",
  "configs/bert_glue.py",
] + [
  f"configs/nystrom_lra.py:task={t}"
  for t in ("listops", "text", "retrieval", "image", "pathfinder")
]
#: The keys docs/scale-out.md documents for the configs a target refuses as
#: they are; every other (config, target) runs unchanged.
DOCUMENTED = {
  ("configs/gpt_d20_sft.py", "gpu:8xH100"): ['--config.mesh_shape="(4,1,2)"'],
  ("configs/gpt_d20_sft.py", "v5e:4x4"): [
    "--config.optim.grad_accum_steps=4",
    '--config.mesh_shape="(8,1,2)"',
  ],
  ("configs/gpt_d20_sft.py", "v5e:8x8"): [
    "--config.optim.grad_accum_steps=1",
    '--config.mesh_shape="(32,1,2)"',
  ],
  ("configs/bert_glue.py", "v5e:8x8"): ['--config.mesh_shape="(16,1,4)"'],
  **{
    (f"configs/nystrom_lra.py:task={t}", "v5e:8x8"): ['--config.mesh_shape="(32,1,2)"']
    for t in ("listops", "text", "retrieval")
  },
}


def _config(spec, overrides=()):
  """The config of ``spec`` as train.py reads it, with ``--config.KEY=VALUE`` ``overrides``."""
  from laplax.cli import common as cli
  from laplax.evaluators import registry
  from laplax.tasks import schema

  config = registry.complete(schema.complete(cli._load_config_file(f"{ROOT}/{spec}")))
  for item in overrides:
    key, _, value = item.removeprefix("--config.").partition("=")
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    node[leaf] = ast.literal_eval(value.strip('"'))
  return config


@pytest.mark.slow
@pytest.mark.parametrize("target", ["v5e:4x4", "v5e:8x8", "gpu:8xH100"])
@pytest.mark.parametrize("spec", PAPER_CONFIGS)
def test_every_paper_config_runs_on_the_target_with_the_documented_keys(spec, target):
  from laplax.plan import report, targets

  machine = targets.parse_target(target)
  plan = report.make_plan(_config(spec), machine, spec)
  documented = DOCUMENTED.get((spec, target))
  if documented is None:
    assert plan["refusals"] == []
  else:
    assert plan["refusals"] and plan["suggestion"] == documented
    plan = report.make_plan(_config(spec, documented), machine, spec)
    assert plan["refusals"] == []
  assert plan["flops_per_step"] > 0 and plan["bound"]["step_s"] > 0
  assert plan["memory_estimate"]["total_bytes"] > 0


@pytest.mark.slow
def test_the_roofline_of_gpt_d20_is_the_hand_computation():
  """d20 on a v5e:4x4: 6 x 477,102,080 matmul parameters (20 blocks of 12 x
  1280^2, the untied 65,536 x 1280 lm_head) x 256 x 2048 tokens + 12 x 20
  layers x 2048 x 1280 x tokens, over 16 chips of 197 TFLOP/s; 21,400 steps."""
  from laplax.plan import report, targets

  plan = report.make_plan(_config("configs/gpt_d20.py"), targets.parse_target("v5e:4x4"))
  tokens = 256 * 2048
  flops = 6 * (20 * 12 * 1280**2 + 65536 * 1280) * tokens + 12 * 20 * 2048 * 1280 * tokens
  assert plan["flops_per_step"] == flops == 1_830_686_860_247_040
  bound = plan["bound"]
  assert bound["flops_s"] == pytest.approx(flops / (16 * 197e12), rel=1e-12)
  params = (560_988_160 - 65536 * 1280) * 4 + 65536 * 1280 * 2  # float32, bfloat16 embedding
  assert bound["bytes_per_chip"] > 2 * params  # the weights read forward and backward, at least
  assert bound["step_s"] == max(bound["flops_s"], bound["bytes_s"]) == bound["flops_s"]
  assert bound["run_chip_hours"] == pytest.approx(flops / (16 * 197e12) * 21400 * 16 / 3600)
  assert plan["mesh"]["shape"] == {"data": 16, "fsdp": 1, "tensor": 1}
  assert plan["target"]["hosts"] == 4
  split = plan["data"]
  assert (split["per_host_batch"], split["per_device_batch"], split["streams"]) == (64, 16, 8)


def _plan_cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "laplax.plan", *args], cwd=ROOT, capture_output=True, text=True
  )


def test_every_refusal_is_listed_with_the_keys_that_mend_it():
  """ListOps (batch 32) on 64 chips of 16 hosts with 3 micro-batches: the
  batch does not divide, nor does the micro-batch the devices; the plan
  names both keys, and the mesh it proposes passes the same checks."""
  from laplax.plan import report, targets

  config = _config("configs/nystrom_lra.py:task=listops", ["--config.optim.grad_accum_steps=3"])
  plan = report.make_plan(config, targets.parse_target("v5e:8x8"))
  assert [p.split(" is ")[0] for p in plan["refusals"]] == [
    "config.batch_size=32",
    "the micro-batch batch_size/grad_accum_steps=10",
  ]
  assert plan["suggestion"] == [
    "--config.optim.grad_accum_steps=1",
    '--config.mesh_shape="(32,1,2)"',
  ]


@pytest.mark.slow
def test_a_refused_config_prints_one_line_naming_the_key_and_exits_2():
  r = _plan_cli("--config", "configs/nystrom_lra.py:task=listops", "--target", "v5e:8x8")
  assert r.returncode == 2, r.stderr
  lines = r.stderr.strip().splitlines()
  assert lines == [
    "error: config.batch_size=32 is not divisible by the data-parallel size 64 (batch axes "
    "data*fsdp of mesh_shape=(64,1,1)); choose a batch size that is a multiple of 64"
  ]
  assert "64 x TPU v5e on 16 host(s)" in r.stdout
  assert 'accepted on this machine with: --config.mesh_shape="(32,1,2)"' in r.stdout
  ok = _plan_cli(
    "--config",
    "configs/nystrom_lra.py:task=listops",
    "--target",
    "v5e:8x8",
    "--config.mesh_shape=(32,1,2)",
  )
  assert ok.returncode == 0 and ok.stderr == "", ok.stderr
  assert "mesh: (data 32, fsdp 1, tensor 2)" in ok.stdout


@pytest.mark.parametrize(
  "target,message",
  [
    ("tpu:8", "--target 'tpu:8' names no machine; use one of v5e:4x4"),
    ("v5e:4x4x4", "--target 'v5e:4x4x4': a v5e slice is its chip topology, AxB"),
    ("v5p:0x2x2", "--target 'v5p:0x2x2': a v5p slice is its chip topology, AxBxC"),
    ("gpu:8xA100", "a GPU machine is [HOSTSx]GPUSxMODEL"),
  ],
)
def test_a_bad_target_is_one_line(target, message):
  from laplax.errors import UserError
  from laplax.plan import targets

  with pytest.raises(UserError) as e:
    targets.parse_target(target)
  assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_a_bad_target_exits_2_before_the_config_loads():
  r = _plan_cli("--config", "configs/missing.py", "--target", "v5e:4x4x4")
  assert r.returncode == 2 and r.stdout == ""
  assert r.stderr.strip().splitlines() == [
    "error: --target 'v5e:4x4x4': a v5e slice is its chip topology, AxB, e.g. v5e:4x4"
  ]


def test_targets_count_hosts_as_the_machines_have_them():
  from laplax.plan import targets

  got = {
    s: (t.num_devices, t.num_hosts)
    for s in ("v5e:2x2", "v5e:2x4", "v5e:4x4", "v5e:8x8", "v5p:2x2x2", "gpu:8xH100", "gpu:2x8xH100")
    for t in [targets.parse_target(s)]
  }
  assert got == {
    "v5e:2x2": (4, 1),
    "v5e:2x4": (8, 1),
    "v5e:4x4": (16, 4),
    "v5e:8x8": (64, 16),
    "v5p:2x2x2": (8, 2),
    "gpu:8xH100": (8, 1),
    "gpu:2x8xH100": (16, 2),
  }
