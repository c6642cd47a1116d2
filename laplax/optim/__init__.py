"""The optax optimiser of a run: AdamW (or Muon for the block matrices, or
a project's optimiser that :func:`register_optimizer` names, such as nanochat's), warm-up +
cosine or nanochat's constant + linear warm-down or torch's ``OneCycleLR`` (with
AdamW's beta1 cycled), clipping, decay mask.

The functions read the run spec's typed optimiser section
(:class:`laplax.config.run.Optim`, ``run.optim``; its fields are the keys of
``config.optim``) and the number of updates (``run.schedule.total_steps``).
A ``ConfigDict``'s ``config.optim`` is read the same way, by the same
attribute names: this floor is below :mod:`laplax.config`, so it does not
build the section itself (:func:`optim_of`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from laplax import projects, utils
from laplax.models import layers

#: ``optim.optimizer`` -> ``build(optim, total_steps)`` of the optimisers the
#: projects add (:func:`register_optimizer`); AdamW and Muon are this module's own.
_PROJECT_OPTIMIZERS: dict[str, Callable[[Any, int], optax.GradientTransformation]] = {}


def optim_of(run: Any) -> tuple[Any, int]:
  """``(optimiser section, total_steps)`` of a run spec
  (:class:`laplax.config.run.RunSpec`: ``run.optim``,
  ``run.schedule.total_steps``) or of a complete ``ConfigDict``
  (``config.optim``, ``config.total_steps``: the same fields, unchecked)."""
  if isinstance(run, ml_collections.ConfigDict):
    return run.optim, run.total_steps
  return run.optim, run.schedule.total_steps


def _eps(o: Any) -> float:
  """``optim.eps``, AdamW's epsilon; ``1e-8`` (optax's) when unset or missing
  (configs saved before the key)."""
  eps = getattr(o, "eps", None)
  return 1e-8 if eps is None else eps


def warmdown_schedule(
  peak: float,
  total_steps: int,
  warmdown_ratio: float = 0.2,
  final: float = 0.0,
  warmup_steps: int = 0,
) -> optax.Schedule:
  """``peak`` times nanochat's ``get_lr_multiplier(it)`` at update ``it`` (0-based).

  ``(it + 1) / warmup_steps`` while ``it < warmup_steps``; 1 while ``it <=
  N - W``; then ``p + (1 - p) final`` with ``p = (N - it) / W``, where ``N =
  total_steps`` and ``W = round(warmdown_ratio * N)`` (Python's ``round``,
  as nanochat). For d20, N = 21,400 and W = 4,280: the rate is ``peak`` up
  to update 17,120 and ``peak / 4280`` at the last, 21,399.
  """
  warmdown = round(warmdown_ratio * total_steps)

  def schedule(count):
    it = jnp.asarray(count, jnp.float32)
    progress = (total_steps - it) / max(warmdown, 1)
    mult = jnp.where(it <= total_steps - warmdown, 1.0, progress + (1.0 - progress) * final)
    if warmup_steps > 0:
      mult = jnp.where(it < warmup_steps, (it + 1.0) / warmup_steps, mult)
    return peak * mult

  return schedule


#: torch ``OneCycleLR``'s defaults, which the Nystromformer authors' LRA runs keep.
ONECYCLE = dict(div_factor=25.0, final_div_factor=1e4, base_momentum=0.85, max_momentum=0.95)


def onecycle_schedules(
  peak: float, total_steps: int, warmup_steps: int
) -> tuple[optax.Schedule, optax.Schedule]:
  """``(learning rate, beta1)`` at update ``count`` (0-based) of torch's
  ``OneCycleLR(max_lr=peak, total_steps=N, pct_start=warmup_steps / N,
  anneal_strategy="linear")`` with its other defaults (:data:`ONECYCLE`;
  ``three_phase=False``, ``cycle_momentum=True``), as the Nystromformer
  authors' ``LRA/code/run_tasks.py`` (mlpen/Nystromformer) builds it and
  steps it after each update.

  Its two phases, transcribed from ``torch/optim/lr_scheduler.py``: phase 1
  ends at the float step ``e1 = pct_start * N - 1``, phase 2 at ``N - 1``;
  at step ``s`` of the phase from ``a`` to ``e``, ``pct = (s - a) / (e -
  a)`` and the value ``(end - start) pct + start``. The rate goes from
  ``peak / div_factor`` to ``peak`` (phase 1), then to ``peak / div_factor
  / final_div_factor``; beta1 (torch's momentum of Adam) from
  ``max_momentum`` to ``base_momentum``, then back (:func:`_lerp`: the
  same values, in ``float32`` to ~1e-7 of the peak). Steps past ``N - 1``
  read ``N - 1`` (torch raises past ``N``). ``float32`` values of a
  ``count`` (int or scalar array).

  A warm-up longer than ``N`` is cut to ``N`` (``pct_start = 1``; torch
  refuses more), as the cosine schedule cuts it, so a shortened run works.

  Raises:
    ValueError: the warm-up is 1 step (torch divides by ``e1 = 0``).
  """
  warmup_steps = min(warmup_steps, total_steps)
  if warmup_steps == 1:
    raise ValueError("onecycle needs warmup_steps 0 or at least 2 (torch divides by zero)")
  o = ONECYCLE
  initial = peak / o["div_factor"]
  end1 = float(warmup_steps / total_steps * total_steps) - 1  # torch: pct_start * N - 1
  last = total_steps - 1

  def cycle(start, middle, end):
    def schedule(count):
      step = jnp.minimum(jnp.asarray(count, jnp.float32), last)
      first = step <= math.floor(end1)  # integer steps: step <= e1
      one = _lerp(start, middle, step, end1 - step, max(end1, 1.0))
      two = _lerp(middle, end, step - end1, last - step, (last - end1) or 1.0)  # 0: unused
      return jnp.where(first, one, two)

    return schedule

  lr = cycle(initial, peak, initial / o["final_div_factor"])
  beta1 = cycle(o["max_momentum"], o["base_momentum"], o["max_momentum"])
  return lr, beta1


def _lerp(a: float, b: float, done, left, span: float):
  """torch's linear anneal ``(b - a) pct + a`` at ``pct = done / span``
  (``left = span - done``), from the nearer end in ``float32``: ``a + (b -
  a) pct`` in the first half, ``b - (b - a)(1 - pct)`` in the second, so the
  rate near its small end keeps its own precision, not the peak's."""
  pct, rest = done / span, left / span
  return jnp.where(pct <= 0.5, a + (b - a) * pct, b - (b - a) * rest)


def learning_rate_schedule(
  optim: Any, total_steps: int, peak: float | None = None
) -> optax.Schedule:
  """The learning rate at each update, peaking at ``peak`` (default ``optim.lr``).

  ``optim`` is the run's optimiser section (``run.optim``,
  :class:`laplax.config.run.Optim`) or a config's ``config.optim``.

  ``optim.schedule`` ``"cosine"`` (the default; also when the key is
  missing): linear warm-up from 0 over ``optim.warmup_steps``, then cosine
  decay to ``peak * optim.min_lr_ratio`` at ``total_steps``. ``"warmdown"``:
  nanochat's :func:`warmdown_schedule`, constant
  then linear to ``peak * optim.min_lr_ratio`` over the last
  ``optim.warmdown_ratio`` of the steps (after ``optim.warmup_steps`` of
  nanochat's ``(it + 1) / warmup`` ramp). ``"progress"``: ``peak * min(1,
  (it + 1) / N)``, nanochat 3a5e0bc's mid-training rate (its multiplier was
  the fraction of the epoch read, rising from 0 to 1;
  :mod:`laplax.proj.nanochat.data.mixture`). ``N`` is ``optim.schedule_steps`` when
  set (nanochat's SFT: ``(1 - it / 651)`` for 650 updates), else
  ``total_steps``. ``"onecycle"``: torch's ``OneCycleLR`` of the
  Nystromformer authors' LRA runs (:func:`onecycle_schedules`, its warm-up
  ``optim.warmup_steps``).
  """
  peak = optim.lr if peak is None else peak
  total_steps = optim.schedule_steps or total_steps
  if optim.schedule == "progress":
    return lambda count: (
      peak * jnp.minimum(1.0, (jnp.asarray(count, jnp.float32) + 1.0) / total_steps)
    )
  if optim.schedule == "triangle":
    return triangle_schedule(peak, total_steps)
  if optim.schedule == "onecycle":
    return onecycle_schedules(peak, total_steps, optim.warmup_steps)[0]
  if optim.schedule == "warmdown":
    return warmdown_schedule(
      peak, total_steps, optim.warmdown_ratio, optim.min_lr_ratio, optim.warmup_steps
    )
  warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=peak,
    warmup_steps=warmup,
    decay_steps=max(total_steps, warmup + 1),
    end_value=peak * optim.min_lr_ratio,
  )


def triangle_schedule(
  peak: float, total_steps: int, base: float = 0.25, falloff: float = 0.25
) -> optax.Schedule:
  """cramming's one-cycle ``triangle2`` (``JonasGeiping/cramming``,
  ``backend/optimizers/schedulers.py``, ``get_triangle`` with
  ``base_percentage=0.25, falloff=0.25``; by steps, where its
  ``budget-triangle2`` maps wall time to steps): ``peak * min(base + s (1 -
  base) / (1 - falloff) / N, 1 / falloff - s / (N falloff))`` at update ``s``
  of ``N``: a linear rise from ``base * peak`` to ``peak`` at ``(1 -
  falloff) N``, then linear to 0 at ``N``."""
  n = float(max(total_steps, 1))

  def schedule(count):
    s = jnp.asarray(count, jnp.float32)
    rise = base + s * (1.0 - base) / (1.0 - falloff) / n
    return peak * jnp.maximum(jnp.minimum(rise, 1.0 / falloff - s / (n * falloff)), 0.0)

  return schedule


def budget_step(elapsed_seconds: float, budget_hours: float, total_steps: int, step: int) -> int:
  """The step at which a wall-time budget reads its schedule: cramming's
  ``_get_fake_step`` (``JonasGeiping/cramming``,
  ``backend/optimizers/schedulers.py``), ``int(elapsed / budget x
  total_steps)`` with the elapsed training time and the budget in the same
  unit (here seconds and hours), and 0 at the first update (``step`` 0).
  Its ``budget-triangle2`` is :func:`triangle_schedule` at this step: the
  schedule's progress is the fraction of the budget spent. Python ints and
  floats (the training loop's host side); ``total_steps`` is the horizon the
  step form of the schedule has."""
  if step == 0:
    return 0
  return int(elapsed_seconds / 60 / 60 / budget_hours * total_steps)  # its order of operations


def cosine_ramp(start: float, end: float, steps: int) -> optax.Schedule:
  """Half-cosine from ``start`` at step 0 to ``end`` at ``steps`` (then ``end``).

  ``end - (end - start) * (1 + cos(pi * t / steps)) / 2``: DINO's
  ``cosine_scheduler`` for the weight decay (0.04 -> 0.4) and the teacher
  momentum (0.996 -> 1), here through ``optax.cosine_decay_schedule``.
  """
  decay = optax.cosine_decay_schedule(end - start, max(int(steps), 1))
  return lambda t: end - decay(t)


def weight_decay_schedule(optim: Any, total_steps: int):
  """``optim.weight_decay``, or a cosine ramp to ``optim.weight_decay_end`` if set
  (``optim``: the optimiser section or ``config.optim``)."""
  end = getattr(optim, "weight_decay_end", None)  # optional by design: DINO's base config has it
  if end is None:
    return optim.weight_decay
  return cosine_ramp(optim.weight_decay, end, total_steps)


def decay_mask(params: Any, exclude: tuple[str, ...] = ()) -> Any:
  """Bool tree: True where weight decay applies.

  Decay applies to tensors with two or more dimensions (kernels), never to
  biases, norm scales, LayerScale, and not to parameters whose ``/``-joined
  path matches one of the regexes in ``exclude`` (class token, position
  embedding by default in the configs). Under scanned blocks
  (``model.scan_layers``) the leading layer axis does not count.
  """

  def rule(path, x):
    keys = list(utils.path_keys(path))
    ndim = x.ndim - (layers.SCANNED_BLOCKS in keys)
    return ndim >= 2 and not any(re.search(p, "/".join(keys)) for p in exclude)

  return jax.tree_util.tree_map_with_path(rule, params)


def param_labels(params: Any) -> Any:
  """String tree: which optimizer of ``optim.optimizer="muon"`` updates each leaf.

  * ``"muon"``: matrices inside the blocks (``block{i}/...`` or the scanned
    ``blocks/...``, two dimensions besides the layer axis): ``W_Q, W_K,
    W_V, W_O`` and the MLP kernels (nanochat/gpt.py's ``setup_optimizer``:
    every parameter of ``transformer.h``).
  * ``"embedding"``: ``token_embedding`` and ``pos_embedding`` (with tied
    embeddings the token table is also the output layer).
  * ``"unembedding"``: ``lm_head`` (untied output layer).
  * ``"adamw"``: the rest (biases, norm scales, LayerScale, the learned
    Laplacian mix, a ViT's head), at ``optim.lr``.
  """

  def rule(path, x):
    keys = list(utils.path_keys(path))
    scanned = layers.SCANNED_BLOCKS in keys
    in_block = scanned or any(re.fullmatch(r"block\d+", k) for k in keys)
    if in_block and x.ndim - scanned == 2:
      return "muon"
    if keys and keys[0] in ("token_embedding", "pos_embedding"):
      return "embedding"
    if keys and keys[0] == "lm_head":
      return "unembedding"
    return "adamw"

  return jax.tree_util.tree_map_with_path(rule, params)


def _muon_dims(params: Any) -> Any:
  """Muon's dimension numbers: the last two axes are the matrix (a leading
  layer axis of scanned blocks is a batch axis, orthogonalised per layer)."""
  return jax.tree_util.tree_map(
    lambda x: optax.contrib.MuonDimensionNumbers(x.ndim - 2, x.ndim - 1), params
  )


def _muon_partition(
  o: Any, total_steps: int, adamw: optax.GradientTransformation
) -> optax.GradientTransformation:
  """``optax.partition`` of :func:`param_labels`: ``optax.contrib.muon`` on the
  block matrices; AdamW (same betas, decay and mask as ``adamw``) on the
  embeddings and the output layer at their own learning rates; ``adamw`` on
  the rest. Every group follows the warm-up + cosine shape of its peak.

  Keys read: ``optim.{muon_lr, muon_momentum, muon_weight_decay,
  embedding_lr, unembedding_lr}`` (``None``: ``optim.lr``).
  """

  def group(key):
    lr = getattr(o, key)
    return learning_rate_schedule(o, total_steps, o.lr if lr is None else lr)

  exclude = tuple(o.weight_decay_exclude or ())

  def adamw_at(key):
    return optax.adamw(
      group(key),
      b1=o.b1,
      b2=o.b2,
      weight_decay=weight_decay_schedule(o, total_steps),
      mask=lambda p: decay_mask(p, exclude),
    )

  muon = optax.contrib.muon(
    group("muon_lr"),
    beta=o.muon_momentum,
    weight_decay=o.muon_weight_decay or 0.0,
    muon_weight_dimension_numbers=_muon_dims,
  )
  return optax.partition(
    {
      "muon": muon,
      "embedding": adamw_at("embedding_lr"),
      "unembedding": adamw_at("unembedding_lr"),
      "adamw": adamw,
    },
    param_labels,
  )


def register_optimizer(
  name: str, build: Callable[[Any, int], optax.GradientTransformation]
) -> None:
  """Makes ``optim.optimizer=name`` give ``build(optim, total_steps)`` (a
  project's optimiser, registered when :func:`laplax.projects.discover`
  imports the project's ``optim`` module; ``optim`` is the run's optimiser
  section, :func:`optim_of`).

  Raises:
    ValueError: ``name`` is AdamW's or Muon's, or another builder has it.
  """
  if name in ("adamw", "muon") or _PROJECT_OPTIMIZERS.get(name, build) is not build:
    raise ValueError(f"optimizer {name!r} is registered already")
  _PROJECT_OPTIMIZERS[name] = build


def project_optimizer(name: str) -> Callable[[Any, int], optax.GradientTransformation] | None:
  """The builder a project registered for ``optim.optimizer=name``, the
  projects' ``optim`` modules imported first if no builder has the name;
  ``None`` for AdamW, Muon and an unknown name."""
  if name in ("adamw", "muon"):
    return None
  if name not in _PROJECT_OPTIMIZERS:
    projects.discover("optim")
  return _PROJECT_OPTIMIZERS.get(name)


def onecycle_adamw(
  o: Any, total_steps: int, mask: Callable[[Any], Any]
) -> optax.GradientTransformation:
  """``optax.adamw`` with ``optim.schedule="onecycle"``: the rate and beta1
  of :func:`onecycle_schedules`, beta1 set at each update by
  ``optax.inject_hyperparams`` (torch's ``OneCycleLR`` sets ``betas[0]``
  before each ``AdamW`` step; Adam's bias correction then reads
  ``1 - beta1_t ** t`` in both). ``optim.b1`` is not read; ``optim.b2``,
  ``optim.eps`` and the weight decay (``mask`` where it applies) as
  :func:`make_optimizer`'s AdamW. The same chain as ``optax.adamw``, its
  first state ``InjectHyperparamsState`` around ``ScaleByAdamState``."""
  schedules = onecycle_schedules(o.lr, o.schedule_steps or total_steps, o.warmup_steps)
  adam = optax.inject_hyperparams(optax.scale_by_adam, static_args=("b2", "eps", "eps_root"))
  return optax.chain(
    adam(b1=schedules[1], b2=o.b2, eps=_eps(o)),
    optax.add_decayed_weights(weight_decay_schedule(o, total_steps), mask),
    optax.scale_by_learning_rate(schedules[0]),
  )


def make_optimizer(run: Any) -> optax.GradientTransformation:
  """``clip_by_global_norm(optim.grad_clip)`` then AdamW with the schedule above,
  or with ``optim.optimizer="muon"`` the partition of :func:`_muon_partition`,
  or a project's optimiser of that name (:func:`register_optimizer`; nanochat's
  ``"nanochat"`` and ``"nanochat-fork"``, :mod:`laplax.proj.nanochat.optim`).

  With ``optim.budget_hours`` (AdamW only) the AdamW's learning rate is 1:
  the train step multiplies its update by the schedule at the step of the
  elapsed time (:func:`budget_step`), the same product as the schedule's own.

  ``run`` is the run spec (:class:`laplax.config.run.RunSpec`, what the
  trainer passes: its ``optim`` section and ``schedule.total_steps``) or a
  complete ``ConfigDict`` (:func:`optim_of`). Fields read: ``optim.{optimizer,
  lr, b1, b2, eps, weight_decay, weight_decay_end, warmup_steps, min_lr_ratio,
  grad_clip, weight_decay_exclude, budget_hours}``, the Muon fields, and
  ``total_steps``.
  """
  o, total_steps = optim_of(run)
  build = project_optimizer(o.optimizer)
  if build is not None:
    return build(o, total_steps)
  exclude = tuple(o.weight_decay_exclude or ())
  if o.schedule == "onecycle":
    adamw = onecycle_adamw(o, total_steps, lambda p: decay_mask(p, exclude))
  else:
    adamw = optax.adamw(
      # A wall-time budget: the step scales the update by the schedule at the
      # elapsed time (laplax.train.loop.make_train_step), -1 here.
      1.0 if o.budget_hours is not None else learning_rate_schedule(o, total_steps),
      b1=o.b1,
      b2=o.b2,
      eps=_eps(o),
      weight_decay=weight_decay_schedule(o, total_steps),
      mask=lambda p: decay_mask(p, exclude),
    )
  if o.optimizer == "muon":
    adamw = _muon_partition(o, total_steps, adamw)
  if o.grad_clip:
    return optax.chain(optax.clip_by_global_norm(o.grad_clip), adamw)
  return adamw
