"""The token-geometry and conditioning analysis of a trained model, streamed over a split.

:func:`run_analysis` feeds the eval split once through the eval forward pass, streams
each chosen layer into a :class:`~laplax.analysis.geometry.GeometryAccumulator`, sums
the attention statistics, then measures kernels, Jacobians and gradient norms
(:mod:`laplax.analysis.conditioning`). Memory: the accumulators plus one chunk of
``batch_size`` sequences per chosen layer, whatever the size of the split.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import spectral, utils
from laplax.analysis import capture, conditioning, geometry
from laplax.errors import UserError

ANALYSIS_FILE = "analysis.json"


class AnalysisError(UserError, ValueError):
  """A user-facing problem with what was asked to be analysed (one line)."""


@dataclasses.dataclass
class Target:
  """What to analyse.

  Attributes:
    model: a ViT (classifier or DINO backbone) or a GPT; params: its parameters.
    kind: ``"image"`` (batches ``{"image", "label", "mask" [B]}``) or ``"lm"``
      (``{"tokens" [B, T + 1], "mask" [B, T]}``; next-token classes).
    num_classes: sequence classes (0 = none); vocab_size: token classes of an LM.
    classifier: optional float ``[num_classes, D]`` rows reading ``features`` (NC3).
    token_classifier: optional float ``[vocab_size, D]`` unembedding (NC3).
    spectral: ``{"enabled", "lam", "mode", "targets"}`` of the run (measured as a
      counterfactual when disabled).
    loss_fn: optional deterministic ``loss_fn(params, batch) -> float32 scalar`` on a
      training-layout batch (``{"image" [B, H, W, C], "label" int32 [B]}`` or
      ``{"tokens" int32 [B, T + 1]}``), traceable by ``jax.grad``; ``None`` skips the
      gradient norms, and ``no_loss_reason`` says why.
  """

  model: nn.Module
  params: Any
  kind: str
  num_classes: int = 0
  vocab_size: int = 0
  classifier: np.ndarray | None = None
  token_classifier: np.ndarray | None = None
  spectral: dict = dataclasses.field(
    default_factory=lambda: {
      "enabled": False,
      "lam": 10.0,
      "mode": spectral.DEFAULT_MODE,
      "targets": spectral.TARGETS,
    }
  )
  loss_fn: Callable[[Any, dict], jax.Array] | None = None
  no_loss_reason: str = "no training loss was given (Target.loss_fn is None)"


def _attention_sums(weights, qmask, causal) -> dict:
  """One layer's attention sums over a chunk (see :func:`run_analysis`)."""
  ent, uniform, count = conditioning.attention_entropy(weights, qmask, causal=causal)
  self_weight, _ = conditioning.attention_self_weight(weights, qmask)
  similarity, _ = conditioning.attention_head_similarity(weights, qmask)
  return {
    "entropy": ent,
    "uniform": uniform,
    "self_weight": self_weight,
    "similarity": similarity,
    "count": count,
  }


def _forward(model, layers, causal, params, inputs, mask):
  """Block outputs, attention sums per chosen layer, and the features.

  A per-example ``mask [B]`` (images) counts every query of a layer's
  attention, whatever its queries are (an XCiT's: channels, or the class
  token); a per-token ``mask [B, T]`` (sequences) is the queries' own."""
  out, inter = capture.analysis_apply(model, params, inputs)
  reps = capture.block_outputs(out, layers)
  qmask = lambda n: mask if mask.ndim == 2 else jnp.broadcast_to(mask[:, None], (len(mask), n))
  attn = {}
  for i in layers:
    weights = capture.attention_weights(inter, i)
    attn[i] = _attention_sums(weights, qmask(weights.shape[2]), causal)
  for i in layers:
    heads = capture.head_outputs(inter, i)
    cos, count = geometry.smoothing_cosine_sums(
      heads,
      capture.head_out_kernels(params, i, model.spec.num_heads),
      out[f"block{i}"]["input"],
      qmask(heads.shape[1]),
    )
    attn[i].update(smoothing_sum=cos, smoothing_count=count)
  feats = out["pre_logits"][:, None] if "pre_logits" in out else out["encoded"]
  return reps, attn, feats


def _chunks(arrays: dict, size: int):
  """Cuts a batch dict along axis 0 into chunks of ``size``, zero-padding the last."""
  n = len(next(iter(arrays.values())))
  for start in range(0, n, size):
    chunk = {}
    for k, a in arrays.items():
      part = np.asarray(a[start : start + size])
      if len(part) < size:
        pad = np.zeros((size - len(part),) + part.shape[1:], part.dtype)
        part = np.concatenate([part, pad])
      chunk[k] = part
    yield chunk


def _split_batch(batch: dict, kind: str) -> dict:
  if kind == "lm":
    tokens = np.asarray(batch["tokens"])
    return {
      "inputs": tokens[:, :-1],
      "token_labels": tokens[:, 1:].astype(np.int32),
      "mask": np.asarray(batch["mask"], np.float32),
    }
  out = {
    "inputs": np.asarray(batch["image"]),
    "mask": np.asarray(batch.get("mask", np.ones(len(batch["image"]))), np.float32),
  }
  if "label" in batch:
    out["labels"] = np.asarray(batch["label"]).astype(np.int32)
  return out


def _gradient_batch(chunk: dict, kind: str) -> tuple[dict | None, str | None]:
  """The real sequences of a chunk in the training layout, or ``(None, reason)``.

  Language models keep the windows whose every target is real: the training loss has
  no mask.
  """
  mask = chunk["mask"]
  if kind == "lm":
    full = (mask != 0).all(1)
    if not full.any():
      return None, "the first eval batch has no window without padding"
    tokens = np.concatenate([chunk["inputs"][full], chunk["token_labels"][full][:, -1:]], 1)
    return {"tokens": tokens.astype(np.int32)}, None
  if "labels" not in chunk:
    return None, "the eval batches have no labels for the training loss"
  real = mask.reshape(len(mask), -1).any(1)
  return {"image": chunk["inputs"][real], "label": chunk["labels"][real]}, None


def gradient_norms(grads: Any, layer: int, num_heads: int) -> dict:
  """Per-head Frobenius norms of the gradient of a layer's ``W_Q`` and ``W_K``.

  Head ``h`` owns columns ``h * d_head : (h + 1) * d_head`` of ``[D, num_heads *
  d_head]`` (:class:`laplax.attention.MultiHeadAttention`'s reshape). ``grads`` has the
  tree of the parameters (looped or scanned).

  Returns:
    ``{"query": [heads], "key": [heads]}`` Python floats (loss units per kernel unit).

  Raises:
    KeyError: no such layer. ValueError: ``num_heads`` does not divide the columns.
  """
  attn = capture.attention_params(grads, layer)
  out = {}
  for name in ("query", "key"):
    g = np.asarray(attn[name]["kernel"], np.float64)
    if g.ndim != 2 or num_heads < 1 or g.shape[1] % num_heads:
      raise ValueError(f"{name} kernel gradient {g.shape} cannot be cut into {num_heads} heads")
    out[name] = [float(np.linalg.norm(b)) for b in np.split(g, num_heads, axis=1)]
  return out


def _limit(mask: np.ndarray, remaining: int) -> tuple[np.ndarray, int]:
  """Zeroes the mask of the sequences past the first ``remaining`` real ones."""
  real = (mask.reshape(len(mask), -1) != 0).any(1)
  keep = real & (np.cumsum(real) <= remaining)
  mask = mask * keep.reshape((-1,) + (1,) * (mask.ndim - 1))
  return mask, int(keep.sum())


# Compiled functions are cached per model and layers (Flax modules hash by their
# attributes), so repeated analyses of one model compile once.


@functools.lru_cache(maxsize=16)
def _jitted_forward(model, layers: tuple):
  return jax.jit(functools.partial(_forward, model, layers, capture.is_causal(model)))


@functools.lru_cache(maxsize=16)
def _jitted_block_io(model, layers: tuple):
  def block_io(params, inputs):
    _, inter = capture.analysis_apply(model, params, inputs, capture_blocks=True)
    return {i: capture.block_io(inter, i) for i in layers}

  return jax.jit(block_io)


@functools.lru_cache(maxsize=64)
def _jit(fn):
  return jax.jit(fn)


@functools.lru_cache(maxsize=64)
def _block_fn(module, causal: bool, laplacian: tuple):
  """``(y [T, D], params) -> attention branch [T, D]`` of a rebuilt block (cached
  per block configuration, so its Jacobian compiles once)."""

  def fn(y, params):
    return module.apply(
      {"params": params}, y[None], is_causal=causal, laplacian=np.asarray(laplacian)
    )[0]

  return fn


@functools.lru_cache(maxsize=4)
def _head_fn(causal: bool):
  """``(x, wq, wk, wv) -> SpecA(x)`` of one head (cached: one compile per shape)."""
  return functools.partial(conditioning.single_head_attention, causal=causal)


def _jacobian_section(
  target: Target, layer: int, y: np.ndarray, attn_out: np.ndarray, max_dim: int
) -> dict:
  """Jacobians of the attention block at ``y [T, D]``: with respect to the input
  (block and heads) and, per head, with respect to the weights with Theorem
  3.4's bound (:func:`~laplax.analysis.conditioning.head_conditioning`)."""
  model = target.model
  tokens = max(1, min(y.shape[0], max_dim // y.shape[1]))
  y = np.asarray(y[:tokens], np.float32)
  module, kwargs = capture.attention_module(model, layer)
  params = capture.attention_params(target.params, layer)
  apply = _block_fn(module, kwargs["is_causal"], tuple(bool(b) for b in kwargs["laplacian"]))
  section = {"tokens": int(tokens), "input": conditioning.jacobian_condition(apply, y, params)}
  if tokens == attn_out.shape[0] or kwargs["is_causal"]:
    # The rebuilt block reproduces the model's attention branch (a causal
    # block's prefix output does not depend on the tokens after it).
    ref = np.asarray(attn_out[:tokens], np.float32)
    diff = np.abs(np.asarray(_jit(apply)(jnp.asarray(y), params)) - ref).max()
    section["block_check"] = float(diff / max(float(np.abs(ref).max()), 1e-30))
  if kwargs["heads_reason"]:  # not token self-attention (an XCiT's)
    section["heads"] = None
    section["heads_reason"] = kwargs["heads_reason"]
    return section
  kernels = capture.projection_kernels(target.params, layer)
  heads, sp = model.spec.num_heads, model.spec.attention.spectral
  eff = {}
  for name, w in kernels.items():
    target_name = name[0]  # query -> "q", key -> "k", value -> "v"
    if sp is not None and target_name in sp.targets:  # the effective kernel W + C
      w = w + np.asarray(
        spectral.correction(
          w.shape,
          lam=sp.lam,
          mode=sp.mode,
          num_heads=heads,
          kernel=w if sp.mode == "svd" else None,
          target=target_name,
        )
      )
    eff[name] = np.split(w, heads, axis=1)
  causal = capture.is_causal(model)
  per_head = []
  for h in range(heads):
    wq, wk, wv = eff["query"][h], eff["key"][h], eff["value"][h]
    head = conditioning.jacobian_condition(_head_fn(causal), y, wq, wk, wv)
    per_head.append(
      dict(
        conditioning.head_conditioning(y, wq, wk, wv, causal=causal),
        input_condition_number=head["condition_number"],
      )
    )
  section["heads"] = per_head
  return section


def _weights_section(target: Target, layer: int) -> dict:
  s = target.spectral
  out = {}
  for name, w in capture.projection_kernels(target.params, layer).items():
    res = conditioning.kernel_conditioning(
      w,
      num_heads=target.model.spec.num_heads,
      lam=float(s["lam"]),
      mode=s["mode"],
      target=name[0],
      targets=s.get("targets", spectral.TARGETS),
    )
    res["effective"] = "corrected" if s["enabled"] else "raw"
    out[name] = res
  return out


def _layer_entry(
  target: Target, i: int, acc, attn: dict, io, grads, no_grad_reason, jacobian_dim: int
) -> dict:
  """One layer's dict of :func:`run_analysis` (geometry, attention statistics,
  weights, learned mix, gradient norms, Jacobian when ``io`` holds the block's
  input and output). ``attn`` holds the layer's attention sums (float64)."""
  entry = {"layer": int(i)}
  entry.update(acc.finalize())
  count = max(float(attn["count"]), 1.0)
  entry["attention_entropy"] = (attn["entropy"] / count).tolist()
  entry["attention_entropy_uniform"] = float(attn["uniform"]) / count
  entry["attention_self_weight"] = (attn["self_weight"] / count).tolist()
  similarity = attn["similarity"] / count
  entry["attention_head_similarity"] = similarity.tolist()
  heads = similarity.shape[0]
  entry["attention_head_similarity_mean"] = (
    float(similarity[np.triu_indices(heads, 1)].mean()) if heads > 1 else None
  )
  entry.update(_smoothing_entry(attn, target.model.spec.laplacian_array[i]))
  if grads is None:
    entry["gradient_norms"] = None
    entry["gradient_norms_reason"] = no_grad_reason
  else:
    entry["gradient_norms"] = gradient_norms(grads, i, target.model.spec.num_heads)
  entry["weights"] = _weights_section(target, i)
  mix = capture.attention_params(target.params, i).get("laplacian_mix")
  if mix is not None:  # model.laplacian_mix="learned": alpha = sigmoid(a) per head
    entry["laplacian_alpha"] = (1.0 / (1.0 + np.exp(-np.asarray(mix, np.float64)))).tolist()
  if io is not None:
    entry["jacobian"] = _jacobian_section(target, i, io[0], io[1], jacobian_dim)
  return entry


def _smoothing_entry(attn: dict, laplacian: np.ndarray) -> dict:
  """``head_smoothing_cosine`` [heads] (``None`` for a head with no counted
  token) and its means over the Laplacian and the standard heads (``None``
  without such heads); see :func:`laplax.analysis.geometry.smoothing_cosine_sums`."""
  count = np.asarray(attn["smoothing_count"], np.float64)
  per_head = [
    float(s / c) if c else None
    for s, c in zip(np.asarray(attn["smoothing_sum"], np.float64), count)
  ]

  def mean_of(heads):
    values = [per_head[h] for h in heads if per_head[h] is not None]
    return float(np.mean(values)) if values else None

  laplacian = np.asarray(laplacian, bool)
  return {
    "head_smoothing_cosine": per_head,
    "laplacian_smoothing_cosine": mean_of(np.flatnonzero(laplacian)),
    "standard_smoothing_cosine": mean_of(np.flatnonzero(~laplacian)),
  }


@dataclasses.dataclass
class _Streamed:
  """What one pass over the eval split gathered (see :func:`_stream`)."""

  accs: dict
  attn_sums: dict
  features: geometry.GeometryAccumulator
  first: np.ndarray
  grad_batch: dict | None
  grad_reason: str | None


def _stream(
  target: Target,
  batches: Iterable[dict],
  layers: tuple,
  max_examples: int,
  batch_size: int,
  progress: Callable[[int], None] | None,
) -> _Streamed:
  """One pass of ``batches``: accumulators, attention sums, the first real example and
  the gradient batch (or why there is none).

  Raises:
    AnalysisError: no real example in ``batches``.
  """
  fwd = _jitted_forward(target.model, layers)
  accs, feature_acc = {}, None
  attn_sums = {}
  first = grad_batch = None
  grad_reason = None if target.loss_fn is not None else target.no_loss_reason
  done = 0
  for batch in batches:
    arrays = _split_batch(batch, target.kind)
    if max_examples:
      arrays["mask"], _ = _limit(arrays["mask"], max_examples - done)
    for chunk in _chunks(arrays, batch_size):
      if not chunk["mask"].any():
        continue
      reps, attn, feats = fwd(target.params, chunk["inputs"], chunk["mask"])
      reps, attn, feats = jax.device_get((reps, attn, feats))
      labels = chunk.get("labels") if target.num_classes else None
      token_labels = chunk.get("token_labels") if target.vocab_size else None
      for i in layers:
        if i not in accs:
          accs[i] = geometry.GeometryAccumulator(
            reps[i].shape[-1], target.num_classes, target.vocab_size
          )
          attn_sums[i] = {k: 0.0 for k in attn[i]}
        accs[i].update(reps[i], mask=chunk["mask"], labels=labels, token_labels=token_labels)
        for k, v in attn[i].items():
          attn_sums[i][k] = attn_sums[i][k] + np.asarray(v, np.float64)
      if feature_acc is None:
        feature_acc = geometry.GeometryAccumulator(
          feats.shape[-1], target.num_classes, target.vocab_size
        )
      feature_acc.update(feats, mask=chunk["mask"], labels=labels, token_labels=token_labels)
      if first is None:
        real = np.flatnonzero(chunk["mask"].reshape(len(chunk["mask"]), -1).any(1))
        first = chunk["inputs"][real[:1]]
        if grad_reason is None:
          grad_batch, grad_reason = _gradient_batch(chunk, target.kind)
      done += int((chunk["mask"].reshape(len(chunk["mask"]), -1) != 0).any(1).sum())
      if progress is not None:
        progress(done)
    if max_examples and done >= max_examples:
      break
  if feature_acc is None:
    raise AnalysisError("the eval split gave no examples to analyse")
  return _Streamed(accs, attn_sums, feature_acc, first, grad_batch, grad_reason)


def run_analysis(
  target: Target,
  batches: Iterable[dict],
  *,
  layers: Sequence[int],
  max_examples: int = 0,
  batch_size: int = 256,
  jacobian_dim: int = 2048,
  progress: Callable[[int], None] | None = None,
) -> dict:
  """Streams ``batches`` through ``target`` and measures geometry and conditioning.

  Zhang & Papyan 2026 (token geometry) and Saratchandran & Lucey 2025 (conditioning);
  each quantity is defined in docs/methods.md, "What the analysis measures".

  Args:
    target: :class:`Target`; batches: eval batches, read once.
    layers: block indices; max_examples: at most this many sequences (0 = all).
    batch_size: sequences per forward pass (host batches cut/padded to it).
    jacobian_dim: Jacobians on the first ``jacobian_dim // D`` tokens (at least 1)
      of the first example; 0 skips them.
    progress: called with the number of sequences done after each chunk.

  Returns:
    JSON-ready dict (non-finite numbers as ``None``): ``kind``, ``num_sequences``,
    ``num_tokens``, ``spectral``, ``gradient_batch`` (``{"loss", "num_sequences"}``
    of the first chunk's real sequences, or ``None``), ``features`` (geometry of what
    the head reads) and ``layers``: per layer the
    :meth:`~laplax.analysis.geometry.GeometryAccumulator.finalize` output,
    ``attention_entropy`` [heads] and ``attention_entropy_uniform`` (nats per query),
    ``attention_self_weight`` [heads], ``attention_head_similarity`` [heads, heads],
    ``attention_head_similarity_mean`` (means over counted queries),
    ``head_smoothing_cosine`` [heads] with ``laplacian_smoothing_cosine`` /
    ``standard_smoothing_cosine``, ``gradient_norms`` (:func:`gradient_norms`, or
    ``None`` with ``gradient_norms_reason``), ``laplacian_alpha`` [heads] (learned
    mix), ``weights`` (:func:`~laplax.analysis.conditioning.kernel_conditioning`
    plus ``effective``) and ``jacobian``.

  Raises:
    AnalysisError: ``batches`` without a real example, layers the model does
      not have, ``batch_size < 1``, a model whose layers differ in heads
      (a Swin: not analysed), or grouped-query attention (fewer key/value
      heads than heads: the per-head sections cut ``W_K, W_V`` into query
      heads). Errors of ``target.loss_fn`` propagate.
  """
  model = target.model
  if len(set(model.spec.layer_heads())) > 1:
    raise AnalysisError(
      f"the analysis takes models with the same heads in every layer; this "
      f"{type(model).__name__}'s layers have {sorted(set(model.spec.layer_heads()))} heads"
    )
  if model.spec.kv_heads != model.spec.num_heads:
    raise AnalysisError(
      f"the analysis takes one key/value head per head; this model has "
      f"model.num_kv_heads={model.spec.kv_heads} for {model.spec.num_heads} heads "
      f"(grouped-query attention is not analysed)"
    )
  if batch_size < 1:
    raise AnalysisError(f"batch_size must be >= 1, got {batch_size}")
  depth = model.spec.depth
  bad = [i for i in layers if not 0 <= i < depth]
  if bad:
    raise AnalysisError(f"layers {bad} do not exist; the model has layers 0..{depth - 1}")
  causal = capture.is_causal(model)
  streamed = _stream(target, batches, tuple(layers), max_examples, batch_size, progress)
  accs, attn_sums, feature_acc = streamed.accs, streamed.attn_sums, streamed.features
  first, grad_batch, grad_reason = streamed.first, streamed.grad_batch, streamed.grad_reason

  io = {}
  if jacobian_dim and layers:
    io = jax.device_get(_jitted_block_io(model, tuple(layers))(target.params, jnp.asarray(first)))
    io = {i: (a[0], b[0]) for i, (a, b) in io.items()}
  grads, gradient = None, None
  if grad_batch is not None:
    loss, grads = jax.device_get(
      jax.jit(jax.value_and_grad(target.loss_fn))(target.params, grad_batch)
    )
    gradient = {"loss": float(loss), "num_sequences": int(len(next(iter(grad_batch.values()))))}
  out_layers = [
    _layer_entry(target, i, accs[i], attn_sums[i], io.get(i), grads, grad_reason, jacobian_dim)
    for i in layers
  ]
  features = feature_acc.finalize(
    classifier=target.classifier, token_classifier=target.token_classifier
  )
  any_acc = accs[layers[0]] if layers else feature_acc
  result = {
    "kind": target.kind,
    "causal": causal,
    "depth": int(depth),
    "num_heads": int(model.spec.num_heads),
    "num_sequences": int(any_acc.num_sequences),
    "num_tokens": int(any_acc.num_tokens),
    "num_classes": int(target.num_classes),
    "vocab_size": int(target.vocab_size),
    "spectral": dict(target.spectral),
    "gradient_batch": gradient,
    "layers": out_layers,
    "features": features,
  }
  return sanitize(result)


def sanitize(tree: Any) -> Any:
  """A JSON-ready copy of nested dicts/lists of numbers and arrays.

  Python numbers and lists, string keys, ``nan``/``inf`` as ``None``.
  """
  if isinstance(tree, dict):
    return {str(k): sanitize(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [sanitize(v) for v in tree]
  if isinstance(tree, np.ndarray):
    return sanitize(tree.tolist())
  if isinstance(tree, (bool, np.bool_)):
    return bool(tree)
  if isinstance(tree, (int, np.integer)):
    return int(tree)
  if isinstance(tree, (float, np.floating)):
    return float(tree) if math.isfinite(tree) else None
  return tree


def write(analysis: dict, workdir: str, path: str | None = None) -> str:
  """Writes ``analysis`` as strict JSON to ``workdir/analysis.json`` (or ``path``).

  Returns the path.

  Raises:
    OSError: cannot be written. ValueError: a non-finite number (use :func:`sanitize`).
  """
  path = path or os.path.join(workdir, ANALYSIS_FILE)
  text = json.dumps(analysis, indent=1, allow_nan=False)
  utils.atomic_write(path, text)  # readers never see half of it
  return path


def read(workdir: str) -> dict:
  """Reads ``workdir/analysis.json``.

  Raises:
    FileNotFoundError: there is none. ValueError: it is not valid JSON.
  """
  with open(os.path.join(workdir, ANALYSIS_FILE)) as f:
    return json.load(f)


def parse_layers(text: str | None, depth: int) -> list[int]:
  """Sorted unique block indices from ``"0,3"`` (``None`` or empty: all ``depth``).

  Negative indices count from the end.

  Raises:
    ValueError: a part that is not an integer, or outside ``-depth..depth-1``.
  """
  if text is None or not str(text).strip():
    return list(range(depth))
  layers = set()
  for part in str(text).split(","):
    part = part.strip()
    try:
      i = int(part)
    except ValueError:
      raise ValueError(
        f"{part!r} is not a layer index; give comma-separated integers such as 0,{depth - 1}"
      ) from None
    if not -depth <= i < depth:
      raise ValueError(f"layer {i} does not exist; the model has layers 0..{depth - 1}")
    layers.add(i % depth)
  return sorted(layers)
