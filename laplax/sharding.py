"""Sharding: the device mesh, logical axis names and the shardings of a run.

Mesh axes (``config.mesh_shape``, default ``(-1, 1, 1)``; docs/scale-out.md):
``data`` (the batch), ``fsdp`` (the batch, and every parameter with its optimizer
state along its largest divisible dimension; ZeRO-3, Rajbhandari et al. 2020) and
``tensor`` (heads and MLP hidden dimension; Megatron-LM, Shoeybi et al. 2019).
Models name axes logically (``"batch"``, ``"length"``, ``"embed"``, ``"heads"``,
``"head_dim"``, ``"mlp"``, ``"vocab"``, ``"classes"``, ``"layers"``) with Flax's
``with_logical_partitioning`` / ``with_logical_constraint``; rules
(:data:`DEFAULT_RULES`) map them to mesh axes. Outside :func:`context` the names
are inert and parameter trees are plain arrays.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from laplax import utils

AXES = ("data", "fsdp", "tensor")
DEFAULT_MESH_SHAPE = (-1, 1, 1)
# (logical axis, mesh axis or axes or None); the first rule naming a logical
# axis whose mesh axes are still free wins (flax.linen.logical_to_mesh_axes).
DEFAULT_RULES = (
  ("batch", ("data", "fsdp")),
  ("heads", "tensor"),
  ("mlp", "tensor"),
  ("length", None),
  ("embed", None),
  ("head_dim", None),
  ("vocab", None),
  ("classes", None),
  ("layers", None),  # the stacked blocks of model.scan_layers
)


def parse_mesh_shape(value: Any) -> tuple[int, int, int]:
  """``(data, fsdp, tensor)`` from a tuple/list or a string such as ``"(2,4,1)"``.

  Raises:
    ValueError: not three integers, an entry below 1 other than a single -1.
  """
  if isinstance(value, str):
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      value = None
  ok = (
    isinstance(value, (list, tuple))
    and len(value) == len(AXES)
    and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
  )
  ok = ok and all(v >= 1 or v == -1 for v in value) and list(value).count(-1) <= 1
  if not ok:
    raise ValueError(
      f"mesh_shape={value!r} must be 3 integers (data, fsdp, tensor), each >= 1 "
      f"except at most one -1 for the remaining devices, e.g. (2,4,1)"
    )
  return tuple(int(v) for v in value)


def resolve_mesh_shape(value: Any, num_devices: int) -> tuple[int, int, int]:
  """The mesh shape with its ``-1`` entry filled in for ``num_devices`` devices.

  Raises:
    ValueError: malformed, or the product is not ``num_devices``.
  """
  shape = parse_mesh_shape(value)
  known = int(np.prod([v for v in shape if v != -1]))
  if -1 in shape:
    if num_devices % known:
      raise ValueError(
        f"mesh_shape={shape} cannot use all {num_devices} devices: {num_devices} "
        f"is not divisible by {known}"
      )
    shape = tuple(num_devices // known if v == -1 else v for v in shape)
  if int(np.prod(shape)) != num_devices:
    raise ValueError(
      f"mesh_shape={shape} has {int(np.prod(shape))} devices but JAX sees "
      f"{num_devices}; use sizes whose product is {num_devices} (or -1 for one of them)"
    )
  return shape


def make_mesh(
  mesh_shape: Any = DEFAULT_MESH_SHAPE, devices: Sequence[jax.Device] | None = None
) -> jax.sharding.Mesh:
  """A ``Mesh`` over ``devices`` (default: all) with axes ``data, fsdp, tensor``.

  Raises:
    ValueError: a malformed shape or one that does not fit the devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  return jax.make_mesh(
    shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES), devices=devices
  )


def parse_rules(rules: Any) -> tuple:
  """Normalises ``config.sharding_rules`` (lists from JSON) to tuples of pairs.

  Raises:
    ValueError: not pairs ``(logical name, mesh axis | tuple of mesh axes | None)``
      over the axes ``data``, ``fsdp``, ``tensor``.
  """
  if isinstance(rules, str):
    try:
      rules = ast.literal_eval(rules)
    except (ValueError, SyntaxError):
      rules = None
  out = []
  for rule in rules if isinstance(rules, (list, tuple)) else [None]:
    ok = isinstance(rule, (list, tuple)) and len(rule) == 2 and isinstance(rule[0], str)
    if ok:
      target = rule[1]
      axes = (
        ()
        if target is None
        else (
          (target,)
          if isinstance(target, str)
          else tuple(target)
          if isinstance(target, (list, tuple))
          else None
        )
      )
      ok = axes is not None and all(a in AXES for a in axes) and len(set(axes)) == len(axes)
    if not ok:
      raise ValueError(
        f"sharding_rules={rules!r} must be pairs (logical axis, mesh axis or "
        f"tuple of mesh axes or None) over the mesh axes {', '.join(AXES)}, e.g. "
        f"(('batch', ('data', 'fsdp')), ('heads', 'tensor'))"
      )
    out.append((rule[0], axes[0] if len(axes) == 1 else (axes or None)))
  return tuple(out)


def rules_from_config(config: ml_collections.ConfigDict) -> tuple:
  """``config.sharding_rules`` (or :data:`DEFAULT_RULES`) as tuples of pairs."""
  return parse_rules(config.sharding_rules or DEFAULT_RULES)


def mesh_axes(rules: Sequence, name: str) -> tuple[str, ...]:
  """The mesh axes ``rules`` give the logical axis ``name`` (``()`` if none)."""
  spec = nn.logical_to_mesh_axes((name,), rules)[0]
  return () if spec is None else ((spec,) if isinstance(spec, str) else tuple(spec))


def axis_size(mesh_shape: Sequence[int], rules: Sequence, name: str) -> int:
  """Number of shards of the logical axis ``name`` on a resolved mesh shape."""
  sizes = dict(zip(AXES, mesh_shape))
  return int(np.prod([sizes[a] for a in mesh_axes(rules, name)]))


@contextlib.contextmanager
def context(mesh: jax.sharding.Mesh, rules: Sequence):
  """Makes ``mesh`` current (``jax.set_mesh``) and activates the logical ``rules``.

  Jitted functions must be traced inside it for the boxes and constraints to apply.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(tuple(rules)):
    yield


def logical_init(init: Callable, names: Sequence[str | None]) -> Callable:
  """``init`` whose values carry the logical axis ``names`` under :func:`context`.

  There ``nn.with_logical_partitioning(init, names)`` (read by :func:`param_specs`);
  elsewhere ``init`` itself.
  """
  boxed = nn.with_logical_partitioning(init, tuple(names))

  def wrapper(*args, **kwargs):
    return boxed(*args, **kwargs) if nn.get_logical_axis_rules() else init(*args, **kwargs)

  return wrapper


def layer_norm_inits(name: str = "embed") -> dict:
  """``scale_init``/``bias_init`` kwargs of an ``nn.LayerNorm`` over the axis ``name``."""
  return dict(
    scale_init=logical_init(nn.initializers.ones, (name,)),
    bias_init=logical_init(nn.initializers.zeros, (name,)),
  )


def unbox(tree: Any) -> Any:
  """Plain arrays from a tree that may hold ``nn.LogicallyPartitioned`` boxes (no constraint applied)."""
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  return jax.tree_util.tree_map(
    lambda x: x.unbox(apply_constraint=False) if is_box(x) else x, tree, is_leaf=is_box
  )


def _fit(spec: Sequence, shape: Sequence[int], mesh: jax.sharding.Mesh) -> list:
  """``spec`` with every mesh-axis entry that does not divide its dimension dropped."""
  out = []
  for entry, size in zip(list(spec) + [None] * (len(shape) - len(spec)), shape):
    axes = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
    shards = int(np.prod([mesh.shape[a] for a in axes]))
    out.append(entry if axes and size % shards == 0 else None)
  return out


def fsdp_spec(spec: Sequence, shape: Sequence[int], fsdp_size: int) -> list:
  """Adds ``"fsdp"`` to the largest unsharded dimension that ``fsdp_size`` divides (first on ties).

  ``spec`` unchanged when ``fsdp_size`` is 1, ``"fsdp"`` is used, or nothing divides.
  """
  spec = list(spec)
  used = {a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)}
  if fsdp_size <= 1 or "fsdp" in used:
    return spec
  free = [d for d in range(len(shape)) if spec[d] is None and shape[d] % fsdp_size == 0]
  if free:
    spec[max(free, key=lambda d: (shape[d], -d))] = "fsdp"
  return spec


def param_specs(boxed_params: Any, mesh: jax.sharding.Mesh, rules: Sequence) -> Any:
  """``PartitionSpec`` of every parameter, from ``jax.eval_shape`` of ``init`` inside :func:`context`.

  Logical names go to mesh axes by ``rules``, non-dividing axes are dropped, then
  :func:`fsdp_spec`. Returns the unboxed tree with ``PartitionSpec`` leaves.
  """
  logical = nn.get_partition_spec(boxed_params)
  shapes = unbox(boxed_params)
  mesh_specs = nn.logical_to_mesh(logical, tuple(rules))

  def leaf(spec, x):
    spec = _fit(spec, x.shape, mesh)
    return P(*fsdp_spec(spec, x.shape, mesh.shape["fsdp"]))

  return jax.tree_util.tree_map(leaf, mesh_specs, shapes, is_leaf=lambda x: isinstance(x, P))


def state_shardings(abstract_state: Any, specs: Any, mesh: jax.sharding.Mesh) -> Any:
  """``NamedSharding`` of every leaf of a TrainState.

  ``state.params`` get ``specs``; a leaf of the same shape whose path ends with a
  parameter's path (optimizer moments, DINO's teacher) gets its sharding. Any
  other leaf of two or more dimensions (an optimizer's buffer in another
  layout: the fork's Muon momentum, stored transposed as PyTorch's
  ``[out, in]``, and its factored second moment) is split over ``"fsdp"``
  along its largest dimension that the axis divides (:func:`fsdp_spec`)
  instead of being replicated on every device; scalars and vectors are
  replicated.
  """
  flat_specs = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, P))[0]
  flat_shapes = jax.tree_util.tree_leaves(abstract_state.params)
  by_path = {
    utils.path_keys(path): (spec, x.shape) for (path, spec), x in zip(flat_specs, flat_shapes)
  }
  replicated = NamedSharding(mesh, P())

  def leaf(path, x):
    keys = utils.path_keys(path)
    for i in range(1, len(keys)):
      hit = by_path.get(keys[i:])
      if hit is not None and tuple(hit[1]) == tuple(x.shape):
        return NamedSharding(mesh, hit[0])
    if len(x.shape) >= 2:
      return NamedSharding(mesh, P(*fsdp_spec([None] * len(x.shape), x.shape, mesh.shape["fsdp"])))
    return replicated

  return jax.tree_util.tree_map_with_path(leaf, abstract_state)


def logical_shardings(names: Any, mesh: jax.sharding.Mesh, rules: Sequence) -> Any:
  """``NamedSharding`` tree from a tree of logical-name tuples (e.g. a batch's axes)."""
  specs = jax.tree_util.tree_map(lambda n: P(*n), names, is_leaf=lambda x: isinstance(x, tuple))
  return nn.logical_to_mesh_sharding(specs, mesh, tuple(rules))


def global_batch(batch: Any, shardings: Any, global_shapes: Any = None) -> Any:
  """Global ``jax.Array`` batch from this process's rows of it.

  Args:
    batch: tree of numpy arrays.
    shardings: a ``NamedSharding`` per leaf (or one for all).
    global_shapes: tree of shapes or ``jax.ShapeDtypeStruct`` (``None``: inferred). A
      leaf whose global shape is its local one must be equal on every process.
  """
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree_util.tree_map(lambda _: shardings, batch)
  if global_shapes is None:
    return jax.tree_util.tree_map(
      lambda s, x: jax.make_array_from_process_local_data(s, np.asarray(x)), shardings, batch
    )
  return jax.tree_util.tree_map(
    lambda s, x, g: jax.make_array_from_process_local_data(
      s, np.asarray(x), tuple(getattr(g, "shape", g))
    ),
    shardings,
    batch,
    global_shapes,
    is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
  )


def whole_batch(batch: Any, mesh: jax.sharding.Mesh, rules: Sequence) -> Any:
  """Global arrays from a batch every process holds whole (evaluation).

  A leading axis the data-parallel size divides is split; other arrays replicated.
  """
  axes = mesh_axes(rules, "batch")
  size = int(np.prod([mesh.shape[a] for a in axes]))

  def put(x):
    x = np.asarray(x)
    split = axes and x.ndim and x.shape[0] % size == 0
    spec = P(axes if len(axes) > 1 else axes[0]) if split else P()
    return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), x, x.shape)

  return jax.tree_util.tree_map(put, batch)


def replicated(tree: Any) -> Any:
  """``tree``'s mesh-sharded arrays replicated over their mesh (one copy per device).

  A collective: every process must call it at the same point.
  """
  leaves = jax.tree_util.tree_leaves(tree)
  meshes = {
    x.sharding.mesh
    for x in leaves
    if isinstance(x.sharding, NamedSharding) and len(x.sharding.device_set) > 1
  }
  if not meshes:
    return tree
  (mesh,) = meshes
  return jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, P()))(tree)


def initialize_distributed(dist: ml_collections.ConfigDict) -> bool:
  """Starts JAX's multi-process runtime if ``config.distributed`` asks for it.

  ``coordinator_address`` set: ``jax.distributed.initialize(coordinator_address,
  num_processes, process_id)``; ``enabled`` or ``JAX_COORDINATOR_ADDRESS``:
  ``jax.distributed.initialize()`` (SLURM, Open MPI, Kubernetes, Cloud TPU). CPU
  collectives use gloo. Call before JAX's backend starts; a second call is a no-op.
  Returns whether the runtime is initialized.
  """
  address = dist.coordinator_address
  wanted = address or dist.enabled or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if not wanted:
    return False
  if jax.distributed.is_initialized():
    return True
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs = {}
  if address:
    kwargs = dict(
      coordinator_address=address, num_processes=dist.num_processes, process_id=dist.process_id
    )
  jax.distributed.initialize(**kwargs)
  logging.info(
    "process %d of %d, %d local of %d devices",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
  return True
