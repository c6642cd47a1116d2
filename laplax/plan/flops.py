"""Analytic FLOPs of a train step, from the config and the parameter shapes.

    num_matmul, flops = analytic_flops(config, task, params, remat=False)

The count every report of laplax compares against (``python -m laplax.plan``'s
roofline, ``bench/step_time.py``'s MFU, ``bench/compile_report.py``'s ratio to
the compiled program's ``cost_analysis()``):

    6 x (matmul parameters) x tokens + 12 x depth x length x width x tokens

(forward and backward of every weight matmul plus the ``Q K^T`` and ``P V``
products, Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
Table 1; with ``remat`` another forward: 8 and 16), with a formula of their own
for the families that declare their own (``Family.flops``,
:mod:`laplax.models.registry`: Swin, DaViT, XCiT), the masked-LM encoder, Nystrom attention and DINO's
multi-crop student and teacher. ``params`` may be arrays or
``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of the init: nothing allocated).
"""

from __future__ import annotations

from laplax import utils


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

  from laplax.models import registry

  m = config.model
  family = registry.find(m.name)
  if family is not None and family.flops is not None:  # the family's own count
    return family.flops(config, task, params, remat)
  if config.task == "mlm":
    return _mlm_flops(config, task, params, remat)
  if config.task == "dino":
    return _dino_flops(config, task, params, remat)
  per_token, per_example = 0, 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    name = name.removeprefix("encoder/")  # LRA retrieval's shared encoder of both documents
    if leaf.ndim < 2 or name.startswith(("pos_embedding", "cls")):
      continue
    if name.startswith("token_embedding") and not m.get("tie_embeddings", False):
      continue  # an untied input table is a lookup, not a matmul
    if name.startswith(("head/", "head_hidden/")):  # on the pooled example
      per_example += leaf.size
    else:
      per_token += leaf.size
  from laplax import tasks

  if tasks.is_language_model(config):
    length = seen = m.max_length
  elif getattr(task, "image_shape", None) is not None:
    length = seen = (task.image_shape[0] // m.patch_size) ** 2 + (1 if m.pool == "tok" else 0)
  else:  # a sequence classifier (LRA, GLUE): retrieval's two documents, each attending to itself
    seen = task.tokens_per_example()
    length = getattr(task, "length", seen)
  batch = config.batch_size
  tokens = batch * seen
  w, a = (8, 16) if remat else (6, 12)
  attended = _attended(m, length)
  flops = (
    w * per_token * tokens + w * per_example * batch + a * m.depth * attended * m.width * tokens
  )
  flops += w // 2 * m.depth * _nystrom_extra(m, length) * tokens
  return per_token + per_example, float(flops)


def _nystrom_extra(m, length: int) -> float:
  """Forward FLOPs per token and layer of Nystrom attention beyond its four
  ``2 m d`` products (:func:`_attended`): each head's ``N x m`` kernel times
  the ``m x m`` pseudo-inverse (``2 m^2`` a token) and the inverse's
  iterations, four ``m x m`` products each (``8 m^3 iterations`` a sequence,
  amortised over its ``length`` tokens; :func:`laplax.kernels.nystrom.iterative_pinv`).
  Zero for every other kernel."""
  if m.get("implementation", None) != "nystrom":
    return 0.0
  k, iterations = int(m.num_landmarks), int(m.get("pinv_iterations", 6))
  return m.num_heads * (2 * k * k + 8 * iterations * k**3 / length)


def _attended(m, length: int) -> int:
  """Keys each query's ``Q K^T`` and ``P V`` multiply by: the ``length``, or
  with Nystrom attention (``model.implementation='nystrom'``, Xiong et al.
  2021) twice the landmarks ``m``: the ``N x m`` kernel against the ``m``
  landmark keys and the ``m x N`` kernel times the values, amortised over the
  ``N`` queries, each a ``2 m d`` product like softmax's ``2 N d`` (the
  pseudo-inverse's part: :func:`_nystrom_extra`)."""
  if m.get("implementation", None) == "nystrom":
    return 2 * int(m.num_landmarks)
  return length


def _dino_flops(config, task, params, remat: bool) -> tuple[int, float]:
  """:func:`analytic_flops` of DINO (Caron et al. 2021): the student's
  backbone on every crop (``num_global`` global crops of ``global_size`` px,
  ``num_local`` local ones of ``local_size``; each its patches plus the class
  token), its projection head on each crop's class token, forward and
  backward (6 and 12, 8 and 16 with remat); the teacher's forward (2 and 4) of
  both on the global crops. The position embeddings and the class token are
  read, not multiplied."""
  del task
  m, mc = config.model, config.data.multicrop
  backbone, head = 0, 0
  for top, name, size in utils.matmul_kernels(params):
    if name.startswith(("backbone/pos_embedding", "backbone/cls")):
      continue
    if top == "head":
      head += size
    else:
      backbone += size
  w, a = (8, 16) if remat else (6, 12)

  def crops(count, side, weights, attention):
    n = (int(side) // m.patch_size) ** 2 + 1
    return count * (weights * (backbone * n + head) + attention * m.depth * n * m.width * n)

  student = crops(mc.num_global, mc.global_size, w, a) + crops(mc.num_local, mc.local_size, w, a)
  teacher = crops(mc.num_global, mc.global_size, 2, 4)
  return backbone + head, float((student + teacher) * config.batch_size)


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
  for top, _, size in utils.matmul_kernels(params):
    if top in ("pos_embedding", "type_embedding"):
      continue
    count += size
    head = top in ("token_embedding",) or top.startswith("mlm_")
    per_seq += w * size * (predicted if head else length)
  per_seq += a * m.depth * length * length * m.width
  return count, float(per_seq * config.batch_size)
