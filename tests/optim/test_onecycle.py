"""``optim.schedule="onecycle"`` (laplax/optim): torch's ``OneCycleLR`` as the
Nystromformer authors' LRA runs use it (``LRA/code/run_tasks.py`` of
mlpen/Nystromformer), AdamW's beta1 cycled with it.

* The rate and beta1 equal those torch's scheduler sets, read at every update
  of whole runs (the authors' ListOps and CPU-size settings, no warm-up, an
  uneven warm-up), to 1e-7.
* Updates of AdamW with the cycled beta1 equal ``torch.optim.AdamW`` stepped
  with ``OneCycleLR`` on the same parameters and gradients.
* Other schedules build ``optax.adamw`` as before: the same state tree and
  bitwise the same updates.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from laplax import optim, tasks
from laplax.config import validation as config_lib
from laplax.config.defaults import base_config


def torch_onecycle(total, warmup, lr, params=None):
  """torch's AdamW and OneCycleLR as run_tasks.py builds them."""
  params = params if params is not None else [torch.zeros(1, requires_grad=True)]
  opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
  sched = torch.optim.lr_scheduler.OneCycleLR(
    optimizer=opt, max_lr=lr, pct_start=warmup / total, anneal_strategy="linear", total_steps=total
  )
  return opt, sched


@pytest.mark.parametrize("total,warmup", [(5000, 1000), (300, 30), (200, 0), (777, 333)])
def test_rate_and_beta1_equal_torch_at_every_step(total, warmup):
  opt, sched = torch_onecycle(total, warmup, 1e-4)
  want_lr, want_b1 = [], []
  for _ in range(total):
    group = opt.param_groups[0]
    want_lr.append(group["lr"])
    want_b1.append(group["betas"][0])
    opt.step()
    sched.step()
  lr, b1 = optim.onecycle_schedules(1e-4, total, warmup)
  steps = jnp.arange(total)
  np.testing.assert_allclose(np.asarray(lr(steps)), want_lr, rtol=0, atol=1e-7 * 1e-4)
  np.testing.assert_allclose(np.asarray(b1(steps)), want_b1, rtol=0, atol=1e-7)
  # torch's first beta1: max_momentum; without warm-up already 1/N up from base_momentum
  assert want_b1[0] == pytest.approx(0.95 if warmup else 0.85 + 0.1 / total)
  assert abs(float(lr(total - 1)) - 1e-4 / 25 / 1e4) < 1e-11
  c = base_config()
  c.optim.update(lr=1e-4, warmup_steps=warmup, schedule="onecycle")
  rate = optim.learning_rate_schedule(c.optim, total)
  assert np.array_equal(np.asarray(rate(steps)), np.asarray(lr(steps)))


def test_adamw_updates_equal_torch_adamw_with_onecycle():
  rng = np.random.default_rng(0)
  w0, b0 = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)
  grads = [(rng.normal(size=(3, 4)), rng.normal(size=4)) for _ in range(10)]
  total, warmup, lr, decay = 10, 4, 0.05, 0.1
  tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
  # laplax decays the matrices only (decay_mask): the bias in a group without.
  groups = [{"params": [tw], "weight_decay": decay}, {"params": [tb], "weight_decay": 0.0}]
  opt, sched = torch_onecycle(total, warmup, lr, groups)
  c = base_config()
  c.total_steps = total
  c.optim.update(lr=lr, warmup_steps=warmup, schedule="onecycle", weight_decay=decay, grad_clip=0.0)
  with c.optim.unlocked():
    c.optim.eps = 1e-6
  tx = optim.make_optimizer(c)
  params = {"w": jnp.asarray(w0), "b": jnp.asarray(b0)}
  state = tx.init(params)
  for gw, gb in grads:
    tw.grad, tb.grad = torch.tensor(gw, dtype=torch.float32), torch.tensor(gb, dtype=torch.float32)
    opt.step()
    sched.step()
    g = {"w": jnp.asarray(gw, jnp.float32), "b": jnp.asarray(gb, jnp.float32)}
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(np.asarray(params["w"]), tw.detach().numpy(), atol=1e-6)
  np.testing.assert_allclose(np.asarray(params["b"]), tb.detach().numpy(), atol=1e-6)
  assert opt.param_groups[0]["betas"][0] != 0.9  # torch cycled it too
  assert not np.allclose(np.asarray(params["w"]), w0, atol=1e-2)  # it moved


@pytest.mark.parametrize("schedule", ["cosine", "warmdown"])
def test_other_schedules_build_the_same_adamw_bitwise(schedule):
  c = base_config()
  c.optim.update(schedule=schedule, grad_clip=0.0)
  tx = optim.make_optimizer(c)
  same = optax.adamw(  # make_optimizer's AdamW before the onecycle schedule
    optim.learning_rate_schedule(c.optim, c.total_steps),
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    weight_decay=0.05,
    mask=lambda p: optim.decay_mask(p, ("pos_embedding", "cls")),
  )
  params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
  grads = jax.tree.map(lambda x: x * 0.3 + 0.1, params)
  state, ref = tx.init(params), same.init(params)
  assert jax.tree.structure(state) == jax.tree.structure(ref)
  for _ in range(3):
    (u, state), (v, ref) = tx.update(grads, state, params), same.update(grads, ref, params)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), u, v))
    params = optax.apply_updates(params, u)


@pytest.mark.parametrize(
  "key,value,fragment",
  [("optim.warmup_steps", 1, "must not be 1"), ("optim.optimizer", "muon", "'adamw'")],
)
def test_onecycle_refuses_what_torch_cannot_do(key, value, fragment):
  c = base_config()
  c.optim.schedule = "onecycle"
  tasks.validate(c)
  section, leaf = key.split(".")
  c[section][leaf] = value
  with pytest.raises(config_lib.ConfigError, match=fragment) as e:
    tasks.validate(c)
  assert "\n" not in str(e.value)


def test_a_warmup_longer_than_the_run_is_cut_to_it():
  """pct_start 1: torch's schedule with warm-up N, the rate rising to the
  peak at the last step (beta1 down to 0.85)."""
  lr, b1 = optim.onecycle_schedules(1e-3, 4, 30)
  same_lr, same_b1 = optim.onecycle_schedules(1e-3, 4, 4)
  steps = jnp.arange(4)
  assert np.array_equal(np.asarray(lr(steps)), np.asarray(same_lr(steps)))
  np.testing.assert_allclose(np.asarray(lr(steps)), 1e-3 / 25 + (1e-3 - 1e-3 / 25) * steps / 3)
  np.testing.assert_allclose(float(b1(3)), 0.85, rtol=1e-7)
  with pytest.raises(ValueError, match="at least 2"):
    optim.onecycle_schedules(1e-3, 4, 1)
