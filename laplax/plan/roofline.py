"""A lower bound on a train step's time from its FLOPs and HBM bytes (a roofline).

    t_step >= max(FLOPs / (n x peak FLOP/s), bytes per chip / HBM bytes/s)

Williams, Waterman and Patterson 2009, "Roofline: an insightful visual
performance model for multicore architectures". The FLOPs are the analytic
count of :mod:`laplax.plan.flops`; the bytes are only those a step cannot avoid
moving through each chip's HBM: its weights read in the forward and the
backward pass of every micro-batch (at their stored dtype, split by the
``tensor`` axis), and its shard (``fsdp x tensor``) of the parameters,
gradients and optimiser state read and written once by the update.
Activations, communication and kernel launch are left out, so a real step is
slower: the figure is a bound, never an estimate.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Bound:
  """``flops_s`` and ``bytes_s``: the step's time at the chip's FLOP and HBM
  peaks; ``step_s`` the larger; ``bytes_per_chip`` the HBM traffic counted."""

  flops_s: float
  bytes_s: float
  bytes_per_chip: float

  @property
  def step_s(self) -> float:
    """The lower bound on one step's time, seconds."""
    return max(self.flops_s, self.bytes_s)

  @property
  def limit(self) -> str:
    """``"compute"`` or ``"memory"``: which peak bounds the step."""
    return "compute" if self.flops_s >= self.bytes_s else "memory"


def step_bound(
  flops: float,
  num_devices: int,
  chip,
  *,
  param_bytes: float,
  state_bytes: float,
  micro_batches: int,
  fsdp: int,
  tensor: int,
) -> Bound:
  """The :class:`Bound` of a step of ``flops`` FLOPs over ``num_devices``
  chips of ``chip`` (:class:`laplax.plan.targets.Chip`): ``param_bytes`` the
  parameters at their dtypes, ``state_bytes`` the whole train state (parameters,
  optimiser state; the gradients are counted as the parameters once more),
  ``micro_batches`` forward and backward passes per step, ``fsdp`` and
  ``tensor`` the mesh axes that split them (see the module docstring)."""
  weights = 2 * micro_batches * param_bytes / tensor  # forward + backward reads
  update = 2 * (state_bytes + param_bytes) / (fsdp * tensor)  # read + write, with gradients
  per_chip = weights + update
  return Bound(
    flops_s=flops / (num_devices * chip.flops),
    bytes_s=per_chip / chip.hbm_bytes_per_s,
    bytes_per_chip=per_chip,
  )
