"""bench/peer_torch.py, the PyTorch peer of ``bench/step_time.py --peer``: the
same function as laplax's GPT and ViT (issue 19's like-for-like evidence).

Given laplax's parameters, the peer computes the same training loss and the
same gradients (to float32 rounding) on tiny shapes with Laplacian heads on;
the default configs have the same parameter counts in both; and laplax's
training stack imports without PyTorch.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax

from bench import common, peer_torch, step_time

from helpers.runs import ROOT

GPT_CONFIG = os.path.join(ROOT, "configs", "gpt_shakespeare.py")
VIT_CONFIG = os.path.join(ROOT, "configs", "vit_fashion_mnist.py")
IMAGE = (8, 8, 1)


def _tiny(path, **model):
  config = common.load_config(path)
  config.model.update(width=32, depth=2, num_heads=4, mlp_dim=64, **model)
  config.batch_size = 3
  return config


def _random_params(params, seed=0):
  """laplax's parameter tree with every leaf random (the zero-initialised ViT
  head would make every loss log(10))."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
    lambda x: (0.3 * rng.standard_normal(x.shape)).astype(np.float32), params
  )


def _batch(config, seed=1):
  rng = np.random.default_rng(seed)
  b = config.batch_size
  if config.task == "lm":
    return {"tokens": rng.integers(0, 256, (b, config.model.max_length + 1)).astype(np.int32)}
  return {
    "image": rng.standard_normal((b,) + IMAGE).astype(np.float32),
    "label": rng.integers(0, 10, b).astype(np.int32),
  }


def _laplax_and_peer(config):
  """(laplax loss, laplax grads flat, peer loss, peer, batch) at random weights."""
  task = common.make_task(config, IMAGE, 10)
  params = _random_params(jax.eval_shape(task.init, jax.random.PRNGKey(0)))
  batch = _batch(config)
  loss_fn = lambda p: task.loss(p, batch, jax.random.PRNGKey(2))[0]
  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
  peer = peer_torch.from_config(config, image_shape=IMAGE)
  peer_torch.load_laplax_params(peer, params)
  peer_loss = peer(*peer_torch.torch_batch(batch))
  return float(loss), peer_torch.flat_params(grads), peer_loss, peer, batch


@pytest.mark.parametrize(
  "path,model",
  [
    (GPT_CONFIG, dict(max_length=16, num_laplacian_heads=2, posemb="rope")),
    (GPT_CONFIG, dict(max_length=16, num_laplacian_heads=3, posemb="learn")),
    (VIT_CONFIG, dict(patch_size=4, num_laplacian_heads=4, pool="gap")),
    (VIT_CONFIG, dict(patch_size=4, num_laplacian_heads=1, pool="tok")),
  ],
  ids=["gpt-rope-2L", "gpt-learn-3L", "vit-gap-4L", "vit-tok-1L"],
)
@pytest.mark.slow
def test_peer_computes_laplax_loss_and_gradients(path, model):
  config = _tiny(path, **model)
  loss, grads, peer_loss, peer, batch = _laplax_and_peer(config)
  assert np.isfinite(loss) and loss > 0.1
  peer_value = float(peer_loss.detach())
  assert abs(peer_value - loss) <= 1e-5 * max(1.0, abs(loss)), (peer_value, loss)
  peer_loss.backward()
  mapping = peer_torch.param_map(peer)
  assert len(mapping) == len(list(peer.parameters()))
  for name, p in peer.named_parameters():
    paths, convert = mapping[name]
    expected = convert([grads[q] for q in paths])  # the converters are linear
    scale = max(float(np.abs(expected).max()), 1e-3)
    np.testing.assert_allclose(p.grad.numpy(), expected, rtol=0, atol=2e-5 * scale, err_msg=name)
  # The Laplacian heads matter here: with them off the peer's loss differs.
  for block in peer.blocks:
    block.attn.num_laplacian = 0
  with torch.no_grad():
    plain = float(peer(*peer_torch.torch_batch(batch)))
  assert abs(plain - loss) > 1e-3, (plain, loss)


@pytest.mark.parametrize("path", [GPT_CONFIG, VIT_CONFIG])
def test_default_configs_have_the_same_parameter_count(path):
  config = common.load_config(path)
  task = common.make_task(config, (28, 28, 1), 10)
  params = jax.eval_shape(task.init, jax.random.PRNGKey(0))
  laplax_n = sum(x.size for x in jax.tree_util.tree_leaves(params))
  peer = peer_torch.from_config(config)
  assert peer_torch.num_params(peer) == laplax_n
  # Every laplax parameter is mapped once, with its shape.
  used = [q for paths, _ in peer_torch.param_map(peer).values() for q in paths]
  assert sorted(used) == sorted(
    peer_torch.flat_params(jax.tree_util.tree_map(lambda s: np.zeros(0), params))
  )


def test_optimizer_decays_what_laplax_decays():
  config = _tiny(GPT_CONFIG, max_length=16)
  peer = peer_torch.from_config(config)
  opt = peer_torch.make_optimizer(peer, config)
  decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
  names = {n for n, p in peer.named_parameters() if id(p) in decayed}
  # Kernels decay; the tied token table (excluded in the config), norms and biases do not.
  assert "blocks.0.attn.c_q.weight" in names and "blocks.1.fc2.weight" in names
  assert not {"wte.weight", "ln_f.weight", "blocks.0.attn.c_q.bias"} & names
  assert opt.param_groups[0]["weight_decay"] == config.optim.weight_decay
  assert opt.param_groups[0]["betas"] == (config.optim.b1, config.optim.b2)


def test_peer_accumulation_gives_the_whole_batch_loss_and_gradients():
  """``train_step`` with micro-batches (laplax's ``optim.grad_accum_steps``):
  the same loss and gradients as the whole batch (a mean over equal parts)."""
  config = _tiny(VIT_CONFIG, patch_size=4, num_laplacian_heads=4, pool="gap")
  _, _, _, peer, batch = _laplax_and_peer(config)
  args = peer_torch.torch_batch(batch)
  results = []
  for n in (1, 3):  # the tiny batch has 3 examples
    opt = torch.optim.SGD(peer.parameters(), lr=0.0)  # gradients only
    loss = peer_torch.train_step(peer, peer, opt, None, args, grad_accum_steps=n)
    results.append((float(loss), {k: p.grad.clone() for k, p in peer.named_parameters()}))
  (loss1, grads1), (loss3, grads3) = results
  assert loss3 == pytest.approx(loss1, rel=1e-6)
  for name, g in grads1.items():
    np.testing.assert_allclose(
      grads3[name].numpy(),
      g.numpy(),
      rtol=1e-5,
      atol=1e-6 * max(float(g.abs().max()), 1e-3),
      err_msg=name,
    )
  with pytest.raises(ValueError, match="cannot be cut into 2"):
    peer_torch.train_step(peer, peer, opt, None, args, grad_accum_steps=2)


def test_unsupported_setting_is_refused():
  config = common.load_config(VIT_CONFIG)
  config.model.qk_norm = True
  with pytest.raises(ValueError, match="model.qk_norm"):
    peer_torch.from_config(config)


@pytest.mark.slow
@pytest.mark.subprocess
def test_laplax_training_stack_imports_without_torch():
  code = (
    "import sys; import laplax, laplax.train.loop, laplax.cli.train, "
    "laplax.cli.eval, laplax.models.gpt, laplax.models.vit, laplax.models.dino; "
    "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.slow
def test_step_time_peer_runs_and_writes_json(tmp_path, monkeypatch, capsys):
  """``bench/step_time.py --peer`` end to end (in this process) on a tiny GPT,
  eager only (no torch.compile in the tests): the JSON's ratios, MFU and
  losses agree with its times; a setting the peer lacks is one line, exit 2."""
  import json

  out = tmp_path / "peer.json"
  tiny = [
    "--set",
    "model.width=32",
    "--set",
    "model.depth=1",
    "--set",
    "model.mlp_dim=64",
    "--set",
    "model.max_length=16",
    "--batch",
    "4",
    "--set",
    "optim.grad_accum_steps=2",
    "--peer-grad-accum",
    "2",
  ]
  argv = [
    "step_time.py",
    "--peer",
    "--config",
    GPT_CONFIG,
    "--peer-modes",
    "eager",
    "--rounds",
    "2",
    "--steps",
    "2",
    "--warmup",
    "2",
    "--peak-size",
    "64",
  ]
  monkeypatch.setattr(sys, "argv", argv + tiny + ["--json", str(out)])
  step_time.main()
  printed = capsys.readouterr().out
  assert "laplax/peer" in printed and "PyTorch eager" in printed
  record = json.loads(out.read_text())
  assert record["machine"]["torch_threads"] == len(os.sched_getaffinity(0))
  (result,) = record["results"]
  assert result["unit"] == "tokens/s" and result["items_per_step"] == 4 * 16
  assert result["grad_accum_steps"] == {"laplax": 2, "laplax_unrolled": False, "peer": 2}
  lx, eager = result["candidates"]["laplax (JAX)"], result["candidates"]["PyTorch eager"]
  assert len(eager["ms_per_step_rounds"]) == 2
  assert eager["laplax_over_peer"] == pytest.approx(eager["ms_per_step"] / lx["ms_per_step"])
  peak = result["matmul_peak_flops"]["jnp.dot_median"]
  assert lx["mfu"] == pytest.approx(lx["gflops_per_s"] * 1e9 / peak)
  # Same weights, schedule and batch for 6 steps: the same loss.
  assert eager["last_loss"] == pytest.approx(lx["last_loss"], abs=1e-4)

  monkeypatch.setattr(sys, "argv", argv + ["--set", "model.qk_norm=True"])
  with pytest.raises(SystemExit) as e:
    step_time.main()
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error:")
  assert "model.qk_norm" in err[0]
  monkeypatch.setattr(sys, "argv", argv + tiny + ["--peer-grad-accum", "3"])
  with pytest.raises(SystemExit) as e:
    step_time.main()
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and "--peer-grad-accum 3" in err[0]
