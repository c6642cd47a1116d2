"""Train a laplax model.

    python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit
    python train.py --config configs/deit3_cifar.py:laplacian=12,spectral=True \
        --workdir runs/deit3 --config.batch_size=256

Re-running the same command on a workdir with a checkpoint resumes from it.
``--config.init_from=WORKDIR`` starts from the parameters of another run (or of
``python -m laplax.convert``), with that run's model keys except those given
here (e.g. ``--config.model.num_laplacian_heads=2``).
Bad input prints one line and exits with code 2.
"""

import sys

from absl import flags
from ml_collections import config_flags

from laplax.train import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (get_config()), optionally FILE.py:arg.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created if missing).")


def main() -> int:
  cli.parse_flags(sys.argv)
  config = cli.load_config_flag()
  cli.model_from_init(config, sys.argv)
  if not _WORKDIR.value:
    raise cli.UsageError("--workdir is required, e.g. --workdir runs/vit")
  cli.quiet()
  from laplax.train import loop  # pylint: disable=import-outside-toplevel
  summary = loop.train_and_evaluate(config, _WORKDIR.value)
  if summary and loop.jax.process_index() == 0:
    print("final eval: " + ", ".join(f"{k}={v}" for k, v in summary.items()))
  return 0


if __name__ == "__main__":
  from laplax.train.loop import NonFiniteError  # pylint: disable=wrong-import-position
  cli.run(main, user_errors=(NonFiniteError,))
