"""``train.py`` with two test hooks, one process of a multi-process run (tests/train/test_hosts.py).

    LAPLAX_HOSTS_DIR=DIR [LAPLAX_HOSTS_HOLD=P:K] python tests/helpers/hosts_run.py FLAGS...

runs ``python train.py FLAGS`` (:func:`laplax.cli.train.run_cli`, nothing
else changed) with two hooks around the training loop's own functions:

* what each process reads: every local batch this process feeds to
  :func:`laplax.sharding.global_batch` (its rows of the global batch) is
  appended to ``DIR/process{I}.jsonl`` as ``{"step": S, "rows": [[token,
  ...], ...]}`` (``I`` = ``jax.process_index()``, ``S`` the step the batch
  trains), and the step at which the loop's stop check
  (``laplax.train.loop._stop_reached``) said stop as ``{"stop": S}``, so
  that the test checks which rows each process read and that every process
  stopped after the same step, instead of assuming them;
* a hold that makes a signal's moment deterministic: with
  ``LAPLAX_HOSTS_HOLD=P:K`` process ``P``, at the stop check after step
  ``K``, first waits until the newest checkpoint it started is complete
  (orbax commits in a background thread, which on a slow object store may
  take longer than a few steps), then creates ``DIR/held{P}`` and waits
  (at most :data:`HOLD_S`) until
  every process has posted its step counter for JAX's preemption sync
  (the coordination service's key-value directory
  :data:`PREEMPTION_COUNTERS`, XLA's ``preemption_sync_manager.cc``): the
  test signals ``P`` when the file appears, and once every counter is posted
  the stop step is fixed (the largest counter + 1, here ``K`` or ``K + 1``)
  however slowly the machine runs. A SIGKILL instead simply ends ``P`` there.
"""

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from laplax import sharding  # noqa: E402
from laplax.train import loop  # noqa: E402
from laplax.workdir.checkpoint import Checkpointer  # noqa: E402

HOLD_S = 120
PREEMPTION_COUNTERS = "PREEMPTION_CURRENT_COUNTER/"


def _log(out: str, record: dict) -> None:
  path = os.path.join(out, f"process{jax.process_index()}.jsonl")
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")


def _committed(checkpointers: list) -> None:
  """Waits (at most :data:`HOLD_S`) until the newest save of each checkpointer is complete."""
  deadline = time.monotonic() + HOLD_S
  for ckpt in checkpointers:
    while ckpt._saving not in ckpt.complete_steps() and time.monotonic() < deadline:
      time.sleep(0.05)


def _hold(out: str, checkpointers: list) -> None:
  """Waits for the checkpoints started, marks the hold, then waits until every
  process has posted its preemption counter."""
  from jax._src import distributed

  _committed(checkpointers)
  open(os.path.join(out, f"held{jax.process_index()}"), "w").close()
  client = distributed.global_state.client
  deadline = time.monotonic() + HOLD_S
  while time.monotonic() < deadline:
    if len(client.key_value_dir_get(PREEMPTION_COUNTERS)) == jax.process_count():
      return
    time.sleep(0.01)


def install(out: str, hold: str | None) -> None:
  """Wraps the loop's stop check, ``sharding.global_batch`` and
  ``Checkpointer.save`` (see the module docstring)."""
  reached, global_batch, save = loop._stop_reached, sharding.global_batch, Checkpointer.save
  checkpointers = []
  held = tuple(int(x) for x in hold.split(":")) if hold else None
  current = [0]  # the last step the stop check ran after

  def stop_reached(stop, step):
    if (jax.process_index(), step) == held:
      _hold(out, checkpointers)
    current[0] = step
    if reached(stop, step):
      _log(out, {"stop": step})
      return True
    return False

  def feed(batch, *args, **kwargs):
    _log(out, {"step": current[0] + 1, "rows": batch["tokens"].tolist()})
    return global_batch(batch, *args, **kwargs)

  def saving(self, *args, **kwargs):
    if self not in checkpointers:
      checkpointers.append(self)
    return save(self, *args, **kwargs)

  loop._stop_reached = stop_reached
  Checkpointer.save = saving
  sharding.global_batch = feed


if __name__ == "__main__":
  install(os.environ["LAPLAX_HOSTS_DIR"], os.environ.get("LAPLAX_HOSTS_HOLD"))
  from laplax.cli.train import run_cli

  sys.argv = [os.path.join(ROOT, "train.py")] + sys.argv[1:]
  run_cli()
