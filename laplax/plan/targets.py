"""The machines a run can be planned for: ``v5e:4x4``, ``v5p:2x2x2``, ``gpu:8xH100``.

A target names a chip and how many, and from that the hosts: the processes
``train.py`` runs (one per host, each feeding its own chips).

Published peaks, per chip (the roofline of :mod:`laplax.plan.roofline` divides
by them; they are the vendors' figures, not measured here):

* TPU v5e: 197 TFLOP/s bfloat16, 819 GB/s HBM, 16 GiB HBM; 4 chips per host on
  the multi-host slices (``v5litepod-16`` and up: 4 hosts x 4 chips), one host
  for up to 8 chips (cloud.google.com/tpu/docs/v5e, "System architecture").
* TPU v5p: 459 TFLOP/s bfloat16, 2,765 GB/s HBM, 95 GiB HBM; 4 chips per host
  (cloud.google.com/tpu/docs/v5p). The topology counts chips (``2x2x2`` is 8
  chips, 2 hosts).
* NVIDIA H100 SXM: 989 TFLOP/s dense bfloat16 (1,979 with 2:4 sparsity, which
  a training step does not use), 3.35 TB/s HBM3, 80 GB (NVIDIA H100 Tensor
  Core GPU datasheet); 8 GPUs per host (HGX H100).
* NVIDIA H200 SXM: the H100's 989 TFLOP/s, 4.8 TB/s, 141 GB (H200 datasheet).
"""

from __future__ import annotations

import dataclasses
import math
import re

from laplax.errors import UserError

GIB = 2.0**30


class TargetError(UserError, ValueError):
  """A target string that names no machine; the message is one line with the fix."""


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator's published peaks: ``flops`` (bfloat16 FLOP/s),
  ``hbm_bytes_per_s``, ``memory`` (bytes), ``platform`` (``"tpu"`` or
  ``"gpu"``), ``per_host`` (chips a host of a multi-host machine holds)."""

  name: str
  platform: str
  flops: float
  hbm_bytes_per_s: float
  memory: float
  per_host: int


CHIPS = {
  "v5e": Chip("TPU v5e", "tpu", 197e12, 819e9, 16 * GIB, 4),
  "v5p": Chip("TPU v5p", "tpu", 459e12, 2765e9, 95 * GIB, 4),
  "h100": Chip("NVIDIA H100 SXM", "gpu", 989e12, 3.35e12, 80e9, 8),
  "h200": Chip("NVIDIA H200 SXM", "gpu", 989e12, 4.8e12, 141e9, 8),
}
#: v5e slices of up to this many chips are one host (v5litepod-1, -4, -8).
V5E_SINGLE_HOST = 8

EXAMPLES = "v5e:4x4, v5e:8x8, v5p:2x2x2, gpu:8xH100, gpu:2x8xH100"


@dataclasses.dataclass(frozen=True)
class Target:
  """A planned machine: ``chip``, ``num_devices`` chips on ``num_hosts`` hosts
  (one process each), ``spec`` as the user wrote it."""

  spec: str
  chip: Chip
  num_devices: int
  num_hosts: int

  @property
  def per_host(self) -> int:
    """Chips each host (process) feeds."""
    return self.num_devices // self.num_hosts


def _dims(text: str, count: int) -> tuple[int, ...] | None:
  """``"4x4"`` -> ``(4, 4)`` when it has ``count`` positive integers, else None."""
  if not re.fullmatch(r"[1-9]\d*(x[1-9]\d*)*", text):
    return None
  dims = tuple(int(d) for d in text.split("x"))
  return dims if len(dims) == count else None


def parse_target(spec: str) -> Target:
  """The :class:`Target` of ``spec``: ``v5e:AxB`` (a v5e slice of ``A B``
  chips), ``v5p:AxBxC`` (a v5p slice of ``A B C`` chips), ``gpu:NxH100`` (one
  host of ``N`` GPUs) or ``gpu:HxNxH100`` (``H`` hosts of ``N``; ``H200``
  too).

  Raises:
    TargetError: anything else, as one line with examples.
  """
  kind, _, rest = str(spec).strip().partition(":")
  kind = kind.lower()
  bad = TargetError(f"--target {spec!r} names no machine; use one of {EXAMPLES}")
  if kind in ("v5e", "v5p"):
    dims = _dims(rest, 2 if kind == "v5e" else 3)
    if dims is None:
      raise TargetError(
        f"--target {spec!r}: a {kind} slice is its chip topology, "
        f"{'AxB, e.g. v5e:4x4' if kind == 'v5e' else 'AxBxC, e.g. v5p:2x2x2'}"
      )
    chip, n = CHIPS[kind], math.prod(dims)
    single = kind == "v5e" and n <= V5E_SINGLE_HOST
    hosts = 1 if single else -(-n // chip.per_host)
    return Target(spec, chip, n, hosts)
  if kind == "gpu":
    m = re.fullmatch(r"(?:([1-9]\d*)x)?([1-9]\d*)x(h100|h200)", rest.lower())
    if m is None:
      raise TargetError(
        f"--target {spec!r}: a GPU machine is [HOSTSx]GPUSxMODEL, e.g. gpu:8xH100 or "
        f"gpu:2x8xH100 (models: H100, H200)"
      )
    hosts, per_host = int(m.group(1) or 1), int(m.group(2))
    return Target(spec, CHIPS[m.group(3)], hosts * per_host, hosts)
  raise bad
