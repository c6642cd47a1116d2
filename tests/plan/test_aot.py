"""The library's ahead-of-time lowering (``bench/compile_report.py`` and
``python -m laplax.plan --compile`` use it) on the tasks the report used to
refuse or crash on: DINO and the LRA's sequence classifiers."""

import pytest

from helpers.runs import ROOT


def _config(spec, **model):
  from laplax.cli import common as cli
  from laplax.evaluators import registry
  from laplax.tasks import schema

  config = registry.complete(schema.complete(cli._load_config_file(f"{ROOT}/{spec}")))
  for key, value in model.items():
    config.model[key] = value
  return config


@pytest.mark.slow
def test_dino_compiles_and_its_flops_are_the_multicrop_count():
  """A one-block DINO on Fashion-MNIST, batch 8, on the one CPU device: XLA's
  count of the compiled step is the analytic one (student on 2 global and the
  local crops, teacher forward on the global ones) within 5%; the rest is
  the elementwise work (softmax, norms, the optimiser) the formula leaves out."""
  import jax

  from laplax.plan import aot, flops

  config = _config("configs/dino_fashion_mnist.py", depth=1)
  config.batch_size = 8
  lowered, info = aot.lower_train_step(config, jax.devices()[:1])
  compiled = lowered.compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  _, analytic = flops.analytic_flops(config, info["task"], info["state"].params, False)
  assert cost["flops"] == pytest.approx(analytic, rel=0.05)
  assert aot.peak_bytes(compiled.memory_analysis()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("task", ["retrieval", "image"])
def test_an_lra_config_lowers(task):
  import jax

  from laplax.plan import aot

  config = _config(f"configs/nystrom_lra.py:task={task},size=cpu")
  lowered, info = aot.lower_train_step(config, jax.devices()[:1])
  assert "stablehlo" in lowered.as_text()[:5000] or "func.func" in lowered.as_text()[:5000]
  assert info["kernel"] == "nystrom"
