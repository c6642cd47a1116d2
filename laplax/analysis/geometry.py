"""Token geometry of one layer from streamed sufficient statistics.

The measurements of Zhang & Papyan (arXiv 2602.09297) on token representations
``h[s, t]`` (sequence ``s``, token ``t``), defined in docs/methods.md, "Token
geometry" (the tests' NumPy references transcribe them):

* ANOVA of the token covariance, traces per token (``N`` tokens; ``mu_s``, ``mu_G``,
  ``m_c`` the sequence, global and class means)::

    total            = 1/N sum_{s,t} ||h[s,t] - mu_G||^2 = within_seq. + between_seq.
    within_sequence  = 1/N sum_{s,t} ||h[s,t] - mu_s||^2
    between_sequence = 1/N sum_s n_s ||mu_s - mu_G||^2 = within_class + between_class
    within_class     = 1/N sum_s n_s ||mu_s - m_c(s)||^2
    between_class    = 1/N sum_c N_c ||m_c - mu_G||^2

* Neural collapse ``nc1``, ``equinorm``, ``equiangularity``, ``max_angle``, ``nc3``
  (Papyan, Han & Donoho, PNAS 2020, sec. 3) and ``cdnv`` (Galanti, Gyorgy & Hutter,
  ICLR 2022) of sequence means by label, or of tokens by next-token id (Wu & Papyan,
  NeurIPS 2024). Population stds; the pairwise quantities use the
  ``max_pairwise_classes`` most frequent classes.
* Spectral decay: singular values of the centred ``[N, D]`` token matrix,
  ``components_99`` (one PCA of all tokens) and ``components_99_per_sequence``
  (mean over sequences with variance of each one's own count).
* :func:`smoothing_cosine_sums`: per head, the cosine between its contribution to
  the residual stream and the token's deviation from its sequence mean.

:class:`GeometryAccumulator` streams float64 statistics, so the tokens are never
held in memory and the result equals the all-at-once formula up to rounding.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Pseudo-inverse of Sigma_B: eigenvalues below this fraction of the largest are zero.
PINV_RTOL = 1e-10


def _scatter_add(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
  """``target[index[i]] += values[i]`` for repeated indices (sort + reduceat)."""
  if index.size == 0:
    return
  order = np.argsort(index, kind="stable")
  idx = index[order]
  starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
  target[idx[starts]] += np.add.reduceat(values[order], starts, axis=0)


def singular_values(scatter: np.ndarray) -> np.ndarray:
  """Singular values of a centred matrix ``X_c`` from its scatter ``X_c^T X_c``.

  ``scatter`` float ``[D, D]`` (PSD). Returns float64 ``[D]``, descending (negative
  rounding noise clipped to 0).
  """
  eig = np.linalg.eigvalsh(np.asarray(scatter, np.float64))[::-1]
  return np.sqrt(np.clip(eig, 0.0, None))


def components_for(singular: np.ndarray, threshold: float = 0.99) -> int:
  """The smallest ``k`` with ``sum_{i<k} s_i^2 / sum_i s_i^2 >= threshold``.

  ``singular`` float ``[D]`` descending; 0 when all are 0.

  Raises:
    ValueError: ``threshold`` outside ``(0, 1]``.
  """
  if not 0.0 < threshold <= 1.0:
    raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
  var = np.asarray(singular, np.float64) ** 2
  total = var.sum()
  if total <= 0.0:
    return 0
  cum = np.cumsum(var) / total
  return int(min(np.searchsorted(cum, threshold) + 1, len(var)))


def sequence_components(tokens: np.ndarray, threshold: float = 0.99) -> int | None:
  """:func:`components_for` of one sequence's own PCA, ``tokens`` float ``[n, D]``.

  None when ``tokens - tokens.mean(0)`` has no variance; eigenvalues from the smaller
  Gram matrix (``[n, n]`` or ``[D, D]``).
  """
  x = np.asarray(tokens, np.float64)
  x = x - x.mean(0)
  gram = x @ x.T if x.shape[0] < x.shape[1] else x.T @ x
  sv = singular_values(gram)
  if not np.any(sv > 0.0):
    return None
  return components_for(sv, threshold)


def _nc1(sigma_w: np.ndarray, sigma_b: np.ndarray, num: int) -> float:
  """NC1 = tr(Sigma_W Sigma_B^+) / C, with Sigma_B^+ of rank <= C - 1
  (eigenvalues below ``PINV_RTOL`` of the largest dropped; ``inf`` when
  Sigma_B vanishes)."""
  eig, vec = np.linalg.eigh(sigma_b)
  eig, vec = eig[::-1], vec[:, ::-1]
  keep = eig > PINV_RTOL * max(eig[0], 0.0)
  keep[num - 1 :] = False
  if eig[0] <= 0.0 or not keep.any():
    return float("inf")
  v = vec[:, keep]
  return float(np.sum(np.einsum("di,de,ei->i", v, sigma_w, v) / eig[keep]) / num)


def class_statistics(
  count, sums, sq_norms, second_moment, *, classifier=None, max_pairwise_classes: int = 2048
) -> dict:
  """Neural-collapse quantities and CDNV from per-class sufficient statistics.

  Definitions in the module docstring; any common shift of the ``x_i`` leaves every
  output unchanged.

  Args:
    count: int ``[C]`` examples per class (classes with 0 are absent).
    sums: float ``[C, D]`` ``sum_{i: y_i = c} x_i``.
    sq_norms: float ``[C]`` ``sum_{i: y_i = c} ||x_i||^2``.
    second_moment: float ``[D, D]`` ``sum_i x_i x_i^T``.
    classifier: optional float ``[C, D]`` rows (``logits = x W^T``) for ``nc3``.
    max_pairwise_classes: most frequent classes the pairwise quantities use (ties:
      lower id first).

  Returns:
    Python numbers: ``num_classes``, ``num_examples``, ``nc1``, ``equinorm``,
    ``equiangularity``, ``max_angle``, ``cdnv``, ``pairwise_classes``,
    ``cdnv_classes``, ``nc3`` (with ``classifier``), ``sigma_w_trace``,
    ``sigma_b_trace``; ``nan`` where two classes are needed and absent.

  Raises:
    ValueError: inconsistent shapes or ``max_pairwise_classes < 2``.
  """
  count = np.asarray(count, np.int64)
  sums = np.asarray(sums, np.float64)
  sq_norms = np.asarray(sq_norms, np.float64)
  second_moment = np.asarray(second_moment, np.float64)
  c_all, d = sums.shape
  if count.shape != (c_all,) or sq_norms.shape != (c_all,) or second_moment.shape != (d, d):
    raise ValueError(
      f"inconsistent class statistics: count {count.shape}, sums "
      f"{sums.shape}, sq_norms {sq_norms.shape}, second moment "
      f"{second_moment.shape}"
    )
  if max_pairwise_classes < 2:
    raise ValueError(f"max_pairwise_classes must be >= 2, got {max_pairwise_classes}")
  present = np.flatnonzero(count > 0)
  n_c = count[present].astype(np.float64)
  n = float(n_c.sum())
  num = len(present)
  out: dict[str, Any] = {"num_classes": num, "num_examples": int(n)}
  nan = float("nan")
  if num == 0:
    return out
  means = sums[present] / n_c[:, None]  # M_c
  global_mean = sums[present].sum(0) / n  # M_G
  centred = means - global_mean  # [C, D]
  sigma_w = (second_moment - (means * n_c[:, None]).T @ means) / n
  sigma_w = (sigma_w + sigma_w.T) / 2
  sigma_b = centred.T @ centred / num
  out["sigma_w_trace"] = float(np.trace(sigma_w))
  out["sigma_b_trace"] = float(np.trace(sigma_b))
  norms = np.linalg.norm(centred, axis=1)
  if num < 2:
    out.update(
      nc1=nan,
      equinorm=nan,
      equiangularity=nan,
      max_angle=nan,
      cdnv=nan,
      pairwise_classes=num,
      cdnv_classes=0,
    )
    return out

  out["nc1"] = _nc1(sigma_w, sigma_b, num)
  mean_norm = norms.mean()
  out["equinorm"] = float(norms.std() / mean_norm) if mean_norm > 0 else nan

  # Pairwise quantities on the most frequent classes.
  order = np.lexsort((present, -count[present]))[:max_pairwise_classes]
  order = np.sort(order)
  k = len(order)
  out["pairwise_classes"] = k
  unit = centred[order] / np.maximum(norms[order], 1e-300)[:, None]
  cos = unit @ unit.T
  off = ~np.eye(k, dtype=bool)
  out["equiangularity"] = float(cos[off].std())
  out["max_angle"] = float(np.abs(cos[off] + 1.0 / (num - 1)).mean())

  # CDNV over classes with >= 2 examples.
  # s_c^2 = mean ||x_i||^2 - ||M_c||^2 (shift-invariant; rounding clipped at 0).
  var = np.clip(sq_norms[present] / n_c - np.sum(means**2, axis=1), 0.0, None)
  sel = order[count[present][order] >= 2]
  out["cdnv_classes"] = int(len(sel))
  if len(sel) >= 2:
    m = centred[sel]
    sq = np.sum(m**2, axis=1)
    dist = np.clip(sq[:, None] + sq[None, :] - 2.0 * (m @ m.T), 0.0, None)
    upper = np.triu_indices(len(sel), 1)
    num_var = (var[sel][:, None] + var[sel][None, :])[upper] / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
      ratio = num_var / dist[upper]
    out["cdnv"] = float(np.mean(ratio))
  else:
    out["cdnv"] = nan

  if classifier is not None:
    w = np.asarray(classifier, np.float64)
    if w.shape != (c_all, d):
      raise ValueError(f"classifier must be [{c_all}, {d}] (classes x dim), got {w.shape}")
    w = w[present]
    m_norm, w_norm = np.linalg.norm(centred), np.linalg.norm(w)
    if m_norm > 0 and w_norm > 0:
      out["nc3"] = float(np.sum((centred / m_norm - w / w_norm) ** 2))
    else:
      out["nc3"] = nan
  return out


class GeometryAccumulator:
  """Streams token representations of one layer into float64 sufficient statistics.

  Statistics are of ``h - shift`` (the first batch's mean token) to keep the sums
  accurate. Memory in float64 words: ``D^2 + 2 D``, plus ``D^2 + C (2 D + 3)`` with
  ``num_classes = C``, plus ``V (D + 2)`` with ``num_token_classes = V`` (ViT-B with
  1000 classes: 22 MB per layer; a GPT with next-token classes: 314 MB).

  Args:
    dim: ``D``, the representation width.
    num_classes: sequence classes (0 = no sequence labels).
    num_token_classes: token classes, e.g. the vocabulary (0 = none).
    threshold: explained-variance fraction of the per-sequence counts.

  Raises:
    ValueError: ``dim < 1`` or negative class counts.
  """

  def __init__(
    self, dim: int, num_classes: int = 0, num_token_classes: int = 0, threshold: float = 0.99
  ):
    if dim < 1 or num_classes < 0 or num_token_classes < 0:
      raise ValueError(
        f"need dim >= 1 and class counts >= 0, got dim={dim}, "
        f"num_classes={num_classes}, num_token_classes={num_token_classes}"
      )
    self.dim, self.num_classes, self.num_token_classes = dim, num_classes, num_token_classes
    self.shift = None
    self.num_tokens = 0
    self.num_sequences = 0
    self.threshold = threshold
    self.sequence_components = []  # per sequence with variance
    self.token_sum = np.zeros(dim)  # sum_t h
    self.token_scatter = np.zeros((dim, dim))  # sum_t h h^T
    self.seq_weighted_sq = 0.0  # sum_s n_s ||mu_s||^2
    if num_classes:
      self.class_tokens = np.zeros(num_classes, np.int64)  # N_c
      self.class_token_sum = np.zeros((num_classes, dim))  # sum of tokens of class c
      self.class_count = np.zeros(num_classes, np.int64)  # sequences of class c
      self.class_sum = np.zeros((num_classes, dim))  # sum of mu_s of class c
      self.class_sq = np.zeros(num_classes)  # sum of ||mu_s||^2
      self.seq_second = np.zeros((dim, dim))  # sum_s mu_s mu_s^T
    if num_token_classes:
      self.tclass_count = np.zeros(num_token_classes, np.int64)
      self.tclass_sum = np.zeros((num_token_classes, dim))
      self.tclass_sq = np.zeros(num_token_classes)

  def update(self, tokens, *, mask=None, labels=None, token_labels=None) -> None:
    """Adds one batch.

    Args:
      tokens: float ``[batch, length, D]`` (NumPy or JAX; converted to float64).
      mask: optional ``[batch]`` or ``[batch, length]``; nonzero = use.
      labels: int ``[batch]`` in ``[0, num_classes)``; required iff ``num_classes > 0``.
      token_labels: int ``[batch, length]`` in ``[0, num_token_classes)``; required iff
        ``num_token_classes > 0``.

    Raises:
      ValueError: wrong shapes, missing, unexpected or out-of-range labels, or
        non-finite tokens.
    """
    x = np.asarray(tokens, np.float64)
    if x.ndim != 3 or x.shape[-1] != self.dim:
      raise ValueError(f"tokens must be [batch, length, {self.dim}], got {x.shape}")
    b, t, _ = x.shape
    if mask is None:
      m = np.ones((b, t), bool)
    else:
      m = np.asarray(mask)
      if m.shape == (b,):
        m = np.repeat(m[:, None], t, axis=1)
      if m.shape != (b, t):
        raise ValueError(f"mask must be [{b}] or [{b}, {t}], got {np.shape(mask)}")
      m = m != 0
    if (labels is None) != (self.num_classes == 0):
      raise ValueError(
        f"labels are required exactly when num_classes > 0 (num_classes={self.num_classes})"
      )
    if (token_labels is None) != (self.num_token_classes == 0):
      raise ValueError(
        "token_labels are required exactly when num_token_classes > 0 "
        f"(num_token_classes={self.num_token_classes})"
      )
    n_s = m.sum(1)
    keep = n_s > 0
    if not keep.any():
      return
    x, m, n_s = x[keep], m[keep], n_s[keep].astype(np.float64)
    flat = x[m]  # [n, D]
    if not np.all(np.isfinite(flat)):
      raise ValueError("tokens contain NaN or inf")
    if self.shift is None:
      self.shift = flat.mean(0)
    flat = flat - self.shift
    seq_mean = (np.where(m[..., None], x, 0.0).sum(1) / n_s[:, None]) - self.shift
    self.num_tokens += flat.shape[0]
    self.num_sequences += int(keep.sum())
    self.token_sum += flat.sum(0)
    self.token_scatter += flat.T @ flat
    self.seq_weighted_sq += float(np.sum(n_s * np.sum(seq_mean**2, axis=1)))
    for row, used in zip(x, m):
      k = sequence_components(row[used], self.threshold)
      if k is not None:
        self.sequence_components.append(k)
    if self.num_classes:
      y = np.asarray(labels)
      if y.shape != (b,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers of shape ({b},), got {y.dtype} {y.shape}")
      y = y[keep].astype(np.int64)
      if y.size and (y.min() < 0 or y.max() >= self.num_classes):
        raise ValueError(f"labels must lie in [0, {self.num_classes}), got [{y.min()}, {y.max()}]")
      np.add.at(self.class_tokens, y, n_s.astype(np.int64))
      _scatter_add(self.class_token_sum, y, seq_mean * n_s[:, None])
      np.add.at(self.class_count, y, 1)
      _scatter_add(self.class_sum, y, seq_mean)
      _scatter_add(self.class_sq, y, np.sum(seq_mean**2, axis=1))
      self.seq_second += seq_mean.T @ seq_mean
    if self.num_token_classes:
      z = np.asarray(token_labels)
      if z.shape != (b, t) or not np.issubdtype(z.dtype, np.integer):
        raise ValueError(
          f"token_labels must be integers of shape ({b}, {t}), got {z.dtype} {z.shape}"
        )
      z = z[keep][m].astype(np.int64)
      if z.size and (z.min() < 0 or z.max() >= self.num_token_classes):
        raise ValueError(
          f"token_labels must lie in [0, {self.num_token_classes}), got [{z.min()}, {z.max()}]"
        )
      np.add.at(self.tclass_count, z, 1)
      _scatter_add(self.tclass_sum, z, flat)
      _scatter_add(self.tclass_sq, z, np.sum(flat**2, axis=1))

  def finalize(
    self,
    *,
    classifier=None,
    token_classifier=None,
    threshold: float = 0.99,
    max_pairwise_classes: int = 2048,
  ) -> dict:
    """The geometry of everything added so far.

    Args:
      classifier: optional float ``[num_classes, D]`` rows for NC3 on sequence means.
      token_classifier: optional float ``[num_token_classes, D]`` (e.g. the unembedding).
      threshold: explained-variance fraction of ``components_99``.
      max_pairwise_classes: see :func:`class_statistics`.

    Returns:
      Python numbers and lists: ``num_tokens``, ``num_sequences``, ``anova`` (traces in
      squared units of the representation, per token), ``singular_values`` ``[D]``,
      ``components_99``, ``components_99_per_sequence`` (None without variance),
      ``sequences_with_variance``, ``fractions`` (``anova / total``), and
      ``classes`` / ``token_classes`` (:func:`class_statistics`).

    Raises:
      ValueError: nothing was added.
    """
    if self.num_tokens == 0:
      raise ValueError("no tokens were added; call update() with at least one token")
    n = float(self.num_tokens)
    sum_sq = float(np.trace(self.token_scatter))  # sum ||h||^2
    mean = self.token_sum / n
    mean_sq = n * float(mean @ mean)  # N ||mu_G||^2
    anova = {
      "total": (sum_sq - mean_sq) / n,
      "within_sequence": (sum_sq - self.seq_weighted_sq) / n,
      "between_sequence": (self.seq_weighted_sq - mean_sq) / n,
    }
    out: dict[str, Any] = {
      "num_tokens": int(self.num_tokens),
      "num_sequences": int(self.num_sequences),
      "anova": anova,
    }
    scatter = self.token_scatter - n * np.outer(mean, mean)
    sv = singular_values((scatter + scatter.T) / 2)
    out["singular_values"] = sv.tolist()
    out["components_99"] = components_for(sv, threshold)
    per_seq = self.sequence_components
    out["components_99_per_sequence"] = float(np.mean(per_seq)) if per_seq else None
    out["sequences_with_variance"] = len(per_seq)
    if self.num_classes:
      present = self.class_tokens > 0
      class_mean = self.class_token_sum[present] / self.class_tokens[present, None]
      class_sq = float(np.sum(self.class_tokens[present] * np.sum(class_mean**2, axis=1)))
      anova["within_class"] = (self.seq_weighted_sq - class_sq) / n
      anova["between_class"] = (class_sq - mean_sq) / n
      out["classes"] = class_statistics(
        self.class_count,
        self.class_sum,
        self.class_sq,
        self.seq_second,
        classifier=classifier,
        max_pairwise_classes=max_pairwise_classes,
      )
    total = anova["total"]
    out["fractions"] = {
      k: (v / total if total > 0 else None) for k, v in anova.items() if k != "total"
    }
    if self.num_token_classes:
      out["token_classes"] = class_statistics(
        self.tclass_count,
        self.tclass_sum,
        self.tclass_sq,
        self.token_scatter,
        classifier=token_classifier,
        max_pairwise_classes=max_pairwise_classes,
      )
    return out


def smoothing_cosine_sums(
  head_outputs: jax.Array, out_kernel: jax.Array, residual: jax.Array, mask: jax.Array
):
  """Per-head sums of ``cos(c_h[s,t], x[s,t] - mu_s)``, jittable.

  ``c_h = o_h W_h`` is not formed (``<c_h, d> = <o_h, d W_h^T>``); float32. Tokens
  where either vector is zero are not counted for that head.

  Args:
    head_outputs: float ``[batch, T, heads, head_dim]`` (sown ``"head_outputs"``).
    out_kernel: float ``[heads, head_dim, D]``, ``W_O``'s rows times LayerScale's
      ``gamma``.
    residual: float ``[batch, T, D]``, the block input ``x``.
    mask: ``[batch, T]``; nonzero = a real token.

  Returns:
    ``(cosine_sum [heads], count [heads])`` float32 (mean in ``[-1, 1]``).

  Raises:
    ValueError: shapes that do not fit together.
  """
  o = jnp.asarray(head_outputs, jnp.float32)
  w = jnp.asarray(out_kernel, jnp.float32)
  x = jnp.asarray(residual, jnp.float32)
  m = jnp.asarray(mask, jnp.float32)
  if (
    o.ndim != 4
    or w.ndim != 3
    or x.ndim != 3
    or o.shape[2:] != w.shape[:2]
    or w.shape[2] != x.shape[2]
    or o.shape[:2] != x.shape[:2]
    or m.shape != x.shape[:2]
  ):
    raise ValueError(
      f"head_outputs [B, T, H, d], out_kernel [H, d, D], residual [B, T, D] "
      f"and mask [B, T] do not fit: {o.shape}, {w.shape}, {x.shape}, {m.shape}"
    )
  n = jnp.maximum(m.sum(1, keepdims=True), 1.0)
  mean = (x * m[..., None]).sum(1, keepdims=True) / n[..., None]
  dev = x - mean  # [B, T, D]
  dot = jnp.einsum("bthd,bthd->bth", o, jnp.einsum("btD,hdD->bthd", dev, w))
  gram = jnp.einsum("hdD,heD->hde", w, w)
  c_norm2 = jnp.einsum("bthd,hde,bthe->bth", o, gram, o)
  d_norm2 = jnp.sum(dev * dev, -1)[..., None]  # [B, T, 1]
  tiny = jnp.finfo(jnp.float32).tiny
  valid = (c_norm2 > tiny) & (d_norm2 > tiny) & (m[..., None] != 0)
  cos = jnp.where(
    valid, jnp.clip(dot / jnp.sqrt(jnp.where(valid, c_norm2 * d_norm2, 1.0)), -1.0, 1.0), 0.0
  )
  return cos.sum((0, 1)), valid.astype(jnp.float32).sum((0, 1))
