"""Sharding over a (data, fsdp, tensor) mesh, multi-process runs, mesh validation.

The multi-device checks need JAX started with 8 fake CPU devices, so they run
in subprocesses: ``tests/helpers/sharding_run.py`` once for the module (sharded
steps against one device, checkpoints across meshes), then two ``train.py``
processes of 4 devices joined by ``jax.distributed`` over loopback with gloo
collectives. (A SIGTERM to one of two processes stopping both at one step,
with one checkpoint of that step: ``tests/train/test_stop.py``, one device
per process; the sharded checkpoint that two processes of 4 devices write
together: :func:`test_two_processes_match_one`.)
"""

import json
import os
import socket
import subprocess
import sys
import typing

import jax
import numpy as np
import pytest

from laplax import sharding, tasks
from laplax.config import validation as config_lib

from helpers import sharding_run as sharding_helper
from helpers.models import make_gpt
from helpers.runs import ROOT, read_metrics, run_in_process, xla_env

HELPER = os.path.join(ROOT, "tests", "helpers", "sharding_run.py")
GPT_CONFIG = os.path.join(ROOT, "configs", "gpt_shakespeare.py")
VIT_CONFIG = os.path.join(ROOT, "configs", "vit_fashion_mnist.py")
TOL = 1e-5
MESHES = ("(8, 1, 1)", "(2, 4, 1)", "(2, 2, 2)")
# The helper's tiny GPT, trained 3 steps on mesh (2,2,2) by train.py.
TINY_GPT = [f"--config.{k}={v}" for k, v in sharding_helper.GPT.items()] + [
  "--config.total_steps=3",
  "--config.log_every=1",
  "--config.eval_every=3",
  "--config.checkpoint_every=3",
  "--config.mesh_shape=(2,2,2)",
]


def device_env(n):
  """Environment of a subprocess whose JAX sees ``n`` CPU devices.

  Most XLA optimisations are off: the programs are tiny and compiling them
  dominates; every run compared here uses the same setting.
  """
  return xla_env(n, PYTHONUNBUFFERED="1", JAX_DISABLE_MOST_OPTIMIZATIONS="1")


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
  """Runs sharding_helper.py for the ViT and the GPT (at once, 8 devices each).

  Returns ``({"equivalence": {kind: ...}, "checkpoint": ...}, paths)``.
  """
  root = tmp_path_factory.mktemp("sharding")
  corpus, data_dir = root / "corpus", root / "tfds"
  corpus.mkdir()
  for name in ("a", "b", "c"):
    (corpus / f"{name}.txt").write_text("the cat sat on the mat. " * 150)
  procs = {
    kind: subprocess.Popen(
      [sys.executable, HELPER, kind, str(root / f"{kind}.json"), str(corpus), str(data_dir)],
      cwd=ROOT,
      env=device_env(8),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for kind in ("vit", "gpt")
  }
  result = {"equivalence": {}}
  for kind, p in procs.items():
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-4000:]
    out = json.loads((root / f"{kind}.json").read_text())
    result["equivalence"][kind] = out["equivalence"]
    result.update({k: v for k, v in out.items() if k != "equivalence"})
  return result, dict(corpus=corpus, data_dir=data_dir)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vit", "gpt"])
def test_sharded_steps_equal_single_device(helper, kind):
  """3 steps, 2 of 4 heads Laplacian, spectral conditioning, on each mesh."""
  result = helper[0]["equivalence"][kind]
  single = np.array(result["single"])
  for mesh in MESHES:
    np.testing.assert_allclose(result[mesh]["losses"], single, rtol=0, atol=TOL, err_msg=mesh)
    assert result[mesh]["max_param_diff"] < TOL, mesh
    assert result[mesh]["num_devices"] == 8
  # The comparison is not of untrained models: every parameter moved (Adam
  # moves each entry by about lr = 1e-4 per step, ten times the tolerance),
  # and the loss of the same batch fell.
  trained = result["training"]
  assert trained["moved"], trained
  for name, (smallest, largest) in trained["moved"].items():
    assert largest > 10 * TOL and smallest > 0, (name, smallest, largest)
  before, after = trained["same_batch_loss"]
  assert before == pytest.approx(single[0], abs=1e-3)  # the first step's own loss
  assert after < before - 100 * TOL, trained["same_batch_loss"]


@pytest.mark.slow
def test_parameters_and_optimizer_state_are_sharded(helper):
  """Heads and MLP over tensor, the other dimension over fsdp; the Adam
  moments follow their parameters; the step counter is replicated."""
  specs = {mesh: helper[0]["equivalence"]["gpt"][mesh]["specs"] for mesh in MESHES}
  assert specs["(2, 2, 2)"] == {
    "query": ["fsdp", "tensor"],
    "out": ["tensor", "fsdp"],
    "fc1": ["fsdp", "tensor"],
    "fc1_mu": ["fsdp", "tensor"],
    "step": [],
  }
  assert specs["(2, 4, 1)"]["query"] == ["fsdp", "tensor"]
  assert specs["(8, 1, 1)"]["fc1_mu"] == [None, "tensor"]  # no fsdp axis to use
  assert helper[0]["equivalence"]["vit"]["(2, 2, 2)"]["specs"] == specs["(2, 2, 2)"]


@pytest.mark.slow
def test_checkpoint_restores_onto_another_mesh(helper):
  """Saved on (2,4,1) after 3 steps; restored onto (8,1,1) and one device,
  3 more steps give the uninterrupted run's losses."""
  result = helper[0]["checkpoint"]
  whole = np.array(result["uninterrupted"])
  for name, devices in (("(8, 1, 1)", 8), ("single", 1)):
    r = result[name]
    assert r["step"] == 3 and r["data"] == {"next": 3}
    assert r["sharding_matches"] and r["num_devices"] == devices
    np.testing.assert_allclose(r["losses"], whole[3:], rtol=0, atol=TOL, err_msg=name)


def free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_processes_match_one(helper, tmp_path):
  """train.py in 2 processes of 4 devices (jax.distributed on loopback, gloo)
  gives the losses of the single 8-device process (the helper's GPT on
  (2,2,2), same config and batches); only process 0 writes."""
  paths = helper[1]
  workdir = tmp_path / "two"
  common = (
    [
      "train.py",
      "--config",
      GPT_CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.source_dir={paths['corpus']}",
      f"--config.data.data_dir={paths['data_dir']}",
    ]
    + TINY_GPT
    + [
      f"--config.distributed.coordinator_address=localhost:{free_port()}",
      "--config.distributed.num_processes=2",
    ]
  )
  procs = [
    subprocess.Popen(
      [sys.executable] + common + [f"--config.distributed.process_id={i}"],
      cwd=ROOT,
      env=device_env(4),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-4000:]
  assert "final eval" in outs[0][0] and "final eval" not in outs[1][0]

  records = read_metrics(workdir)
  train = [r for r in records if r["split"] == "train"]
  evals = [r for r in records if r["split"] == "eval"]
  assert [r["step"] for r in train] == [1, 2, 3]  # one record per step: process 0 only
  np.testing.assert_allclose(
    [r["loss"] for r in train],
    helper[0]["equivalence"]["gpt"]["(2, 2, 2)"]["losses"],
    rtol=0,
    atol=TOL,
  )
  assert [r["step"] for r in evals] == [3] and np.isfinite(evals[0]["loss"])
  assert sorted(os.listdir(workdir / "checkpoints")) == ["0", "3"]


# (devices, overrides, message); one device: this process (JAX here sees one
# CPU device), more: a subprocess with that many fake devices.
BAD_MESHES = {
  "two entries": (1, ["--config.mesh_shape=(2,4)"], "must be 3 integers"),
  "not integers": (1, ["--config.mesh_shape=(2,x,1)"], "must be 3 integers"),
  "more devices than the machine": (
    1,
    ["--config.mesh_shape=(2,4,1)"],
    "has 8 devices but JAX sees 1",
  ),
  "batch not divisible by data x fsdp": (
    8,
    ["--config.mesh_shape=(2,2,2)", "--config.batch_size=30", "--config.optim.grad_accum_steps=1"],
    "not divisible by the data-parallel size 4",
  ),
  "heads not divisible by tensor": (
    8,
    [
      "--config.mesh_shape=(2,1,4)",
      "--config.model.num_heads=2",
      "--config.model.num_laplacian_heads=1",
    ],
    "num_heads=2 is not divisible by the tensor-parallel size 4",
  ),
}


@pytest.mark.slow
@pytest.mark.subprocess
def test_bad_mesh_one_line_exit_2_nothing_written(tmp_path, capfd):
  """Each bad input through train.py: one line, exit code 2, no workdir. The
  one-device cases run train.py in this process (:func:`run_in_process`), the
  8-device ones in subprocesses, started together."""
  argv = lambda workdir, extra: (
    [
      "train.py",
      "--config",
      VIT_CONFIG,
      "--workdir",
      str(workdir),
      "--config.total_steps=1",
    ]
    + extra
  )
  procs = {}
  for name, (devices, extra, _) in BAD_MESHES.items():
    workdir = tmp_path / name.replace(" ", "_")
    if devices > 1:
      procs[name] = subprocess.Popen(
        [sys.executable] + argv(workdir, extra),
        cwd=ROOT,
        env=device_env(devices),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
  results = {}
  for name, (devices, extra, _) in BAD_MESHES.items():
    if devices == 1:
      r = run_in_process(argv(tmp_path / name.replace(" ", "_"), extra), capfd)
      results[name] = (r.returncode, r.stderr)
  for name, p in procs.items():
    _, err = p.communicate(timeout=120)
    results[name] = (p.returncode, err)
  assert sorted(results) == sorted(BAD_MESHES)
  for name, (code, err) in results.items():
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2, (name, err[-2000:])
    assert len(lines) == 1 and "Traceback" not in err, (name, err)
    assert BAD_MESHES[name][2] in lines[0], (name, lines[0])
    assert not (tmp_path / name.replace(" ", "_")).exists(), name


# ------------------------------------------------------------ in-process units


def test_mesh_shape_parsing_and_resolution():
  assert sharding.parse_mesh_shape("(2,4,1)") == (2, 4, 1)
  assert sharding.resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
  assert sharding.resolve_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
  for bad in ((2, 4), (0, 1, 1), (-1, -1, 1), (2.0, 1, 1), (True, 1, 1), "2,4"):
    with pytest.raises(ValueError, match="3 integers"):
      sharding.parse_mesh_shape(bad)
  with pytest.raises(ValueError, match="not divisible by 3"):
    sharding.resolve_mesh_shape((3, -1, 1), 8)


def test_fsdp_takes_the_largest_free_divisible_dimension():
  assert sharding.fsdp_spec([None, "tensor"], (64, 32), 4) == ["fsdp", "tensor"]
  assert sharding.fsdp_spec([None, None], (30, 32), 4) == [None, "fsdp"]
  assert sharding.fsdp_spec([None, None], (32, 32), 4) == ["fsdp", None]
  assert sharding.fsdp_spec([None], (6,), 4) == [None]
  assert sharding.fsdp_spec([None, None], (64, 32), 1) == [None, None]


def test_rules_parsing():
  assert sharding.parse_rules(
    [["batch", ["data", "fsdp"]], ["heads", "tensor"], ["embed", None]]
  ) == (("batch", ("data", "fsdp")), ("heads", "tensor"), ("embed", None))
  for bad in ((("heads", "model"),), (("heads",),), "nonsense"):
    with pytest.raises(ValueError, match="sharding_rules"):
      sharding.parse_rules(bad)


def test_models_init_plain_arrays_outside_the_sharding_context():
  """Logical names box parameters only under the rules; values are the same."""
  import flax.linen as nn

  model = make_gpt(
    vocab_size=16, max_length=8, width=16, depth=1, num_heads=2, num_laplacian_heads=1
  )
  tokens = jax.numpy.zeros((1, 8), jax.numpy.int32)
  plain = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))["params"]
  with nn.logical_axis_rules(sharding.DEFAULT_RULES):
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))["params"]
  assert isinstance(plain["block0"]["attention"]["query"]["kernel"], jax.ShapeDtypeStruct)
  query = boxed["block0"]["attention"]["query"]["kernel"]
  assert isinstance(query, nn.LogicallyPartitioned) and query.names == ("embed", "heads")
  assert boxed["block0"]["mlp"]["fc2"]["kernel"].names == ("mlp", "embed")
  assert boxed["token_embedding"]["embedding"].names == ("vocab", "embed")
  assert jax.tree_util.tree_structure(sharding.unbox(boxed)) == jax.tree_util.tree_structure(plain)


def test_validate_mesh_messages():
  from laplax.config.defaults import gpt_base_config

  c = gpt_base_config()
  c.mesh_shape = (2, 2, 2)
  assert config_lib.validate_mesh(c, 8, num_processes=2) == (2, 2, 2)
  with pytest.raises(config_lib.ConfigError, match="multiple of the 8 processes"):
    config_lib.validate_mesh(c, 8, num_processes=8)
  c.optim.grad_accum_steps = 16
  with pytest.raises(config_lib.ConfigError, match="micro-batch"):
    config_lib.validate_mesh(c, 8)
  c.optim.grad_accum_steps = 1
  c.model.mlp_dim = 6
  c.mesh_shape = (1, 1, 4)
  c.model.num_heads = 4
  with pytest.raises(config_lib.ConfigError, match="mlp_dim=6"):
    config_lib.validate_mesh(c, 4)
  c.model.mlp_dim = None  # 4 * width, resolved by the model spec
  assert config_lib.validate_mesh(c, 4) == (1, 1, 4)


@pytest.mark.parametrize(
  "key,value,fragment",
  [
    ("mesh_shape", (2, 2), "config.mesh_shape"),
    ("sharding_rules", (("heads", "model"),), "config.sharding_rules"),
    ("distributed.coordinator_address", "localhost", "'host:port'"),
    ("distributed.coordinator_address", "localhost:1234", "num_processes=None"),
  ],
)
def test_validate_sharding_keys(key, value, fragment):
  from laplax.config.defaults import gpt_base_config

  c = gpt_base_config()
  tasks.validate(c)
  *parents, leaf = key.split(".")
  node = c
  for part in parents:
    node = node[part]
  node[leaf] = value
  with pytest.raises(config_lib.ConfigError, match=fragment) as e:
    tasks.validate(c)
  assert "\n" not in str(e.value)


class _State(typing.NamedTuple):
  params: dict
  mu: dict
  momentum: dict
  second: dict
  count: jax.ShapeDtypeStruct
  scale: jax.ShapeDtypeStruct


def test_optimizer_buffers_in_another_layout_are_split_not_replicated():
  """A state leaf that mirrors a parameter keeps the parameter's spec; a matrix
  in another layout (the fork's Muon momentum, stored transposed, and its
  factored second moment) is split over fsdp along its largest dimension;
  scalars and vectors are replicated."""
  from jax.sharding import PartitionSpec as P

  mesh = jax.sharding.AbstractMesh((1, 4, 1), ("data", "fsdp", "tensor"))
  leaf = lambda *shape: {"mlp": {"kernel": jax.ShapeDtypeStruct(shape, np.float32)}}
  state = _State(
    params=leaf(8, 32),
    mu=leaf(8, 32),
    momentum=leaf(32, 8),
    second=leaf(32, 1),
    count=jax.ShapeDtypeStruct((), np.int32),
    scale=jax.ShapeDtypeStruct((6,), np.float32),
  )
  got = sharding.state_shardings(state, {"mlp": {"kernel": P(None, "fsdp")}}, mesh)
  assert got.params["mlp"]["kernel"].spec == P(None, "fsdp")
  assert got.mu["mlp"]["kernel"].spec == P(None, "fsdp")
  assert got.momentum["mlp"]["kernel"].spec == P("fsdp", None)
  assert got.second["mlp"]["kernel"].spec == P("fsdp", None)
  assert got.count.spec == P() and got.scale.spec == P()
