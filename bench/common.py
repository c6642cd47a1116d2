"""What the benchmark scripts share: a config file and its ``--set``
overrides, the task built from shapes alone, the analytic FLOPs count, and
the one-line error exit.

``bench/step_time.py``, ``bench/compile_report.py`` (and its
``segmentation_compile.py``), ``bench/peer_torch.py`` and the smaller
scripts import these from here, so no benchmark script imports another one
for them. This module imports neither JAX nor laplax when it is loaded:
``bench/compile_report.py`` sets ``XLA_FLAGS`` (its fake CPU devices) before
JAX starts, and imports this module first.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys

#: Bytes in a GiB (2**30), the unit of :func:`size`.
GIB = 2.0**30


def fail(message: str) -> None:
  """Prints ``error: MESSAGE`` (one line) on stderr and exits with code 2."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def size(num_bytes: float) -> str:
  """``num_bytes`` in GiB, or in MiB below 1 GiB (``"1.50 GiB"``, ``"12.0 MiB"``)."""
  return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB else f"{num_bytes / 2.0**20:.1f} MiB"


def load_config(spec: str):
  """The ``ml_collections.ConfigDict`` of ``spec``, ``FILE.py`` or
  ``FILE.py:ARG`` (``get_config(ARG)``, as ``train.py --config`` reads it).

  A missing file or one whose ``get_config`` raises is one ``error:`` line
  and exit 2 (:func:`fail`).
  """
  path, _, arg = spec.partition(":")
  if not os.path.exists(path):
    fail(f"config file {path} does not exist")
  module_spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception as e:
    fail(f"config {spec}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
  return None


def apply_override(config, item: str) -> None:
  """Sets one ``--set KEY=VALUE`` in ``config``: ``KEY`` a dotted key the
  config has, ``VALUE`` a Python literal (else the string as written).

  An item without ``=``, an unknown key or a value of the wrong type is one
  ``error:`` line and exit 2 (:func:`fail`).
  """
  key, sep, raw = item.partition("=")
  if not sep:
    fail(f"--set {item!r} must be KEY=VALUE, e.g. model.remat=full")
  node = config
  parts = key.split(".")
  for part in parts[:-1]:
    if part not in node:
      fail(f"--set {key}: unknown key {part!r}")
    node = node[part]
  if parts[-1] not in node:
    fail(f"--set {key}: unknown key {parts[-1]!r}")
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    value = raw
  try:
    node[parts[-1]] = value
  except (TypeError, ValueError) as e:
    fail(f"--set {item}: {str(e).splitlines()[0]}")


def make_task(config, image_shape, num_classes):
  """``config``'s task built from shapes alone, no dataset opened
  (:meth:`laplax.tasks.base.TaskBase.from_shapes`): a language model gets the
  byte vocabulary or ``data.vocab_size`` for BPE (``image_shape`` and
  ``num_classes`` unused), an image task images of ``image_shape`` (H, W, C)
  and ``num_classes`` classes."""
  from laplax import tasks

  return tasks.TASKS[config.task].from_shapes(
    config, image_shape=image_shape, num_classes=num_classes
  )


def analytic_flops(config, task, params, remat: bool) -> tuple[float, float]:
  """(matmul-parameter count, analytic train FLOPs per step) of the config:

      6 x (matmul parameters) x tokens + 12 x depth x length x width x tokens

  (forward and backward of every weight matmul plus the ``Q K^T`` and ``P V``
  products, causal attention counted in full; with ``remat`` another forward
  is added: 8 and 16). Matmul parameters are every kernel (weights with 2 or
  more dimensions) except position embeddings and an untied token embedding
  table, which are read, not multiplied (a tied table is the output
  projection and counts). A classification head sees one token per image,
  so its FLOPs are counted per image. ``params`` may be arrays or
  ``jax.ShapeDtypeStruct``.
  """
  import jax

  m = config.model
  family = {"swin": _swin_flops, "davit": _davit_flops, "xcit": _xcit_flops}.get(m.name)
  if family is not None:
    return family(config, task, params, remat)
  if config.task == "mlm":
    return _mlm_flops(config, task, params, remat)
  per_token, per_example = 0, 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if leaf.ndim < 2 or name.startswith(("pos_embedding", "cls")):
      continue
    if name.startswith("token_embedding") and not m.get("tie_embeddings", False):
      continue  # an untied input table is a lookup, not a matmul
    if name.startswith("head/"):
      per_example += leaf.size
    else:
      per_token += leaf.size
  from laplax import tasks

  if tasks.is_language_model(config):
    length = m.max_length
  else:
    length = (task.image_shape[0] // m.patch_size) ** 2 + (1 if m.pool == "tok" else 0)
  batch = config.batch_size
  tokens = batch * length
  w, a = (8, 16) if remat else (6, 12)
  flops = w * per_token * tokens + w * per_example * batch + a * m.depth * length * m.width * tokens
  return per_token + per_example, float(flops)


def _swin_flops(config, task, params, remat: bool) -> tuple[int, float]:
  """:func:`analytic_flops` of a Swin: each weight matmul on the tokens of its
  stage (``(grid / 2^s)^2`` per image; a patch merging on its output grid, the
  patch embedding on the first), and per block ``Q K^T`` and ``P V`` over
  windows of ``N`` tokens: ``12 N width_s`` per token (16 with remat)."""
  import jax

  from laplax.models import spec as spec_lib
  from laplax.models.swin import stage_window

  spec = spec_lib.from_config(config.model)
  grids, grid = [], task.image_shape[0] // spec.patch_size
  for s in range(len(spec.stage_depths)):
    grid = grid if s == 0 else (grid + 1) // 2
    grids.append(grid)
  stage_of = {}
  for s, (first, depth, _, _) in enumerate(spec.stages()):
    for i in range(first, first + depth):
      stage_of[f"block{i}"] = s
    stage_of[f"merge{s}"] = s
  stage_of["embedding"] = 0
  w, a = (8, 16) if remat else (6, 12)
  count, per_image = 0, 0.0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if leaf.ndim < 2 or "relative_position_bias" in name:
      continue
    count += leaf.size
    top = name.split("/")[0]
    tokens = 1 if top == "head" else grids[stage_of[top]] ** 2
    per_image += w * leaf.size * tokens
  for s, (_, depth, width, _) in enumerate(spec.stages()):
    window = stage_window((grids[s], grids[s]), spec.window_size)[0]
    per_image += depth * a * window[0] * window[1] * width * grids[s] ** 2
  return count, float(per_image * config.batch_size)


def _matmuls(params):
  """``(top-level name, full name, size)`` of every kernel (2 or more dimensions)."""
  import jax

  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if leaf.ndim >= 2:
      yield name.split("/")[0], name, leaf.size


def _davit_flops(config, task, params, remat: bool) -> tuple[int, float]:
  """:func:`analytic_flops` of a DaViT: each kernel (convolutions included:
  their size is the multiply-adds per output position) on the positions of its
  stage (``ceil(grid_0 / 2^s)^2`` per image, the stem's output grid
  ``ceil(H / patch)``; the head on one), and per block ``12 N width_s`` per
  position (16 with remat) with ``N`` the window's ``window_size^2`` tokens
  in a spatial block (over the grid padded to whole windows) and the group's
  ``d = width_s / heads`` channels in a channel block."""
  from laplax.models import spec as spec_lib

  spec = spec_lib.from_config(config.model)
  grids, grid = [], -(-task.image_shape[0] // spec.patch_size)
  for s in range(len(spec.stage_depths)):
    grid = grid if s == 0 else -(-grid // 2)
    grids.append(grid)
  stage_of = {"embedding": 0}
  for s, (first, depth, _, _) in enumerate(spec.stages()):
    stage_of.update({f"block{i}": s for i in range(first, first + depth)})
    stage_of[f"downsample{s}"] = s
  w, a = (8, 16) if remat else (6, 12)
  count, per_image = 0, 0.0
  for top, _, size in _matmuls(params):
    count += size
    per_image += w * size * (1 if top == "head" else grids[stage_of[top]] ** 2)
  heads = spec.layer_heads()
  ws = spec.window_size
  for s, (first, depth, width, _) in enumerate(spec.stages()):
    padded = -(-grids[s] // ws) * ws
    for j in range(depth):
      if j % 2 == 0:  # spatial: windows of ws^2 tokens over the padded grid
        per_image += a * ws * ws * width * padded**2
      else:  # channel groups of d channels, over every position
        per_image += a * (width // heads[first + j]) * width * grids[s] ** 2
  return count, float(per_image * config.batch_size)


def _xcit_flops(config, task, params, remat: bool) -> tuple[int, float]:
  """:func:`analytic_flops` of an XCiT: the convolutional patch embedding on
  its output grids (``ceil(H / 2^(k+1))^2`` for the ``k``-th convolution), the
  XCA blocks' kernels on the ``N`` patch tokens with ``12 d width`` per token
  for the attention over each head's ``d`` channels, the class-attention
  blocks' query, output and MLP on the class token alone and their keys and
  values on the ``N + 1`` tokens (``12 (N + 1) width`` for the one query), the
  head on one token (16 for 12 with remat). The position encoding's
  projection, computed once per step, is left out."""
  from laplax.models import spec as spec_lib

  spec = spec_lib.from_config(config.model)
  size = task.image_shape[0]
  grids = []
  for _ in spec.patch_widths():
    size = -(-size // 2)
    grids.append(size)
  n = grids[-1] ** 2
  xca = spec.depth - spec.cls_attn_layers
  w, a = (8, 16) if remat else (6, 12)
  count, per_image = 0, 0.0
  for top, name, size in _matmuls(params):
    if top in ("pos_embedding", "cls"):
      continue
    count += size
    if top.startswith("embedding"):
      tokens = grids[int(top[len("embedding") :] or 0)] ** 2
    elif top == "head":
      tokens = 1
    elif int(top[len("block") :]) < xca:
      tokens = n
    else:
      tokens = n + 1 if "/key/" in name or "/value/" in name else 1
    per_image += w * size * tokens
  d = spec.width // spec.num_heads
  per_image += a * xca * d * spec.width * n + a * spec.cls_attn_layers * (n + 1) * spec.width
  return count, float(per_image * config.batch_size)


def _mlm_flops(config, task, params, remat: bool) -> tuple[int, float]:
  """:func:`analytic_flops` of a masked-LM encoder: the blocks' kernels on
  every token, the tied embedding (the output projection) and the head's
  transform only on the ``n = round(p L)`` predicted positions of each
  sequence with cramming's rule (its sparse prediction; every position with
  BERT's), and ``12 depth L^2
  width`` per sequence for the bidirectional attention (16 with remat)."""
  from laplax.tasks import mlm

  m = config.model
  length = m.max_length
  predicted = length  # rule "bert": the head runs on every position
  if config.mlm.rule == "cramming":
    predicted = mlm.num_masked(config.mlm.probability, length)
  w, a = (8, 16) if remat else (6, 12)
  count, per_seq = 0, 0.0
  for top, _, size in _matmuls(params):
    if top in ("pos_embedding", "type_embedding"):
      continue
    count += size
    head = top in ("token_embedding",) or top.startswith("mlm_")
    per_seq += w * size * (predicted if head else length)
  per_seq += a * m.depth * length * length * m.width
  return count, float(per_seq * config.batch_size)


def start_chat_server(args: list[str], root: str):
  """Starts ``python -m laplax.chat ARGS --web --port 0`` in ``root`` and
  waits (at most 600 s) for its ``laplax-chat: open URL`` line.

  Returns ``(process, url)``; the caller stops the process (SIGINT).
  Raises ``SystemExit`` with the server's output if it ends or never opens.
  """
  import re
  import subprocess
  import threading
  import time

  env = dict(os.environ, PYTHONUNBUFFERED="1")
  server = subprocess.Popen(
    [sys.executable, "-m", "laplax.chat", *args, "--web", "--port", "0"],
    cwd=root,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  lines: list[str] = []
  threading.Thread(target=lambda: lines.extend(server.stderr), daemon=True).start()
  deadline = time.monotonic() + 600
  while not any("laplax-chat: open" in line for line in lines):
    if server.poll() is not None or time.monotonic() > deadline:
      server.kill()
      raise SystemExit(f"the server did not start: {''.join(lines)}")
    time.sleep(0.1)
  url = re.search(r"(http://\S+)", next(x for x in lines if "laplax-chat: open" in x)).group(1)
  return server, url
