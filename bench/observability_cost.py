"""What the observability costs: a GPT run's text sample per evaluation, and
writing eval.py's figures into TensorBoard (and an offline W&B run).

    python bench/observability_cost.py                  # the sample, configs/gpt_shakespeare.py
    python bench/observability_cost.py --set eval.sample_tokens=128
    python bench/observability_cost.py --figures runs/gpt          # runs/gpt/analysis_*.png
    python bench/observability_cost.py --figures runs/dino --wandb

The sample: the config's model at initialisation (the cost does not depend
on the weights) samples ``eval.sample_tokens`` tokens after its validation
prompt, as ``train.py`` does at each evaluation (the ``samples`` evaluator),
``--repeats`` times: the first call compiles, the later ones are what each
further evaluation pays. One evaluation of the same state is timed beside it
(its second call, compiled). The config's data must be prepared
(``data.data_dir``), as for training.

``--figures DIR`` (instead of the sample): the ``analysis_*.png``, ``patch_pca.png`` and
``segmentation.png`` of DIR are written ``--repeats`` times as TensorBoard
images into a temporary directory (and with ``--wandb`` into an offline W&B
run there): the time to open the writer, write and close.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sample_cost(path: str, overrides: list[str], repeats: int) -> None:
  """Prints the time of ``repeats`` samples and of one evaluation."""
  from bench.common import apply_override, load_config
  from laplax import optim
  from laplax import state as state_lib
  from laplax.evaluators import registry
  from laplax.train import loop

  config = registry.complete(load_config(path))  # the evaluators' settings, for --set eval.*
  for item in overrides:
    apply_override(config, item)
  _, task = loop.setup(config, None, check=False)
  state = state_lib.init_state(task, optim.make_optimizer(config), config.seed)
  print(
    f"config {path} {' '.join(overrides)}: sample of {config.eval.sample_tokens} tokens "
    f"after {config.eval.sample_prompt_tokens} prompt tokens (at most half the "
    f"context {config.model.max_length})"
  )
  samples, evaluate = registry.get("samples")(task), registry.get("bits_per_byte")(task)
  for i in range(repeats):
    t = time.perf_counter()
    samples.texts(state)
    print(f"  sample {i + 1}: {time.perf_counter() - t:.3f} s" + (" (compiles)" if i == 0 else ""))
  for i in range(2):
    t = time.perf_counter()
    summary = evaluate.run(state, registry.Context())
    if i == 1:
      print(
        f"  evaluation (compiled): {time.perf_counter() - t:.2f} s, "
        f"{summary.get('num_tokens', summary.get('num_examples'))} tokens/examples"
      )


def figures_cost(directory: str, repeats: int, use_wandb: bool) -> None:
  """Prints the time to write the figures of ``directory`` ``repeats`` times."""
  from laplax.workdir import files as workdir_lib

  config = workdir_lib.load_saved_config(directory)
  paths = sorted(
    glob.glob(os.path.join(directory, "analysis_*.png"))
    + [
      p
      for p in (
        os.path.join(directory, "patch_pca.png"),
        os.path.join(directory, "segmentation.png"),
      )
      if os.path.exists(p)
    ]
  )
  if not paths:
    raise SystemExit(f"no figures in {directory}; run eval.py --analysis (or eval.py on DINO)")
  print(
    f"{len(paths)} figures of {directory}, "
    f"{sum(os.path.getsize(p) for p in paths) // 1024} KiB; wandb={use_wandb}"
  )
  tmp = tempfile.mkdtemp(prefix="laplax_obs_")
  try:
    config.wandb.project = "laplax-bench" if use_wandb else None
    config.wandb.mode = "offline"
    for i in range(repeats):
      t0 = time.perf_counter()
      writer = workdir_lib.MetricWriter(tmp, config)
      t1 = time.perf_counter()
      writer.write_images(i, {os.path.basename(p)[:-4]: p for p in paths})
      t2 = time.perf_counter()
      writer.close()
      t3 = time.perf_counter()
      print(f"  {i + 1}: open {t1 - t0:.3f} s, write {t2 - t1:.3f} s, close {t3 - t2:.3f} s")
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/gpt_shakespeare.py")
  parser.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="override a config key, e.g. eval.sample_tokens=128 (repeatable)",
  )
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--figures", default=None, help="a workdir with eval.py's figures")
  parser.add_argument("--wandb", action="store_true", help="also an offline W&B run")
  args = parser.parse_args()
  if args.figures:
    figures_cost(args.figures, args.repeats, args.wandb)
  else:
    sample_cost(args.config, args.set, args.repeats)


if __name__ == "__main__":
  main()
