"""The workdir lock in an object store (``gs://``): a lock object with a lease.

An object store has no ``flock`` and no hard links, and a host cannot see
another host's processes. ``train.lock`` there is one JSON object,
:func:`laplax.workdir.lock`'s record plus ``"renewed"`` (Unix seconds of the
last heartbeat, the holder's clock) and ``"lease_s"``:

* it is taken with a create-if-absent upload (``ifGenerationMatch=0``): of two
  starts only one succeeds, the other is refused in one line;
* the holder renews it every ``lease_s / 4`` seconds from a daemon thread,
  each upload conditional on the generation it wrote last
  (``ifGenerationMatch=G``), so a holder whose lock was taken over notices and
  stops renewing (a warning);
* a lock whose last heartbeat is older than its ``lease_s`` (a run killed, a
  host gone) is taken over by the next start with a warning, with an upload
  conditional on the generation read, so two starts never both take it; a
  lock of a process of this host that no longer runs is taken over at once;
  ``--force_unlock`` takes over a live lease;
* it is removed (conditional on the generation) when the run ends.

``LAPLAX_LOCK_LEASE_S`` sets the lease (default 120 seconds). Clocks of the
hosts are assumed to agree within seconds (NTP, as on Cloud VMs).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from laplax import store

DEFAULT_LEASE_S = 120.0


def lease_s() -> float:
  """The lease of a lock taken now: ``LAPLAX_LOCK_LEASE_S`` or 120 seconds."""
  return float(os.environ.get("LAPLAX_LOCK_LEASE_S", DEFAULT_LEASE_S))


def expired(record: dict, now: float | None = None) -> bool:
  """Whether the lease of ``record`` has run out (its last heartbeat older than ``lease_s``)."""
  renewed = record.get("renewed", record.get("started"))
  if not isinstance(renewed, (int, float)):
    return True
  lease = record.get("lease_s", DEFAULT_LEASE_S)
  return (time.time() if now is None else now) > renewed + float(lease)


def read(path: str) -> tuple[dict | None, int | None]:
  """``(record, generation)`` of the lock object ``path``; ``(None, None)`` when
  there is none, ``({}, generation)`` for an object that is not a lock record."""
  gen = store.generation(path)
  if gen is None:
    return None, None
  try:
    record = json.loads(store.read_bytes(path))
  except FileNotFoundError:
    return None, None
  except ValueError:
    return {}, gen
  return (record if isinstance(record, dict) else {}), gen


class Heartbeat:
  """Renews the lock object ``path`` (holding ``record``, generation ``gen``) in a thread."""

  def __init__(self, path: str, record: dict, gen: int):
    self.path, self.record, self.gen = path, dict(record), gen
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="laplax-lock-heartbeat", daemon=True)
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.wait(float(self.record["lease_s"]) / 4):
      self.record["renewed"] = time.time()
      try:
        gen = store.replace(self.path, json.dumps(self.record), self.gen)
      except Exception as e:  # a failing store: try again at the next beat
        logging.warning("could not renew the lock %s (%s); trying again", self.path, e)
        continue
      if gen is None:
        logging.warning("the lock %s was taken over by another run; stop this one", self.path)
        return
      self.gen = gen

  def stop(self) -> int:
    """Stops renewing; returns the generation last written."""
    self._stop.set()
    self._thread.join()
    return self.gen
