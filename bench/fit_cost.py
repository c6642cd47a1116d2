"""What the memory check of ``train.py`` costs, and how near its bound comes.

    python bench/fit_cost.py [--config configs/vit_fashion_mnist.py ...]

For each config (default: the three CPU default configs, as ``train.py``
runs them, on this machine's devices), builds the task from its prepared
data (``--data_dir``, default ``~/tensorflow_datasets``), then times, as
``laplax.train.fit.check_memory`` and the loop do them:

- the lower bound without compiling (``fit.lower_bound``),
- the compilation of the train step for its abstract inputs and its
  ``memory_analysis()`` (a compilation the loop would do anyway at step 1),
- the first and second call of the jitted step on real arrays: when the
  first costs what the second does, the loop reused the checked executable.

It prints the bound, the compiled peak and what the device has
(``fit.available_bytes``). Nothing is written.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_CONFIGS = (
  "configs/vit_fashion_mnist.py",
  "configs/gpt_shakespeare.py",
  "configs/dino_fashion_mnist.py",
)


def measure(spec: str, data_dir: str) -> None:
  """Prints the timings and figures of one config."""
  import jax

  from laplax import (
    optim,
    sharding,
    tasks,
  )
  from laplax import state as state_lib
  from laplax.cli import common as cli
  from laplax.train import budget, fit, loop

  config = cli._load_config_file(spec)
  config.data.data_dir = data_dir
  task = tasks.make_task(tasks.validate(config), None)
  tx = optim.make_optimizer(config)
  schedule = optim.learning_rate_schedule(config.optim, config.total_steps)
  mesh = sharding.make_mesh(config.mesh_shape)
  rules = sharding.rules_from_config(config)
  with sharding.context(mesh, rules):
    abstract, shardings = state_lib.abstract_and_shardings(task, tx, config.seed, mesh, rules)
    batch_sharding = loop.batch_shardings(task, mesh, rules)
    step = loop.jit_train_step(task, tx, schedule, shardings, batch_sharding)
    t0 = time.perf_counter()
    bound = fit.lower_bound(
      config, task, abstract, shardings, batch_sharding, jax.local_devices()[0].platform
    )
    have, where = fit.available_bytes()
    t1 = time.perf_counter()
    state = jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
    )
    spec_ = task.batch_spec(config.batch_size)
    batch = {
      k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding[k])
      for k, v in spec_.items()
    }
    mem = step.lower(state, batch, *budget.controls_spec(config)).compile().memory_analysis()
    t2 = time.perf_counter()
    real = state_lib.create_state(task, tx, config.seed, shardings)
    data = iter(task.train_dataset())
    calls = []
    for _ in range(2):
      b = sharding.global_batch(next(data), batch_sharding, spec_)
      jax.block_until_ready(b)
      t = time.perf_counter()
      real, metrics = step(real, b)
      jax.block_until_ready(metrics)
      calls.append(time.perf_counter() - t)
  peak = (
    mem.argument_size_in_bytes
    + mem.output_size_in_bytes
    - mem.alias_size_in_bytes
    + mem.temp_size_in_bytes
  )
  gib = 2.0**30
  print(
    f"{spec}: lower bound {bound['total'] / gib:.3f} GiB (state {bound['state'] / gib:.3f}, "
    f"activations {bound['activations'] / gib:.3f}), compiled peak {peak / gib:.3f} GiB, "
    f"{have / gib if have else float('nan'):.1f} GiB {where}; bound {1e3 * (t1 - t0):.1f} ms, "
    f"compile + memory_analysis {t2 - t1:.1f} s, step 1 {calls[0]:.2f} s, "
    f"step 2 {calls[1]:.2f} s",
    flush=True,
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", action="append", help="config file (repeatable)")
  parser.add_argument("--data_dir", default=os.path.expanduser("~/tensorflow_datasets"))
  args = parser.parse_args()
  for spec in args.config or DEFAULT_CONFIGS:
    measure(spec, args.data_dir)


if __name__ == "__main__":
  main()
