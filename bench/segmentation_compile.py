"""Ahead-of-time compilation of a DINO config's segmentation evaluation for a device slice.

    python bench/compile_report.py --segmentation-eval --topology v5e:4x4 \
        --config configs/dino_vits16_imagenet.py
    python bench/compile_report.py --segmentation-eval --cpu-devices 8 \
        --config configs/dino_vits16_imagenet.py --set eval.segmentation_image_size=512 \
        --set eval.segmentation_layers=4

``bench/compile_report.py --segmentation-eval`` calls :func:`report` for each
``--config`` (a DINO config). It compiles, from ``jax.ShapeDtypeStruct``
inputs that carry their shardings (nothing is allocated, no data is read),
the three programs of ``eval.py``'s linear segmentation probe
(:mod:`laplax.evaluators.dino_segmentation`) on a mesh over every device of the
slice, the batches split over it and the parameters replicated, as
``eval.py`` runs them:

* the teacher backbone's patch features of ``eval_batch_size`` RGB images
  at ``eval.segmentation_image_size`` (0: ``data.image_size``, else the
  global crop size; the last ``eval.segmentation_layers`` blocks);
* one AdamW step of the linear head on ``eval.segmentation_batch_size``
  images (logits upsampled to the labels, 150 classes: ADE20K);
* the test predictions and confusion counts of such a batch;

and prints each program's per-device memory (``compiled.memory_analysis()``)
and the host memory of the stored train and test features.
"""

from __future__ import annotations

from bench import common

ADE20K_CLASSES = 150


def _line(name: str, compiled, size) -> str:
  mem = compiled.memory_analysis()
  peak = (
    mem.argument_size_in_bytes
    + mem.output_size_in_bytes
    - mem.alias_size_in_bytes
    + mem.temp_size_in_bytes
  )
  return (
    f"   {name}: arguments {size(mem.argument_size_in_bytes)}, outputs "
    f"{size(mem.output_size_in_bytes)}, temporaries {size(mem.temp_size_in_bytes)} "
    f"-> peak about {size(peak)} per device"
  )


def report(spec: str, devices, args) -> None:
  """Compiles ``spec``'s segmentation evaluation for ``devices`` and prints its memory.

  ``args``: ``bench/compile_report.py``'s parsed flags (``--set``). Exits 2
  (one line) for a config that is not DINO or settings the checks refuse.
  """
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from laplax import (
    sharding,
    tasks,
  )
  from laplax.config import validation as config_lib
  from laplax.evaluators import (
    dino_segmentation,
    registry,
  )
  from laplax.evaluators import linear_segmentation as seg_lib

  config = registry.complete(common.load_config(spec))  # the eval.segmentation_* settings
  for item in args.set:
    common.apply_override(config, item)
  task_class = tasks.task_class(config)
  if task_class is None or not issubclass(task_class, tasks.DINOTask):
    common.fail(f"--segmentation-eval needs a DINO config; {spec} has task {config.task!r}")
  try:
    tasks.validate(config, None, strict_keys=False)
    s = dino_segmentation.settings(config)
    stored = config.data.get("image_size", None) or config.data.multicrop.global_size
    size = dino_segmentation.image_size(config, (stored,))
  except config_lib.ConfigError as e:
    common.fail(str(e).splitlines()[0])
  task = tasks.DINOTask(config, 1000, (size, size, 3))
  backbone, layers = task.teacher.backbone, int(s["segmentation_layers"])
  mesh = sharding.make_mesh(sharding.DEFAULT_MESH_SHAPE, devices)
  axes = sharding.mesh_axes(sharding.DEFAULT_RULES, "batch")
  rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P(axes))

  def shaped(shape, dtype, where):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=where)

  params = jax.tree_util.tree_map(
    lambda x: shaped(x.shape, x.dtype, rep),
    sharding.unbox(
      jax.eval_shape(lambda: backbone.init(jax.random.key(0), jnp.zeros((1, size, size, 3))))
    )["params"],
  )
  n, p, d = len(devices), int(config.model.patch_size), int(config.model.width) * layers
  eval_batch, batch, g = int(config.eval_batch_size), int(s["segmentation_batch_size"]), size // p
  for name, value in (("eval_batch_size", eval_batch), ("eval.segmentation_batch_size", batch)):
    if value % n:
      print(
        f"   note: {name}={value} is not a multiple of {n} devices: eval.py "
        f"replicates such batches instead of splitting them"
      )
  head = {
    "w": shaped((d, ADE20K_CLASSES), jnp.float32, rep),
    "b": shaped((ADE20K_CLASSES,), jnp.float32, rep),
  }
  opt = jax.tree_util.tree_map(
    lambda x: shaped(x.shape, x.dtype, rep),
    jax.eval_shape(seg_lib._optimizer(0.05, 1e-4, 10).init, head),
  )
  x = shaped((batch, g, g, d), jnp.float32, split if batch % n == 0 else rep)
  y = shaped((batch, size, size), jnp.int32, split if batch % n == 0 else rep)
  stat = shaped((d,), jnp.float32, rep)
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  programs = {
    "features": dino_segmentation.feature_fn(backbone, layers).lower(
      params,
      shaped((eval_batch, size, size, 3), jnp.float32, split if eval_batch % n == 0 else rep),
    ),
    "probe step": seg_lib._step.lower(
      head, opt, x, y, stat, stat, scalar, scalar, steps=int(s["segmentation_steps"])
    ),
    "test batch": seg_lib._predict.lower(head, x, y, stat, stat, num_classes=ADE20K_CLASSES),
  }
  print(
    f"\n== segmentation evaluation of {spec}  ({devices[0].device_kind} x {n}, batches "
    f"split over {n} devices)"
  )
  print(
    f"   images {size} px ({g} x {g} patches), last {layers} block(s): {d} features "
    f"per patch, {ADE20K_CLASSES} classes; feature batch {eval_batch}, probe batch "
    f"{batch}, {s['segmentation_steps']} steps"
  )
  for name, lowered in programs.items():
    try:
      print(_line(name, lowered.compile(), common.size))
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      print(f"   {name}: does not fit: {str(e).splitlines()[0][:300]}")
  host = 4.0 * g * g * d * (s["segmentation_train_images"] + s["segmentation_test_images"])
  print(
    f"   host memory of the stored features: {common.size(host)} "
    f"({s['segmentation_train_images']} train + {s['segmentation_test_images']} test "
    f"images x {g * g} patches x {d} float32)"
  )
