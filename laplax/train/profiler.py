"""The profiler of the training loop: a ``jax.profiler`` trace of chosen steps.

``config.profile.start_step`` and ``config.profile.num_steps`` (0 = no trace;
the run spec's observability section, ``run.observability``) choose the steps; the trace goes under ``WORKDIR/profile/`` (docs/observability.md).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections

from laplax.config import run as run_lib

PROFILE_DIR = "profile"


class Profiler:
  """A ``jax.profiler`` trace of ``config.profile.num_steps`` training steps
  from ``config.profile.start_step`` on, into ``WORKDIR/profile/``
  (``plugins/profile/<time>/<host>.xplane.pb`` for TensorBoard's profile
  plugin, and ``<host>.trace.json.gz``, a Chrome trace that Perfetto opens).

  Every step runs under ``jax.profiler.StepTraceAnnotation("train",
  step_num=step)`` (traced or not: the annotation costs microseconds), so
  the trace viewer shows the steps. The trace starts before step
  ``start_step`` and stops once the state of the last traced step (or of
  the run's last step) is computed. Every process traces; with several
  processes each writes under ``profile/process_<index>/`` (processes on one
  host would otherwise write the same file).

  ``run``: the run spec (its ``observability`` and ``schedule`` sections) or
  a complete ``ConfigDict`` (the sections built from it); unset keys trace
  nothing.
  """

  def __init__(self, run: run_lib.RunSpec | ml_collections.ConfigDict, workdir: str):
    seen = run_lib.section(run, "observability")
    self.first = int(seen.profile_start_step or 1)
    self.num = int(seen.profile_num_steps or 0)
    self.total = int(run_lib.section(run, "schedule").total_steps)
    self.last = min(self.first + self.num - 1, self.total)
    self.directory = os.path.join(workdir, PROFILE_DIR)
    if jax.process_count() > 1:
      self.directory = os.path.join(self.directory, f"process_{jax.process_index()}")
    self.tracing = False

  def check(self, start: int, say) -> None:
    """Says so when the traced steps are not among this run's (``start`` + 1
    to ``total_steps``; e.g. a resumed run past them)."""
    if self.num and not start < self.first <= self.total:
      say(
        f"no profile: config.profile.start_step={self.first} is not among the "
        f"steps {start + 1}-{self.total} this run trains"
      )

  def step(self, step: int):
    """The context of training step ``step``: starts the trace at the first
    traced step; the step annotation."""
    if self.num and step == self.first and not self.tracing:
      jax.profiler.start_trace(self.directory)
      self.tracing = True
    return jax.profiler.StepTraceAnnotation("train", step_num=step)

  def after(self, step: int, state: Any, say) -> None:
    """Stops the trace after the last traced step (or at ``stop``)."""
    if self.tracing and step >= self.last:
      self.stop(state)
      say(
        f"profile of steps {self.first}-{step} written to {self.directory} (open "
        f"it with TensorBoard's profile plugin or ui.perfetto.dev)"
      )

  def stop(self, state: Any = None) -> None:
    """Ends a running trace (waiting for ``state``'s computation)."""
    if self.tracing:
      if state is not None:
        jax.block_until_ready(state)
      jax.profiler.stop_trace()
      self.tracing = False
