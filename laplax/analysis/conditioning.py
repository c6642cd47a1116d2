"""Conditioning of attention: projection kernels, the attention Jacobian, Theorem 3.4.

The measurements of Saratchandran & Lucey ("Spectral Conditioning of Attention
Improves Transformer Performance", NeurIPS 2025, arXiv 2603.07162); the correction
``C`` is :func:`laplax.spectral.correction`. Definitions, how Theorem 3.4's terms are
read and when its bound fails (``T > D``, saturated heads): docs/methods.md,
"The theorem laplax measures" and "Conditioning and saturation". Condition numbers
are ``inf`` where the smallest singular value is 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from laplax import spectral
from laplax.kernels import causal_mask

# Eigenvalues of the softmax Jacobian below this fraction of the largest count as 0.
NULL_RTOL = 1e-12


def _condition(s: np.ndarray) -> float:
  """``s[0] / s[-1]`` of descending singular values (``inf`` if ``s[-1] == 0``)."""
  s = np.asarray(s, np.float64)
  return float(s[0] / s[-1]) if s[-1] > 0 else float("inf")


def _singular(matrix) -> np.ndarray:
  return np.linalg.svd(np.asarray(matrix, np.float64), compute_uv=False)


def kernel_conditioning(
  kernel,
  *,
  num_heads: int = 1,
  lam: float | None = None,
  mode: str = spectral.DEFAULT_MODE,
  target: str = "q",
  targets: str = spectral.TARGETS,
) -> dict:
  """Condition numbers and extreme singular values of ``W`` and of ``W + C``.

  Whole kernel and each head's ``[D, d_head]`` block: ``"per_head"`` conditions only
  the blocks, ``"full"`` both.

  Args:
    kernel: float ``[D, num_heads * d_head]`` projection kernel ``W``.
    num_heads: column blocks (heads).
    lam: ``lambda`` of the ``lambda * I_k`` correction (Theorem 3.8); with ``None``
      and a mode other than ``"svd"`` only ``raw`` is returned.
    mode: one of :data:`laplax.spectral.MODES`, as in :func:`laplax.spectral.correction`.
    target: which projection ``kernel`` is (``"q"``, ``"k"``, ``"v"``).
    targets: the projections the correction applies to; outside them ``C = 0``.

  Returns:
    ``{"raw", "corrected"}``, each ``{"condition_number", "min_singular_value",
    "max_singular_value", "head_condition_number": [H], "head_min_singular_value":
    [H]}`` (Python floats).

  Raises:
    ValueError: a kernel that is not 2-D, ``num_heads`` not dividing its columns, or
      an unknown mode.
  """
  if mode not in spectral.MODES:
    raise ValueError(f"spectral mode {mode!r} is unknown; use one of {', '.join(spectral.MODES)}")
  w = np.asarray(kernel, np.float32)
  if w.ndim != 2 or num_heads < 1 or w.shape[1] % num_heads:
    raise ValueError(
      f"kernel must be 2-D with columns divisible by num_heads={num_heads}, got shape {w.shape}"
    )

  def stats(m):
    s = _singular(m)
    heads = [_singular(b) for b in np.split(np.asarray(m), num_heads, axis=1)]
    return {
      "condition_number": _condition(s),
      "min_singular_value": float(s[-1]),
      "max_singular_value": float(s[0]),
      "head_condition_number": [_condition(h) for h in heads],
      "head_min_singular_value": [float(h[-1]) for h in heads],
    }

  out = {"raw": stats(w)}
  if lam is not None or mode == "svd":
    if target not in targets:
      out["corrected"] = out["raw"]
    else:
      c = spectral.correction(
        w.shape,
        lam=0.0 if lam is None else lam,
        mode=mode,
        num_heads=num_heads,
        kernel=w if mode == "svd" else None,
        target=target,
      )
      out["corrected"] = stats(w + np.asarray(c))  # = spectral.conditioned(w)
  return out


def jacobian_matrix(fn: Callable[..., jax.Array], x, *args) -> np.ndarray:
  """The Jacobian ``d vec(fn(x, *args)) / d vec(x)``, float64 ``[out.size, x.size]``.

  Row-major ``vec``, from ``jax.jacfwd`` (compiled once per function and shapes: pass
  weights in ``args`` rather than closing over them).
  """
  x = jnp.asarray(x, jnp.float32)
  jac = _jacfwd(fn)(x, *args)
  return np.asarray(jac, np.float64).reshape(-1, x.size)


@functools.lru_cache(maxsize=64)
def _jacfwd(fn):
  return jax.jit(jax.jacfwd(fn))


def jacobian_condition(fn: Callable[..., jax.Array], x, *args) -> dict:
  """Condition number of the Jacobian of ``fn`` in its first argument at ``x``.

  Returns:
    ``{"condition_number", "sigma_max", "sigma_min", "numerical_rank", "shape"}``
    over the ``min(rows, cols)`` singular values of :func:`jacobian_matrix`. It is
    computed in float32: ``numerical_rank`` counts singular values above
    ``max(shape) * eps_float32 * sigma_max``; beyond about ``1e7`` the Jacobian is
    numerically singular (e.g. a causal Laplacian head at token 0).
  """
  return _matrix_condition(jacobian_matrix(fn, x, *args), float(np.finfo(np.float32).eps))


def attention_probs(x, wq, wk, *, causal: bool = False, scale: float | None = None):
  """``P = softmax(X W_Q (X W_K)^T * scale + causal mask)``, float32 ``[T, T]``.

  ``x`` float ``[T, D]``; ``wq, wk`` ``[D, d]``; ``scale`` default ``1/sqrt(d)``.
  """
  x = jnp.asarray(x, jnp.float32)
  scale = wq.shape[-1] ** -0.5 if scale is None else scale
  logits = (x @ wq) @ (x @ wk).T * scale
  if causal:
    t = x.shape[0]
    logits = jnp.where(causal_mask(t, t, xp=jnp), logits, -jnp.inf)
  return jax.nn.softmax(logits, axis=-1)


def single_head_attention(
  x, wq, wk, wv, *, causal: bool = False, scale: float | None = None
) -> jax.Array:
  """One head of ``SpecA(X) = softmax(X W_Q W_K^T X^T / sqrt(d)) X W_V`` (Saratchandran & Lucey 2025, Sec. 2).

  Theorem 3.4's object (no bias, norm or output projection); pass ``W + C`` for the
  conditioned head. ``x`` float ``[T, D]``; ``wq, wk`` ``[D, d]``; ``wv`` ``[D, d_v]``;
  ``scale`` default ``1 / sqrt(d)``. Returns float32 ``[T, d_v]``.
  """
  return attention_probs(x, wq, wk, causal=causal, scale=scale) @ (jnp.asarray(x, jnp.float32) @ wv)


def softmax_jacobian_condition(probs) -> float:
  """``kappa(L)`` of ``L = blockdiag_t(Diag(p_t) - p_t p_t^T)`` on its range.

  Largest over smallest nonzero eigenvalue (relative threshold :data:`NULL_RTOL`)
  of ``probs`` float ``[T, T]`` (rows sum to 1); ``L 1 = 0``. Returns a float
  (``inf`` if every eigenvalue is 0, e.g. one-hot rows).
  """
  p = np.asarray(probs, np.float64)
  eig = np.concatenate([np.linalg.eigvalsh(np.diag(r) - np.outer(r, r)) for r in p])
  top = eig.max()
  nonzero = eig[eig > NULL_RTOL * top] if top > 0 else eig[:0]
  return float(top / nonzero.min()) if nonzero.size else float("inf")


def theorem_3_4_bound(x, wq, wk, wv, *, causal: bool = False, scale: float | None = None) -> dict:
  """Theorem 3.4's upper bound on ``kappa`` of one head's weight Jacobian.

  ``kappa(X)^3 kappa(L) kappa(W_V) (kappa(W_Q) + kappa(W_K)) + kappa(X) kappa(softmax)``
  (Saratchandran & Lucey 2025), ``P`` from :func:`attention_probs`. Arguments as in
  :func:`single_head_attention` (effective kernels of one head). Returns Python
  floats: ``bound``, ``kappa_x``, ``kappa_l``, ``kappa_softmax``, ``kappa_wq``,
  ``kappa_wk``, ``kappa_wv``.
  """
  x, wq, wk, wv = (np.asarray(a, np.float64) for a in (x, wq, wk, wv))
  scale = wq.shape[-1] ** -0.5 if scale is None else scale
  p = _softmax_rows(x, wq, wk, causal, scale)
  terms = {
    "kappa_x": _condition(_singular(x)),
    "kappa_l": softmax_jacobian_condition(p),
    "kappa_softmax": _condition(_singular(p)),
    "kappa_wq": _condition(_singular(wq)),
    "kappa_wk": _condition(_singular(wk)),
    "kappa_wv": _condition(_singular(wv)),
  }
  with np.errstate(over="ignore", invalid="ignore"):
    bound = (
      terms["kappa_x"] ** 3
      * terms["kappa_l"]
      * terms["kappa_wv"]
      * (terms["kappa_wq"] + terms["kappa_wk"])
      + terms["kappa_x"] * terms["kappa_softmax"]
    )
  return dict(terms, bound=float(bound))


def weight_jacobian_matrix(
  x, wq, wk, wv, *, causal: bool = False, scale: float | None = None
) -> np.ndarray:
  """The Jacobian of ``A = P X W_V`` with respect to ``(W_Q, W_K, W_V)``, float64.

  Theorem 3.4's object, ``P = softmax(scale * X W_Q W_K^T X^T)`` (causal mask
  optional), closed form with ``L_t = Diag(p_t) - p_t p_t^T``::

      dA_tc / dW_V[a, b] = (P X)_ta delta_cb
      dA_tc / dW_Q[a, b] = scale X_ta (V^T L_t K)_cb
      dA_tc / dW_K[a, b] = scale Q_tb (V^T L_t X)_ca

  ``x`` float ``[T, D]``; ``wq, wk`` ``[D, d]``; ``wv`` ``[D, d_v]``; ``scale``
  default ``1 / sqrt(d)`` (the paper has 1). Returns float64 ``[T * d_v, 2 D d + D
  d_v]``: rows ``vec(A)``, columns ``[vec(W_Q) | vec(W_K) | vec(W_V)]`` (row-major).
  """
  x, wq, wk, wv = (np.asarray(a, np.float64) for a in (x, wq, wk, wv))
  t, dim = x.shape
  d, dv = wq.shape[1], wv.shape[1]
  scale = d**-0.5 if scale is None else scale
  p = _softmax_rows(x, wq, wk, causal, scale)
  q, k, v = x @ wq, x @ wk, x @ wv
  lap = np.einsum("tu,uw->tuw", p, np.eye(t)) - np.einsum("tu,tw->tuw", p, p)
  g = np.einsum("uc,tuw->tcw", v, lap)  # V^T L_t, [T, d_v, T]
  jq = scale * np.einsum("ta,tcb->tcab", x, g @ k).reshape(t * dv, dim * d)
  jk = scale * np.einsum("tb,tca->tcab", q, g @ x).reshape(t * dv, dim * d)
  jv = np.einsum("ta,cb->tcab", p @ x, np.eye(dv)).reshape(t * dv, dim * dv)
  return np.concatenate([jq, jk, jv], axis=1)


def _matrix_condition(j: np.ndarray, eps: float) -> dict:
  """Condition number and rank of a Jacobian matrix (``eps``: its precision)."""
  s = _singular(j)
  tol = max(j.shape) * eps * s[0]
  return {
    "condition_number": _condition(s),
    "sigma_max": float(s[0]),
    "sigma_min": float(s[-1]),
    "numerical_rank": int(np.sum(s > tol)),
    "shape": list(j.shape),
  }


def weight_jacobian_condition(
  x, wq, wk, wv, *, causal: bool = False, scale: float | None = None
) -> dict:
  """Condition number of :func:`weight_jacobian_matrix` (Theorem 3.4's quantity).

  Returns ``{"condition_number", "sigma_max", "sigma_min", "numerical_rank",
  "shape"}`` (float64; ``numerical_rank < min(shape)`` means numerically singular,
  e.g. ``T > D``).
  """
  return _matrix_condition(
    weight_jacobian_matrix(x, wq, wk, wv, causal=causal, scale=scale),
    float(np.finfo(np.float64).eps),
  )


def _softmax_rows(x, wq, wk, causal, scale):
  logits = (x @ wq) @ (x @ wk).T * scale
  if causal:
    logits = np.where(causal_mask(len(x), len(x)), logits, -np.inf)
  p = np.exp(logits - logits.max(1, keepdims=True))
  return p / p.sum(1, keepdims=True)


def head_conditioning(x, wq, wk, wv, *, causal: bool = False) -> dict:
  """Theorem 3.4 for one head, as stated (unscaled logits) and with laplax's ``1/sqrt(d)``.

  ``x`` float ``[T, D]``; ``wq, wk`` ``[D, d]``; ``wv`` ``[D, d_v]`` (``W + C``).
  Returns Python floats: ``weight_condition_number`` (laplax's head),
  ``weight_condition_number_unscaled``, ``theorem_3_4`` (its bound),
  ``bound_holds``, ``theorem_3_4_scaled_logits``, ``weight_numerical_rank``,
  ``weight_jacobian_shape``. The scale moves the condition number by at most
  ``sqrt(d)`` (docs/methods.md).
  """
  d = np.shape(wq)[1]
  scaled = weight_jacobian_condition(x, wq, wk, wv, causal=causal)
  unscaled = weight_jacobian_condition(x, wq, wk, wv, causal=causal, scale=1.0)
  bound = theorem_3_4_bound(x, wq, wk, wv, causal=causal, scale=1.0)
  bound_scaled = theorem_3_4_bound(x, wq, wk, wv, causal=causal, scale=d**-0.5)
  return {
    "weight_condition_number": scaled["condition_number"],
    "weight_condition_number_unscaled": unscaled["condition_number"],
    "weight_numerical_rank": unscaled["numerical_rank"],
    "weight_jacobian_shape": unscaled["shape"],
    "theorem_3_4": bound,
    "bound_holds": bool(bound["bound"] >= unscaled["condition_number"]),
    "theorem_3_4_scaled_logits": bound_scaled,
  }


def attention_entropy(
  weights: jax.Array, query_mask: jax.Array | None = None, *, causal: bool = False
):
  """Per-head sums of attention entropies, jittable (divide by ``count``).

  Args:
    weights: float ``[batch, heads, T_q, T_k]`` attention matrices (rows sum to 1).
    query_mask: optional ``[batch, T_q]``; nonzero = count this query.
    causal: query ``t`` sees keys ``0..t`` (for ``uniform``).

  Returns:
    ``(entropy [heads], uniform, count)`` float32: summed ``-sum_j p_j log p_j``
    (nats), the same for uniform attention over the visible keys (the maximum),
    and the number of counted queries.
  """
  p = weights.astype(jnp.float32)
  ent = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), -1)
  b, _, tq, tk = p.shape
  mask = (
    jnp.ones((b, tq), jnp.float32)
    if query_mask is None
    else (jnp.asarray(query_mask) != 0).astype(jnp.float32)
  )
  if causal:
    visible = jnp.arange(tq, dtype=jnp.float32) + (tk - tq) + 1.0
  else:
    visible = jnp.full((tq,), float(tk))
  uniform = jnp.sum(mask * jnp.log(visible)[None])
  return jnp.einsum("bhq,bq->h", ent, mask), uniform, jnp.sum(mask)


def _query_mask(query_mask, batch: int, queries: int) -> jax.Array:
  """Float32 ``[batch, queries]``: 1 where a query counts (all of them by default)."""
  if query_mask is None:
    return jnp.ones((batch, queries), jnp.float32)
  mask = jnp.asarray(query_mask)
  if mask.shape != (batch, queries):
    raise ValueError(f"query_mask must have shape {(batch, queries)}, got {mask.shape}")
  return (mask != 0).astype(jnp.float32)


def attention_self_weight(weights: jax.Array, query_mask: jax.Array | None = None):
  """Per-head sums of ``p_tt``, the weight a query puts on its own token, jittable.

  With ``T_q < T_k`` the queries are the last ``T_q`` keys (``p_{t, t + T_k - T_q}``).
  One-hot diagonal rows give 1 (saturated ``W + lam I``), uniform rows ``1 / T_k``.

  Args:
    weights: float ``[batch, heads, T_q, T_k]``, ``T_q <= T_k``.
    query_mask: optional ``[batch, T_q]``; nonzero = count this query.

  Returns:
    ``(self_weight [heads], count)`` float32 (divide for the mean).

  Raises:
    ValueError: ``weights`` not 4-D, ``T_q > T_k``, or a ``query_mask`` not
      ``[batch, T_q]``.
  """
  p = jnp.asarray(weights).astype(jnp.float32)
  if p.ndim != 4 or p.shape[2] > p.shape[3]:
    raise ValueError(
      f"weights must be [batch, heads, T_q, T_k] with T_q <= T_k, got shape {p.shape}"
    )
  b, _, tq, tk = p.shape
  diag = jnp.diagonal(p, offset=tk - tq, axis1=2, axis2=3)  # [batch, heads, T_q]
  mask = _query_mask(query_mask, b, tq)
  return jnp.einsum("bhq,bq->h", diag, mask), jnp.sum(mask)


def attention_head_similarity(weights: jax.Array, query_mask: jax.Array | None = None):
  """Sums of ``cos(p^a_t, p^b_t)`` between heads' attention rows, jittable.

  In ``[0, 1]``: 1 for equal rows, 0 for disjoint keys; a zero row has similarity 0
  with every head, itself included.

  Args:
    weights: float ``[batch, heads, T_q, T_k]``.
    query_mask: optional ``[batch, T_q]``; nonzero = count this query.

  Returns:
    ``(similarity [heads, heads], count)`` float32 (symmetric; divide for the mean).

  Raises:
    ValueError: ``weights`` not 4-D, or a ``query_mask`` not ``[batch, T_q]``.
  """
  p = jnp.asarray(weights).astype(jnp.float32)
  if p.ndim != 4:
    raise ValueError(f"weights must be [batch, heads, T_q, T_k], got shape {p.shape}")
  b, _, tq, _ = p.shape
  norm = jnp.sqrt(jnp.sum(p * p, -1, keepdims=True))
  unit = p / jnp.where(norm > 0, norm, 1.0)
  mask = _query_mask(query_mask, b, tq)
  return jnp.einsum("baqk,bcqk,bq->ac", unit, unit, mask), jnp.sum(mask)
