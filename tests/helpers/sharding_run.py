"""Multi-device sharding checks, run by tests/train/test_sharding.py in a subprocess.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python tests/helpers/sharding_run.py vit|gpt OUT.json CORPUS_DIR DATA_DIR

JAX must start with 8 (fake CPU) devices, which the pytest process cannot do
after its own JAX started with one. One process per model (test_sharding runs
the two at once), one compiled step per mesh, all through the trainer's own
functions (``state_lib.abstract_and_shardings``, ``create_state``, ``jit_train_step``,
``sharding.global_batch``); the results go to ``OUT.json``:

* ``equivalence``: per model (a tiny ViT on synthetic images, a tiny GPT on
  the byte-level corpus in ``CORPUS_DIR``; 2 of 4 heads Laplacian, spectral
  conditioning) and mesh, the losses of 3 train steps and the largest
  parameter difference to the single-device run, plus the PartitionSpecs of
  a few parameters and optimizer moments; and ``training``: how far each
  parameter of the single-device run moved, and the loss of its first batch
  before and after the 3 steps. The GPT's losses on (2,2,2) are
  also the reference of the two-process test.
* ``checkpoint`` (``gpt`` only): the GPT saved after 3 steps on mesh (2,4,1), restored onto
  (8,1,1) and onto one device, then 3 more steps; the losses of the
  uninterrupted run and of each resumed run.
"""

import importlib.util
import json
import os
import sys
import tempfile

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from laplax import (
  optim,
  sharding,
  tasks,
)
from laplax import state as state_lib
from laplax.train import loop
from laplax.workdir import checkpoint

MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2))
BATCH, STEPS = 16, 3
# The tiny runs, as overrides of the config files (test_sharding passes the
# GPT's to train.py too). 2 of 4 heads are Laplacian. Spectral lambda 1:
# lambda = 10 would saturate this tiny model's softmax (one-hot attention)
# and leave the query and key kernels gradients of rounding size. A small
# constant learning rate: Adam divides each gradient by its own size, so
# gradients near 0 (summed in another order on another mesh) would move
# parameters by different amounts of order lr; at 1e-4 every parameter still
# moves by about 1e-4 in 3 steps, ten times the tolerance.
COMMON = {
  "model.width": 32,
  "model.depth": 2,
  "model.num_heads": 4,
  "model.mlp_dim": 64,
  "model.num_laplacian_heads": 2,
  "model.spectral.enabled": True,
  "model.spectral.lam": 1.0,
  "batch_size": BATCH,
  "total_steps": 10,
  "optim.lr": 1e-4,
  "optim.warmup_steps": 0,
  "optim.min_lr_ratio": 1.0,
}
GPT = dict(COMMON, **{"model.max_length": 32, "eval_batch_size": 16})
VIT = dict(COMMON, **{"model.patch_size": 4})


def load_config(name, overrides):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = c
    for part in parents:
      node = node[part]
    node[leaf] = value
  return c


def make_task(kind, corpus, data_dir):
  """A tiny ViT or GPT task and ``2 * STEPS`` global batches.

  The ViT reads synthetic 8 x 8 images; the GPT reads the byte-level
  corpus in ``corpus`` through the trainer's input pipeline (one process).
  """
  if kind == "vit":
    rng = np.random.default_rng(0)
    task = tasks.ClassificationTask(load_config("vit_fashion_mnist", VIT), 10, (8, 8, 1))
    # A zero head would leave the blocks without gradient at the first step.
    task.model = task.model.clone(head_init_zero=False)
    batches = [
      {
        "image": rng.normal(size=(BATCH, 8, 8, 1)).astype(np.float32),
        "label": rng.integers(0, 10, BATCH).astype(np.int32),
      }
      for _ in range(2 * STEPS)
    ]
  else:
    c = load_config("gpt_shakespeare", GPT)
    c.data.source_dir, c.data.data_dir = str(corpus), str(data_dir)
    task = tasks.LanguageModelTask.from_data(c, None)
    stream = iter(task.train_dataset(0, 1))
    batches = [next(stream) for _ in range(2 * STEPS)]
  return task, batches


def mesh_of(shape):
  """The mesh ``shape`` over the first ``prod(shape)`` devices."""
  return sharding.make_mesh(shape, jax.devices()[: int(np.prod(shape))])


class Run:
  """A task's sharded state and jitted step on one mesh.

  ``state``: the initial state, put onto this mesh's shardings; default: a
  state created sharded by ``state_lib.create_state``.
  """

  def __init__(self, task, shape, state=None):
    self.task, self.mesh = task, mesh_of(shape)
    self.rules = sharding.rules_from_config(task.config)
    self.tx = optim.make_optimizer(task.config)
    schedule = optim.learning_rate_schedule(task.config.optim, task.config.total_steps)
    with sharding.context(self.mesh, self.rules):
      self.state_sharding = state_lib.abstract_and_shardings(
        task, self.tx, 0, self.mesh, self.rules
      )[1]
      self.batch_sharding = loop.batch_shardings(task, self.mesh, self.rules)
      self.step = loop.jit_train_step(
        task, self.tx, schedule, self.state_sharding, self.batch_sharding
      )
      self.state = (
        state_lib.create_state(task, self.tx, 0, self.state_sharding)
        if state is None
        else jax.device_put(state, self.state_sharding)
      )

  def train(self, batches):
    losses = []
    with sharding.context(self.mesh, self.rules):
      for b in batches:
        batch = sharding.global_batch(b, self.batch_sharding, self.task.batch_spec(BATCH))
        self.state, metrics = self.step(self.state, batch)
        losses.append(float(metrics["loss"]))
    return losses

  def abstract(self):
    return state_lib.sharded_abstract_state(self.task, self.tx, 0, self.state_sharding)


def flat(tree):
  return {
    jax.tree_util.keystr(p): np.asarray(jax.device_get(x))
    for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def spec_of(x):
  return [list(e) if isinstance(e, tuple) else e for e in x.sharding.spec]


def comparable(name, x):
  """``x`` without the entries whose gradient is 0 in exact arithmetic.

  The softmax ignores key biases, and a Laplacian head ignores its value
  bias (``(V + b) - P (V + b) = V - P V``): their gradients are rounding
  noise, which Adam scales to steps of about ``lr`` in any direction. Here
  the last 2 of 4 heads are Laplacian: the second half of a value bias.
  """
  if name.endswith("['key']['bias']"):
    return x[:0]
  if name.endswith("['value']['bias']"):
    return x[: x.shape[0] // 2]
  return x


def max_diff(a, b):
  return max(float(np.abs(comparable(k, a[k]) - comparable(k, b[k])).max(initial=0.0)) for k in b)


def copy(state):
  """A host copy of ``state`` (the steps donate their input)."""
  return jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), state)


def training(task, before, after, params_before, params_after, batch):
  """What the single-device steps changed: per parameter the smallest and the
  largest ``|after - before|`` over its entries (those of :func:`comparable`),
  and the loss of the first batch at the initial and at the final parameters
  (the same batch and dropout key for both)."""
  moved = {}
  for k in before:
    delta = np.abs(comparable(k, after[k]) - comparable(k, before[k]))
    if delta.size:
      moved[k] = [float(delta.min()), float(delta.max())]
  loss = jax.jit(lambda p: task.loss(p, batch, jax.random.PRNGKey(0))[0])
  params_after = jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), params_after)
  return {
    "moved": moved,
    "same_batch_loss": [float(loss(params_before)), float(loss(params_after))],
  }


def equivalence(kind, corpus, data_dir):
  """Losses and parameters of 3 steps on each mesh against one device.

  The parameters are created sharded by ``state_lib.create_state`` on the single
  device and on (2,2,2); the other meshes start from the same initial values
  put onto their shardings. Returns ``(result, runs, batches)``.
  """
  task, batches = make_task(kind, corpus, data_dir)
  runs = {"single": Run(task, (1, 1, 1))}
  ref = runs["single"]
  initial = copy(ref.state)
  out = {"single": ref.train(batches[:STEPS])}
  ref_params = flat(ref.state.params)
  out["training"] = training(
    task, flat(initial.params), ref_params, initial.params, ref.state.params, batches[0]
  )
  for shape in MESHES:
    run = runs[shape] = Run(task, shape, None if shape == (2, 2, 2) else initial)
    losses = run.train(batches[:STEPS])
    p = run.state.params["block0"]
    mu = run.state.opt_state[1][0].mu["block0"]
    out[str(shape)] = {
      "losses": losses,
      "max_param_diff": max_diff(flat(run.state.params), ref_params),
      "specs": {
        "query": spec_of(p["attention"]["query"]["kernel"]),
        "out": spec_of(p["attention"]["out"]["kernel"]),
        "fc1": spec_of(p["mlp"]["fc1"]["kernel"]),
        "fc1_mu": spec_of(mu["mlp"]["fc1"]["kernel"]),
        "step": spec_of(run.state.step),
      },
      "num_devices": len(p["mlp"]["fc1"]["kernel"].sharding.device_set),
    }
  return out, runs, batches


def resume(runs, batches, first_losses, checkpoint_dir):
  """The (2,4,1) run after its 3 steps: saved, then 3 more steps (the
  uninterrupted run); the checkpoint restored onto the (8,1,1) and the
  single-device runs (reusing their compiled steps), then 3 more steps."""
  source = runs[(2, 4, 1)]
  ckpt = checkpoint.Checkpointer(checkpoint_dir)
  ckpt.save(source.state, {"next": STEPS})
  ckpt.wait()
  out = {"uninterrupted": first_losses + source.train(batches[STEPS:])}
  for name, key in (("(8, 1, 1)", (8, 1, 1)), ("single", "single")):
    target = runs[key]
    state, data = ckpt.restore(target.abstract())
    query = state.params["block0"]["attention"]["query"]["kernel"]
    want = target.state_sharding.params["block0"]["attention"]["query"]["kernel"]
    out[name] = {
      "step": int(state.step),
      "data": data,
      "sharding_matches": query.sharding == want,
      "num_devices": len(query.sharding.device_set),
    }
    target.state = state
    out[name]["losses"] = target.train(batches[STEPS:])
  ckpt.close()
  return out


def main(argv):
  """``KIND OUT.json CORPUS_DIR DATA_DIR``; KIND ``vit`` or ``gpt`` (which also
  runs the checkpoint check)."""
  assert jax.device_count() == 8, jax.devices()
  kind, out, corpus, data_dir = argv[1:5]
  result = {}
  result["equivalence"], runs, batches = equivalence(kind, corpus, data_dir)
  if kind == "gpt":
    with tempfile.TemporaryDirectory() as d:
      result["checkpoint"] = resume(runs, batches, result["equivalence"]["(2, 4, 1)"]["losses"], d)
  with open(out, "w") as f:
    json.dump(result, f, indent=1)


if __name__ == "__main__":
  main(sys.argv)
