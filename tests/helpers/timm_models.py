"""What the timm parity tests of the vision families share: a relative
difference and the spectral correction written into timm's fused ``qkv``."""

import numpy as np


def relative_diff(got, want):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  return float(np.abs(got - want).max() / np.abs(want).max())


def corrected_qkv(weight, mode, lam, heads):
  """timm's ``qkv.weight [3D, D]`` plus the correction of ``mode``, in PyTorch's
  layout (the transpose of laplax's ``[D, 3D]`` kernel), from the definitions."""
  d = weight.shape[1]
  hd = d // heads
  out = weight.copy()
  for j in range(3):  # Q, K, V rows
    rows = slice(j * d, (j + 1) * d)
    if mode == "full":  # lam * eye(D, D) on each projection
      out[rows] += lam * np.eye(d, dtype=np.float32)
    elif mode == "per_head":  # lam * eye(D, d) on each head's block
      for h in range(heads):
        out[j * d + h * hd : j * d + (h + 1) * hd] += lam * np.eye(hd, d, dtype=np.float32)
    elif mode == "svd":  # sigma_max U V^T of each projection (Theorem 3.5)
      u, s, vt = np.linalg.svd(weight[rows].astype(np.float64), full_matrices=False)
      out[rows] += (s[0] * u @ vt).astype(np.float32)
  if mode == "fused":  # lam * eye on the [D, 3D] kernel: eye(3D, D) here
    out += lam * np.eye(3 * d, d, dtype=np.float32)
  return out
