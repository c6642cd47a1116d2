"""The token-geometry and conditioning analysis of a trained model, streamed over a split.

:func:`run_analysis` feeds the eval split once through the model's eval
forward pass (:func:`laplax.analysis.capture.analysis_apply`), streams every
chosen layer's block outputs into a
:class:`~laplax.analysis.geometry.GeometryAccumulator`, sums the attention
entropies, and then measures the projection kernels and the attention
Jacobian of each chosen layer (:mod:`laplax.analysis.conditioning`). The
result is a JSON-ready dict (``eval.py --analysis`` writes it as
``analysis.json``); :func:`summary` reads its main per-layer quantities, which
the plots and ``python -m laplax.analysis.compare`` show.

Memory: the accumulators' (see :mod:`laplax.analysis.geometry`) plus one
chunk of ``batch_size`` sequences of token representations per chosen layer,
whatever the size of the split.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any, Callable, Iterable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import spectral
from laplax.analysis import capture, conditioning, geometry

ANALYSIS_FILE = "analysis.json"


class AnalysisError(ValueError):
  """A user-facing problem with what was asked to be analysed (one line)."""


@dataclasses.dataclass
class Target:
  """What to analyse.

  Attributes:
    model: a ViT (classifier or DINO backbone) or a GPT.
    params: its parameters.
    kind: ``"image"`` (batches ``{"image", "label", "mask" [B]}``) or ``"lm"``
      (batches ``{"tokens" [B, T + 1], "mask" [B, T]}``; next-token classes).
    num_classes: sequence classes for the class statistics (0 = none).
    vocab_size: token classes of an LM (next-token ids; 0 = none).
    classifier: optional float ``[num_classes, D]`` rows of the classifier
      reading the ``features`` (NC3).
    token_classifier: optional float ``[vocab_size, D]`` unembedding (NC3 on
      the LM's final hidden states).
    spectral: ``{"enabled", "lam", "mode", "targets"}`` of the run (the
      correction is measured as a counterfactual when disabled).
  """
  model: nn.Module
  params: Any
  kind: str
  num_classes: int = 0
  vocab_size: int = 0
  classifier: np.ndarray | None = None
  token_classifier: np.ndarray | None = None
  spectral: dict = dataclasses.field(default_factory=lambda: {
      "enabled": False, "lam": 10.0, "mode": spectral.DEFAULT_MODE,
      "targets": spectral.TARGETS})


def _forward(model, layers, causal, params, inputs, mask):
  """Block outputs, attention-entropy sums per chosen layer, and the features."""
  out, inter = capture.analysis_apply(model, params, inputs)
  reps = capture.block_outputs(out, layers)
  length = next(iter(reps.values())).shape[1] if reps else out["encoded"].shape[1]
  qmask = mask if mask.ndim == 2 else jnp.broadcast_to(mask[:, None], (mask.shape[0], length))
  ent = {i: conditioning.attention_entropy(capture.attention_weights(inter, i), qmask,
                                           causal=causal) for i in layers}
  feats = out["pre_logits"][:, None] if "pre_logits" in out else out["encoded"]
  return reps, ent, feats


def _chunks(arrays: dict, size: int):
  """Cuts a batch dict along axis 0 into chunks of ``size``, zero-padding the last."""
  n = len(next(iter(arrays.values())))
  for start in range(0, n, size):
    chunk = {}
    for k, a in arrays.items():
      part = np.asarray(a[start:start + size])
      if len(part) < size:
        pad = np.zeros((size - len(part),) + part.shape[1:], part.dtype)
        part = np.concatenate([part, pad])
      chunk[k] = part
    yield chunk


def _split_batch(batch: dict, kind: str) -> dict:
  if kind == "lm":
    tokens = np.asarray(batch["tokens"])
    return {"inputs": tokens[:, :-1], "token_labels": tokens[:, 1:].astype(np.int32),
            "mask": np.asarray(batch["mask"], np.float32)}
  out = {"inputs": np.asarray(batch["image"]),
         "mask": np.asarray(batch.get("mask", np.ones(len(batch["image"]))), np.float32)}
  if "label" in batch:
    out["labels"] = np.asarray(batch["label"]).astype(np.int32)
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
    return module.apply({"params": params}, y[None], is_causal=causal,
                        laplacian=np.asarray(laplacian))[0]
  return fn


@functools.lru_cache(maxsize=4)
def _head_fn(causal: bool):
  """``(x, wq, wk, wv) -> SpecA(x)`` of one head (cached: one compile per shape)."""
  return functools.partial(conditioning.single_head_attention, causal=causal)


def _jacobian_section(target: Target, layer: int, y: np.ndarray, attn_out: np.ndarray,
                      max_dim: int) -> dict:
  """Jacobians of the attention block at ``y [T, D]``: with respect to the input
  (block and heads) and, per head, with respect to the weights with Theorem
  3.4's bound (:func:`~laplax.analysis.conditioning.head_conditioning`)."""
  model = target.model
  tokens = max(1, min(y.shape[0], max_dim // y.shape[1]))
  y = np.asarray(y[:tokens], np.float32)
  module, kwargs = capture.attention_module(model, layer)
  params = capture.attention_params(target.params, layer)
  apply = _block_fn(module, kwargs["is_causal"], tuple(bool(b) for b in kwargs["laplacian"]))
  section = {"tokens": int(tokens),
             "input": conditioning.jacobian_condition(apply, y, params)}
  if tokens == attn_out.shape[0] or kwargs["is_causal"]:
    # The rebuilt block reproduces the model's attention branch (a causal
    # block's prefix output does not depend on the tokens after it).
    ref = np.asarray(attn_out[:tokens], np.float32)
    diff = np.abs(np.asarray(_jit(apply)(jnp.asarray(y), params)) - ref).max()
    section["block_check"] = float(diff / max(float(np.abs(ref).max()), 1e-30))
  kernels = capture.projection_kernels(target.params, layer)
  heads, sp = model.spec.num_heads, model.spec.attention.spectral
  eff = {}
  for name, w in kernels.items():
    target_name = name[0]  # query -> "q", key -> "k", value -> "v"
    if sp is not None and target_name in sp.targets:  # the effective kernel W + C
      w = w + np.asarray(spectral.correction(
          w.shape, lam=sp.lam, mode=sp.mode, num_heads=heads,
          kernel=w if sp.mode == "svd" else None, target=target_name))
    eff[name] = np.split(w, heads, axis=1)
  causal = capture.is_causal(model)
  per_head = []
  for h in range(heads):
    wq, wk, wv = eff["query"][h], eff["key"][h], eff["value"][h]
    head = conditioning.jacobian_condition(_head_fn(causal), y, wq, wk, wv)
    per_head.append(dict(conditioning.head_conditioning(y, wq, wk, wv, causal=causal),
                         input_condition_number=head["condition_number"]))
  section["heads"] = per_head
  return section


def _weights_section(target: Target, layer: int) -> dict:
  s = target.spectral
  out = {}
  for name, w in capture.projection_kernels(target.params, layer).items():
    res = conditioning.kernel_conditioning(
        w, num_heads=target.model.spec.num_heads, lam=float(s["lam"]), mode=s["mode"],
        target=name[0], targets=s.get("targets", spectral.TARGETS))
    res["effective"] = "corrected" if s["enabled"] else "raw"
    out[name] = res
  return out


def _layer_entry(target: Target, i: int, acc, entropy, entropy_uniform, io,
                 jacobian_dim: int) -> dict:
  """One layer's dict of :func:`run_analysis` (geometry, entropies, weights,
  learned mix, Jacobian when ``io`` holds the block's input and output)."""
  entry = {"layer": int(i)}
  entry.update(acc.finalize())
  entry["attention_entropy"] = np.asarray(entropy).tolist()
  entry["attention_entropy_uniform"] = entropy_uniform
  entry["weights"] = _weights_section(target, i)
  mix = capture.attention_params(target.params, i).get("laplacian_mix")
  if mix is not None:  # model.laplacian_mix="learned": alpha = sigmoid(a) per head
    entry["laplacian_alpha"] = (1.0 / (1.0 + np.exp(-np.asarray(mix, np.float64)))).tolist()
  if io is not None:
    entry["jacobian"] = _jacobian_section(target, i, io[0], io[1], jacobian_dim)
  return entry


def run_analysis(target: Target, batches: Iterable[dict], *, layers: Sequence[int],
                 max_examples: int = 0, batch_size: int = 256,
                 jacobian_dim: int = 2048,
                 progress: Callable[[int], None] | None = None) -> dict:
  """Streams ``batches`` through ``target`` and measures geometry and conditioning.

  Sources: METHODS.md (the geometry of Zhang & Papyan 2026; the conditioning
  of Saratchandran & Lucey 2025); definitions in
  :mod:`laplax.analysis.geometry` and :mod:`laplax.analysis.conditioning`.

  Args:
    target: the model, its parameters and what the data has (:class:`Target`).
    batches: eval batches (see :class:`Target` for their fields); read once.
    layers: block indices to analyse.
    max_examples: stop after this many sequences (0 = all of ``batches``).
    batch_size: sequences per forward pass (host batches are cut/padded to it).
    jacobian_dim: the attention Jacobian is taken on the first ``jacobian_dim
      // D`` tokens (at least 1) of the first example; 0 skips it.
    progress: called with the number of sequences done after each chunk.

  Returns:
    JSON-ready dict: ``kind``, ``num_sequences``, ``num_tokens``, ``spectral``,
    ``layers`` (one dict per chosen layer: ``layer``, the
    :meth:`~laplax.analysis.geometry.GeometryAccumulator.finalize` output,
    ``attention_entropy`` [heads] and ``attention_entropy_uniform`` (nats per
    query), ``laplacian_alpha`` [heads] (with ``model.laplacian_mix=
    "learned"``: the learned ``alpha`` of ``alpha V + (1 - 2 alpha) P V``),
    ``weights`` (per projection, :func:`~laplax.analysis.conditioning.
    kernel_conditioning` plus ``effective``), ``jacobian``), and ``features``
    (the geometry of the representation the head reads: ViT ``pre_logits``
    by class with NC3, GPT final hidden states by next token). Non-finite
    numbers become ``None``.

  Raises:
    AnalysisError: ``batches`` without a real example, layers the model does
      not have, or ``batch_size < 1``.
  """
  model = target.model
  if batch_size < 1:
    raise AnalysisError(f"batch_size must be >= 1, got {batch_size}")
  depth = model.spec.depth
  bad = [i for i in layers if not 0 <= i < depth]
  if bad:
    raise AnalysisError(f"layers {bad} do not exist; the model has layers "
                        f"0..{depth - 1}")
  causal = capture.is_causal(model)
  fwd = _jitted_forward(model, tuple(layers))
  accs, feature_acc = {}, None
  ent_sum, ent_uniform, ent_count = {}, {}, {}
  first = None
  done = 0
  for batch in batches:
    arrays = _split_batch(batch, target.kind)
    if max_examples:
      arrays["mask"], _ = _limit(arrays["mask"], max_examples - done)
    for chunk in _chunks(arrays, batch_size):
      if not chunk["mask"].any():
        continue
      reps, ent, feats = fwd(target.params, chunk["inputs"], chunk["mask"])
      reps, ent, feats = jax.device_get((reps, ent, feats))
      labels = chunk.get("labels") if target.num_classes else None
      token_labels = chunk.get("token_labels") if target.vocab_size else None
      for i in layers:
        if i not in accs:
          accs[i] = geometry.GeometryAccumulator(reps[i].shape[-1], target.num_classes,
                                                 target.vocab_size)
          ent_sum[i], ent_uniform[i], ent_count[i] = 0.0, 0.0, 0.0
        accs[i].update(reps[i], mask=chunk["mask"], labels=labels,
                       token_labels=token_labels)
        ent_sum[i] = ent_sum[i] + np.asarray(ent[i][0], np.float64)
        ent_uniform[i] += float(ent[i][1])
        ent_count[i] += float(ent[i][2])
      if feature_acc is None:
        feature_acc = geometry.GeometryAccumulator(feats.shape[-1], target.num_classes,
                                                   target.vocab_size)
      feature_acc.update(feats, mask=chunk["mask"], labels=labels,
                         token_labels=token_labels)
      if first is None:
        real = np.flatnonzero(chunk["mask"].reshape(len(chunk["mask"]), -1).any(1))
        first = chunk["inputs"][real[:1]]
      done += int((chunk["mask"].reshape(len(chunk["mask"]), -1) != 0).any(1).sum())
      if progress is not None:
        progress(done)
    if max_examples and done >= max_examples:
      break
  if feature_acc is None:
    raise AnalysisError("the eval split gave no examples to analyse")

  io = {}
  if jacobian_dim and layers:
    io = jax.device_get(_jitted_block_io(model, tuple(layers))(target.params,
                                                               jnp.asarray(first)))
    io = {i: (a[0], b[0]) for i, (a, b) in io.items()}
  out_layers = [_layer_entry(target, i, accs[i], ent_sum[i] / max(ent_count[i], 1.0),
                             ent_uniform[i] / max(ent_count[i], 1.0), io.get(i), jacobian_dim)
                for i in layers]
  features = feature_acc.finalize(classifier=target.classifier,
                                  token_classifier=target.token_classifier)
  any_acc = accs[layers[0]] if layers else feature_acc
  result = {"kind": target.kind, "causal": causal, "depth": int(depth),
            "num_heads": int(model.spec.num_heads),
            "num_sequences": int(any_acc.num_sequences),
            "num_tokens": int(any_acc.num_tokens),
            "num_classes": int(target.num_classes), "vocab_size": int(target.vocab_size),
            "spectral": dict(target.spectral), "layers": out_layers,
            "features": features}
  return sanitize(result)


def sanitize(tree: Any) -> Any:
  """A JSON-ready copy of ``tree``.

  Args:
    tree: nested dicts/lists/tuples of numbers, NumPy scalars and arrays.

  Returns:
    The same structure with Python numbers and lists, dict keys as strings,
    and ``nan``/``inf`` as ``None`` (strict JSON has neither).
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


def write(analysis: dict, workdir: str) -> str:
  """Writes ``analysis`` as ``workdir/analysis.json`` (strict JSON, indented).

  Returns:
    The path written.

  Raises:
    OSError: the file cannot be written. ValueError: a non-finite number
      (pass the dict through :func:`sanitize` first).
  """
  path = os.path.join(workdir, ANALYSIS_FILE)
  with open(path, "w") as f:
    json.dump(analysis, f, indent=1, allow_nan=False)
  return path


def read(workdir: str) -> dict:
  """Reads ``workdir/analysis.json``.

  Raises:
    FileNotFoundError: there is none. ValueError: it is not valid JSON.
  """
  with open(os.path.join(workdir, ANALYSIS_FILE)) as f:
    return json.load(f)


# ------------------------------------------------------------------ summaries


def get_path(d: Any, *keys):
  """``d[k0][k1]...``, or ``None`` where a key is missing or a value is ``None``."""
  for k in keys:
    if not isinstance(d, dict) or d.get(k) is None:
      return None
    d = d[k]
  return d


def _kappa(entry: dict, name: str):
  """Worst head's condition number of the effective kernel ``name``."""
  w = get_path(entry, "weights", name)
  if w is None:
    return None
  heads = get_path(w, w.get("effective", "raw"), "head_condition_number")
  if not heads:
    return None
  return None if any(h is None for h in heads) else max(heads)


def _worst_head(entry: dict, *path):
  """Largest value of ``path`` over the heads of ``entry``'s Jacobian section."""
  heads = get_path(entry, "jacobian", "heads")
  if not heads:
    return None
  vals = [get_path(h, *path) for h in heads]
  return None if any(v is None for v in vals) else max(vals)


def _entropy(entry: dict):
  e = entry.get("attention_entropy")
  return float(np.mean(e)) if e else None


# (key, label, extractor of one layer's entry): the main per-layer quantities.
QUANTITIES = (
    ("within_sequence", "within-sequence variance (trace)",
     lambda e: get_path(e, "anova", "within_sequence")),
    ("between_sequence", "between-sequence variance (trace)",
     lambda e: get_path(e, "anova", "between_sequence")),
    ("within_class", "within-class variance (trace)",
     lambda e: get_path(e, "anova", "within_class")),
    ("between_class", "between-class variance (trace)",
     lambda e: get_path(e, "anova", "between_class")),
    ("components_99", "principal components for 99% variance",
     lambda e: e.get("components_99")),
    ("nc1", "NC1 tr(Sigma_W Sigma_B^+)/C", lambda e: get_path(e, "classes", "nc1")),
    ("cdnv", "CDNV (classes; LM: next tokens)",
     lambda e: get_path(e, "classes", "cdnv") if get_path(e, "classes", "cdnv") is not None
     else get_path(e, "token_classes", "cdnv")),
    ("kappa_q", "kappa(W_Q) effective, worst head", lambda e: _kappa(e, "query")),
    ("kappa_k", "kappa(W_K) effective, worst head", lambda e: _kappa(e, "key")),
    ("kappa_v", "kappa(W_V) effective, worst head", lambda e: _kappa(e, "value")),
    ("jacobian", "kappa(block Jacobian w.r.t. input X)",
     lambda e: get_path(e, "jacobian", "input", "condition_number")),
    ("weight_jacobian", "kappa(head Jacobian w.r.t. W_Q,W_K,W_V), unscaled logits, worst",
     lambda e: _worst_head(e, "weight_condition_number_unscaled")),
    ("bound", "Theorem 3.4 bound (unscaled logits), worst head",
     lambda e: _worst_head(e, "theorem_3_4", "bound")),
    ("entropy", "attention entropy, mean over heads (nats)", _entropy),
)


def summary(analysis: dict) -> dict:
  """The main per-layer quantities of an analysis, as aligned lists.

  Args:
    analysis: the dict of :func:`run_analysis` (or read from ``analysis.json``).

  Returns:
    ``{"layer": [layer indices], key: [value per layer, None where missing]}``
    for every key of :data:`QUANTITIES` (variances in squared representation
    units, entropies in nats, the rest dimensionless).
  """
  entries = analysis.get("layers", [])
  out = {"layer": [e["layer"] for e in entries]}
  for key, _, get in QUANTITIES:
    out[key] = [get(e) for e in entries]
  return out


def parse_layers(text: str | None, depth: int) -> list[int]:
  """Block indices from ``"0,3"`` (``None`` or empty: all ``depth`` layers).

  Negative indices count from the end (``-1`` = the last block). The result
  is sorted, without repeats.

  Raises:
    ValueError: a part that is not an integer, or an index outside
      ``-depth..depth-1``.
  """
  if text is None or not str(text).strip():
    return list(range(depth))
  layers = set()
  for part in str(text).split(","):
    part = part.strip()
    try:
      i = int(part)
    except ValueError:
      raise ValueError(f"{part!r} is not a layer index; give comma-separated "
                       f"integers such as 0,{depth - 1}") from None
    if not -depth <= i < depth:
      raise ValueError(f"layer {i} does not exist; the model has layers 0..{depth - 1}")
    layers.add(i % depth)
  return sorted(layers)
