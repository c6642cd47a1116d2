"""Evaluate the latest checkpoint of a laplax run.

    python eval.py --workdir runs/vit

Restores the newest checkpoint with the config saved in the workdir, evaluates
the eval split, prints the result and writes ``eval.json`` (``accuracy``,
``loss``, ``step``, ``num_examples``) into the workdir.
"""

import json
import os
import sys

from absl import flags

from laplax.train import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by train.py.")


def main() -> int:
  cli.parse_flags(sys.argv)
  workdir = _WORKDIR.value
  if not workdir:
    raise cli.UsageError("--workdir is required, e.g. --workdir runs/vit")
  cli.quiet()
  from laplax.train import checkpoint, loop, optim  # pylint: disable=import-outside-toplevel
  config = loop.load_saved_config(workdir)
  if config is None:
    raise cli.UsageError(f"{workdir} has no {loop.CONFIG_FILE}; is it a train.py workdir?")
  ckpt_dir = os.path.join(workdir, loop.CHECKPOINT_DIR)
  if not os.path.isdir(ckpt_dir):
    raise cli.UsageError(f"{workdir} has no checkpoint; train first with train.py "
                         f"--workdir {workdir}")
  checkpointer = checkpoint.Checkpointer(ckpt_dir)
  if checkpointer.latest_step() is None:
    raise cli.UsageError(f"{workdir} has no checkpoint; train first with train.py "
                         f"--workdir {workdir}")
  task, _ = loop.setup(config, None)
  tx = optim.make_optimizer(config)
  try:
    state, _ = checkpointer.restore(loop.abstract_state(task, tx, config.seed),
                                    with_data=False)
  except FileNotFoundError as e:
    raise cli.UsageError(str(e).splitlines()[0]) from None
  summary = loop.evaluate(task, state.params, config)
  summary["step"] = int(state.step)
  with open(os.path.join(workdir, "eval.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(json.dumps(summary))
  return 0


if __name__ == "__main__":
  cli.run(main)
