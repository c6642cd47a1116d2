"""``python eval.py`` in a checkout: the ``laplax-eval`` command.

    python eval.py --workdir runs/vit
    python eval.py --workdir runs/vit --step 600 --out evals/vit_600/eval.json

The command lives in :mod:`laplax.cli.eval` (its docstring and
``--help`` list the flags and what is written where); this file only runs it.
"""

import signal

if __name__ == "__main__":  # Ctrl-C while the imports run: end at once, quietly
  signal.signal(signal.SIGINT, signal.SIG_DFL)  # (laplax's handlers come next)

from laplax.cli.eval import FLAGS, main, run_cli  # noqa: F401

if __name__ == "__main__":
  run_cli()
