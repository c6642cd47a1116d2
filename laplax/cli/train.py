"""Train a laplax model (``laplax-train``, or ``python train.py`` in a checkout).

    laplax-train --config configs/vit_fashion_mnist.py --workdir runs/vit
    laplax-train --config configs/deit3_cifar.py:laplacian=12,spectral=True \
        --workdir runs/deit3 --config.batch_size=256

``--config`` is a config file (a ``get_config()`` Python file, optionally
``FILE.py:arg``) given by its path; the repository's are in ``configs/``.
Re-running the same command on a workdir with a checkpoint resumes from it.
``--config.init_from=WORKDIR`` starts from the parameters of another run (or of
``python -m laplax.convert``), with that run's model keys except those given
here (e.g. ``--config.model.num_laplacian_heads=2``).
One ``train.py`` writes a workdir at a time (the lock ``WORKDIR/train.lock``): a
second start on it is refused in one line; ``--force_unlock`` takes over the
lock of a run on another host that has ended without releasing it.
Bad input, a locked workdir, a file that cannot be written (a full disk), a
batch larger than its split or a step that cannot fit this machine's memory
(``--config.check_memory=False`` skips that check) prints one line and exits
with code 2. SIGINT or SIGTERM (Ctrl-C, ``kill``) in the training loop saves a
checkpoint after the step in flight and exits 0; if that step does not finish
within 5 s (or twice the slowest logged step), at a second signal, or before
the loop, it prints what is saved and exits at once with 130 (SIGINT) or 143
(SIGTERM).
"""

import sys

from absl import flags
from ml_collections import config_flags

from laplax import signals
from laplax.cli import common as cli

# In absl's global FLAGS (``eval_cli`` keeps its own, so both can be parsed in
# one process).
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Config file (get_config()), optionally FILE.py:arg.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created if missing).")
_FORCE_UNLOCK = flags.DEFINE_bool(
  "force_unlock",
  False,
  "Take over the workdir's lock when another host holds it "
  "(that run must have ended; a dead process of this host is taken over anyway).",
)


def main(guard: signals.Guard) -> int:
  """Parses ``sys.argv``, trains (or resumes) and prints the final eval; returns 0.
  ``guard`` (:func:`laplax.cli.common.run`'s) is told the workdir, whose last
  checkpoint a signal's exit line names.

  Raises:
    cli.UsageError, ConfigError, DataError, CheckpointError, NonFiniteError,
    LockError, SaveError: the user errors :func:`run_cli` prints as one line.
  """
  cli.parse_flags(sys.argv, help_module=sys.modules[__name__])
  config = cli.load_config_flag()
  cli.model_from_init(config, sys.argv)
  cli.apply_target_flops(config, sys.argv)
  if not _WORKDIR.value:
    raise cli.UsageError("--workdir is required, e.g. --workdir runs/vit")
  from laplax import store
  from laplax.workdir import lock

  store.check_scheme(_WORKDIR.value)
  lock.check_single_process(config, _WORKDIR.value, _FORCE_UNLOCK.value)  # in seconds
  from laplax.train import fit

  guard.workdir = _WORKDIR.value
  cli.quiet()
  from laplax.train import loop

  try:
    summary = loop.train_and_evaluate(config, _WORKDIR.value, force_unlock=_FORCE_UNLOCK.value)
  except Exception as e:  # a step out of device memory: one line with this config's levers
    message = fit.out_of_memory(e, config)
    if message is None:
      raise
    raise fit.FitError(message) from None
  if summary and loop.jax.process_index() == 0:
    print("final eval: " + ", ".join(f"{k}={v}" for k, v in summary.items()))
  return 0


def run_cli() -> None:
  """The ``laplax-train`` command: :func:`main` with its user errors as one
  stderr line and exit code 2 (:func:`laplax.cli.common.run`)."""
  cli.run(main)


if __name__ == "__main__":
  run_cli()
