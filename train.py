"""``python train.py`` in a checkout: the ``laplax-train`` command.

    python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit

The command lives in :mod:`laplax.cli.train` (its docstring and
``--help`` list the flags); this file only runs it.
"""

import signal

if __name__ == "__main__":  # Ctrl-C while the imports run: end at once, quietly
  signal.signal(signal.SIGINT, signal.SIG_DFL)  # (laplax's handlers come next)

from laplax.cli.train import main, run_cli  # noqa: F401

if __name__ == "__main__":
  run_cli()
