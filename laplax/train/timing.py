"""Wall-clock timing of the training loop's logging intervals.

Each ``train`` record of ``metrics.jsonl`` gets ``steps_per_sec`` and
``data_wait_fraction`` from a :class:`LogInterval` (docs/workdir.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class LogInterval:
  """The steps between two log records: their wall time and the part of it
  the loop spent blocked on input.

  :meth:`wait_for` times one call that produces the next batch (reading it
  from the input pipeline and placing it on the devices); :meth:`record`
  ends the interval. The interval's wall time is everything since the
  previous record (or since construction): steps, input, evaluations,
  checkpoint saves. With JAX's asynchronous dispatch the devices may still
  be computing the previous step while the loop waits, so the fraction is
  an upper bound on the time the steps are starved of input.
  """

  def __init__(self, clock: Callable[[], float] = time.perf_counter):
    self._clock = clock
    self._start = clock()
    self._wait = 0.0

  def wait_for(self, fetch: Callable[[], T]) -> T:
    """``fetch()``, its duration added to the interval's input wait."""
    t0 = self._clock()
    try:
      return fetch()
    finally:
      self._wait += self._clock() - t0

  def record(self, steps: int) -> dict:
    """Ends the interval of ``steps`` steps and starts the next.

    Returns:
      A dict: ``steps_per_sec`` (steps / wall seconds) and
      ``data_wait_fraction`` (input wait / wall time, in ``[0, 1]``).
    """
    now = self._clock()
    elapsed = max(now - self._start, 1e-9)
    fraction = min(max(self._wait / elapsed, 0.0), 1.0)
    self._start, self._wait = now, 0.0
    return {"steps_per_sec": steps / elapsed, "data_wait_fraction": fraction}
