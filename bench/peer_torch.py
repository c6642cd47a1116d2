"""The default GPT and ViT in PyTorch: the peer ``bench/step_time.py --peer`` times laplax against.

    python bench/peer_torch.py            # parameter counts of both peers and laplax's

The models are plain PyTorch as the Laplacian authors' code is written (timm
for the ViT, nanochat for the GPT): ``nn.Linear`` projections, the fused
``F.scaled_dot_product_attention``, and the Laplacian heads as the authors
compute them, ``v - SDPA(q, k, v)`` on the *last* ``k`` heads of every layer
(laplax's :func:`laplax.attention.attend` computes the same ``V - P V``).
Each peer is built from a laplax config (:func:`from_config`) and takes the
same function as laplax's model for the settings of the default configs,
``configs/gpt_shakespeare.py`` and ``configs/vit_fashion_mnist.py``:

- GPT: token embedding tied to the output layer, rotary positions (laplax's
  half-split form, :func:`laplax.attention.rotary`) or learned ones,
  pre-LayerNorm blocks (``norm_eps``, with bias), separate q/k/v projections
  with biases (as nanochat's ``c_q, c_k, c_v``), causal SDPA, a GELU MLP
  (``mlp_activation``: tanh ``gelu``, ``gelu_exact`` or ``relu2``), a final
  LayerNorm; loss the mean next-token cross-entropy of ``tokens[:, 1:]``
  given ``tokens[:, :-1]``.
- ViT: a ``p x p`` stride-``p`` patch convolution, learned position
  embedding, optional class token (``pool="tok"``), the same blocks with one
  fused ``qkv`` projection (as timm's ``Attention``), a final LayerNorm, the
  mean of the tokens (``pool="gap"``) or the class token, a linear head;
  loss the softmax cross-entropy with ``loss.label_smoothing`` (PyTorch's
  ``label_smoothing`` is optax's ``smooth_labels``: ``(1 - a) y + a / K``).

A setting the peer does not implement (spectral conditioning, qk-norm,
LayerScale, dropout, drop-path, RMSNorm, the learned Laplacian mix, Mixup,
bfloat16, ...) raises ``ValueError`` in :func:`check_supported` rather than
timing a different model; the model settings it implements are its own
table :data:`SUPPORT` (one per family it implements, GPT and ViT, read by
:func:`laplax.convert.support.unsupported`), so a new spec field is refused
until the table lists it. :func:`make_optimizer` is AdamW with the config's betas, weight decay on the parameters laplax decays
(:func:`laplax.optim.decay_mask` of the mapped laplax names) at the
config's peak learning rate (constant: the schedule costs nothing), eps
1e-8 (optax's and PyTorch's default), PyTorch's fused CPU/GPU kernel;
:func:`train_step` clips the global gradient norm to ``optim.grad_clip``
first, and with ``grad_accum_steps = n`` (``bench/step_time.py
--peer-grad-accum``; default 1, the whole batch, whatever the config's
``optim.grad_accum_steps``) accumulates over ``n`` micro-batches as laplax
does. :func:`load_laplax_params` copies a laplax parameter tree into a peer
(the evidence, in ``tests/bench/test_peer_torch.py``, that both compute the same
loss). PyTorch is a benchmark-only dependency (``requirements-bench.txt``);
the library never imports this module nor torch.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from laplax import attention, tasks
from laplax.convert import support
from laplax.convert.support import ANY
from laplax.models import spec as spec_lib

SUPPORTED = "the settings of configs/gpt_shakespeare.py and configs/vit_fashion_mnist.py"


def _same_last_heads(laplacian, spec) -> bool:
  """Whether every layer's Laplacian heads are its last ``k``, one ``k`` for all
  (the Laplacian authors' code, and so the peer)."""
  counts = {int(np.sum(row)) for row in laplacian}
  return len(counts) == 1 and all(
    np.array_equal(row, attention.laplacian_heads(spec.num_heads, int(np.sum(row))))
    for row in laplacian
  )


# What both peers take: the sizes and the options that change no computed value
# (:data:`laplax.convert.support.EVERYWHERE`), biases or none, the plain
# activations, the norm eps, and the Laplacian heads as the authors compute them.
_BOTH = {
  **support.EVERYWHERE,
  "laplacian_mask": support.Rule(_same_last_heads, "the same last k heads in every layer"),
  "use_bias": ANY,
  "mlp_activation": support.PLAIN_ACTIVATIONS,
  "norm_eps": ANY,
}
#: ``{family: {config key: support}}``: the model options each peer implements
#: (:mod:`laplax.convert.support`; any other option only at its default): the
#: GPT's rotary or learned positions and tied or untied embeddings besides.
SUPPORT = {
  "gpt": {**_BOTH, "posemb": ANY, "tie_embeddings": ANY},
  "vit": _BOTH,
}
ACTIVATIONS = {
  "gelu": lambda: nn.GELU(approximate="tanh"),
  "gelu_exact": nn.GELU,
  "relu2": lambda: _ReLU2(),
}


class _ReLU2(nn.Module):
  def forward(self, x):
    return torch.square(F.relu(x))


def check_supported(config) -> None:
  """Raises ValueError naming the first setting of ``config`` the peer lacks:
  a model family other than GPT and ViT, a model option whose value the
  family's :data:`SUPPORT` does not admit
  (:func:`laplax.convert.support.unsupported`: an option it does not list
  must be at its default, so a new spec field is refused), or a training
  setting outside the model (optimizer, a ViT's loss).
  """
  family = config.model.get("name", "vit")
  if family not in SUPPORT:
    raise ValueError(
      f"the PyTorch peer has no model.name={family!r} (it implements {SUPPORTED}: "
      f"{' or '.join(map(repr, SUPPORT))}); set that or drop --peer"
    )
  refused = support.unsupported(spec_lib.from_config(config.model), SUPPORT[family])
  if refused:
    key, shown, supported = refused[0]
    raise ValueError(
      f"the PyTorch peer has no model.{key}={shown} (it implements "
      f"{SUPPORTED}: {supported}); set that or drop --peer"
    )
  checks = [("optim.optimizer", config.optim.get("optimizer", "adamw"), "adamw")]
  if not tasks.is_language_model(config):
    checks += [
      ("loss.type", config.loss.type, "softmax"),
      ("loss.mixup", config.loss.mixup, 0.0),
      ("loss.cutmix", config.loss.cutmix, 0.0),
    ]
  for name, value, wanted in checks:
    if value != wanted:
      raise ValueError(
        f"the PyTorch peer has no {name}={value!r} (it implements "
        f"{SUPPORTED}); set {wanted!r} or drop --peer"
      )


def laplacian_count(m) -> int:
  """The Laplacian heads of every layer of ``config.model`` ``m`` (the last
  ``k`` of each, one ``k``: :func:`check_supported`)."""
  return int(spec_lib.from_config(m).laplacian_array[0].sum())


def rotary_tables(length: int, head_dim: int, theta: float = 10_000.0):
  """``(cos, sin)`` float32 ``[length, head_dim // 2]`` of laplax's rotary form."""
  half = head_dim // 2
  freq = theta ** (-torch.arange(half, dtype=torch.float32) / half)
  angle = torch.arange(length, dtype=torch.float32)[:, None] * freq[None]
  return torch.cos(angle), torch.sin(angle)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
  """``x [batch, heads, length, head_dim]`` rotated as :func:`laplax.attention.rotary`."""
  x1, x2 = x.chunk(2, dim=-1)
  return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
  """Self-attention whose last ``num_laplacian`` heads output ``v - SDPA(q, k, v)``.

  ``x [batch, length, width] -> [batch, length, width]``. ``fused_qkv``: one
  ``qkv`` projection (timm) instead of ``c_q, c_k, c_v`` (nanochat).
  """

  def __init__(
    self,
    width: int,
    num_heads: int,
    num_laplacian: int,
    *,
    causal: bool,
    bias: bool,
    fused_qkv: bool,
  ):
    super().__init__()
    self.num_heads, self.num_laplacian, self.causal = num_heads, num_laplacian, causal
    self.fused_qkv = fused_qkv
    if fused_qkv:
      self.qkv = nn.Linear(width, 3 * width, bias=bias)
    else:
      self.c_q = nn.Linear(width, width, bias=bias)
      self.c_k = nn.Linear(width, width, bias=bias)
      self.c_v = nn.Linear(width, width, bias=bias)
    self.proj = nn.Linear(width, width, bias=bias)

  def forward(self, x: torch.Tensor, rope: tuple | None = None) -> torch.Tensor:
    """Attention of ``x``; ``rope``: ``(cos, sin)`` of :func:`rotary_tables`."""
    b, n, c = x.shape
    h = self.num_heads
    if self.fused_qkv:
      q, k, v = self.qkv(x).reshape(b, n, 3, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)
    else:
      q, k, v = (f(x).view(b, n, h, c // h).transpose(1, 2) for f in (self.c_q, self.c_k, self.c_v))
    if rope is not None:
      q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
    if self.num_laplacian:  # the authors' Laplacian heads: V - P V on the last heads
      s = h - self.num_laplacian
      y = torch.cat([y[:, :s], v[:, s:] - y[:, s:]], dim=1)
    return self.proj(y.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
  """Pre-LN block ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

  def __init__(self, m, causal: bool, fused_qkv: bool):
    super().__init__()
    self.norm1 = nn.LayerNorm(m.width, eps=m.norm_eps)
    self.attn = Attention(
      m.width, m.num_heads, laplacian_count(m), causal=causal, bias=m.use_bias, fused_qkv=fused_qkv
    )
    self.norm2 = nn.LayerNorm(m.width, eps=m.norm_eps)
    self.fc1 = nn.Linear(m.width, m.mlp_dim, bias=m.use_bias)
    self.act = ACTIVATIONS[m.mlp_activation]()
    self.fc2 = nn.Linear(m.mlp_dim, m.width, bias=m.use_bias)

  def forward(self, x: torch.Tensor, rope: tuple | None = None) -> torch.Tensor:
    """``x [batch, length, width]`` through the block."""
    x = x + self.attn(self.norm1(x), rope)
    return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class GPT(nn.Module):
  """Causal LM; ``forward(tokens int64 [batch, length + 1])`` -> mean loss (nats)."""

  def __init__(self, m, vocab_size: int):
    super().__init__()
    self.posemb, self.tie = m.posemb, m.tie_embeddings
    self.wte = nn.Embedding(vocab_size, m.width)
    if m.posemb == "learn":
      self.wpe = nn.Parameter(torch.zeros(m.max_length, m.width))
    else:
      cos, sin = rotary_tables(m.max_length, m.width // m.num_heads)
      self.register_buffer("cos", cos, persistent=False)
      self.register_buffer("sin", sin, persistent=False)
    self.blocks = nn.ModuleList(Block(m, causal=True, fused_qkv=False) for _ in range(m.depth))
    self.ln_f = nn.LayerNorm(m.width, eps=m.norm_eps)
    if not m.tie_embeddings:
      self.lm_head = nn.Linear(m.width, vocab_size, bias=False)
    for p in self.parameters():
      if p.dim() >= 2:
        nn.init.normal_(p, std=0.02)

  def forward(self, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``tokens[:, 1:]`` given ``tokens[:, :-1]``."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    n = inputs.shape[1]
    x = self.wte(inputs)
    rope = None
    if self.posemb == "learn":
      x = x + self.wpe[:n]
    else:
      rope = (self.cos[:n], self.sin[:n])
    for block in self.blocks:
      x = block(x, rope)
    x = self.ln_f(x)
    logits = F.linear(x, self.wte.weight) if self.tie else self.lm_head(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class ViT(nn.Module):
  """Classifier; ``forward(images float32 [batch, C, H, W], labels int64 [batch])``
  -> mean label-smoothed cross-entropy."""

  def __init__(
    self, m, image_shape: tuple[int, int, int], num_classes: int, label_smoothing: float
  ):
    super().__init__()
    h, w, c = image_shape
    p = m.patch_size
    self.pool, self.label_smoothing = m.pool, label_smoothing
    self.patch = nn.Conv2d(c, m.width, p, stride=p)
    self.pos = nn.Parameter(torch.randn(1, (h // p) * (w // p), m.width) * 0.02)
    if m.pool == "tok":
      self.cls = nn.Parameter(torch.zeros(1, 1, m.width))
    self.blocks = nn.ModuleList(Block(m, causal=False, fused_qkv=True) for _ in range(m.depth))
    self.norm = nn.LayerNorm(m.width, eps=m.norm_eps)
    self.head = nn.Linear(m.width, num_classes)

  def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the logits against ``labels`` (label-smoothed)."""
    x = self.patch(images).flatten(2).transpose(1, 2) + self.pos
    if self.pool == "tok":
      x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
    for block in self.blocks:
      x = block(x)
    x = self.norm(x)
    x = x[:, 0] if self.pool == "tok" else x.mean(dim=1)
    return F.cross_entropy(self.head(x), labels, label_smoothing=self.label_smoothing)


def from_config(
  config, *, vocab_size: int = 256, image_shape=(28, 28, 1), num_classes: int = 10
) -> nn.Module:
  """The float32 peer of ``config`` (a laplax ConfigDict; ``task`` ``"lm"`` -> GPT).

  Raises:
    ValueError: a setting the peer does not implement (:func:`check_supported`).
  """
  check_supported(config)
  if tasks.is_language_model(config):
    return GPT(config.model, vocab_size)
  return ViT(config.model, tuple(image_shape), num_classes, float(config.loss.label_smoothing))


def _copy(xs):
  return np.asarray(xs[0])


def _transpose(xs):
  return np.asarray(xs[0]).T


def _patch_kernel(xs):  # Flax [p, p, C, W] -> PyTorch [W, C, p, p]
  return np.transpose(xs[0], (3, 2, 0, 1))


def _stack_kernels(xs):  # q, k, v [W, W] each -> qkv weight [3W, W]
  return np.concatenate([np.asarray(x).T for x in xs], 0)


def _stack_biases(xs):
  return np.concatenate(xs, 0)


def _block_map(i: int, fused_qkv: bool) -> Iterator[tuple]:
  """(torch name, laplax paths, converter) of block ``i``'s parameters."""
  pre, blk = f"blocks.{i}.", f"block{i}/"
  att = blk + "attention/"
  for norm in ("norm1", "norm2"):
    yield pre + norm + ".weight", [blk + norm + "/scale"], _copy
    yield pre + norm + ".bias", [blk + norm + "/bias"], _copy
  names = ("query", "key", "value")
  if fused_qkv:
    yield pre + "attn.qkv.weight", [att + n + "/kernel" for n in names], _stack_kernels
    yield pre + "attn.qkv.bias", [att + n + "/bias" for n in names], _stack_biases
  else:
    for t, n in zip(("c_q", "c_k", "c_v"), names):
      yield pre + f"attn.{t}.weight", [att + n + "/kernel"], _transpose
      yield pre + f"attn.{t}.bias", [att + n + "/bias"], _copy
  yield pre + "attn.proj.weight", [att + "out/kernel"], _transpose
  yield pre + "attn.proj.bias", [att + "out/bias"], _copy
  for t in ("fc1", "fc2"):
    yield pre + t + ".weight", [blk + f"mlp/{t}/kernel"], _transpose
    yield pre + t + ".bias", [blk + f"mlp/{t}/bias"], _copy


def param_map(model: nn.Module) -> dict[str, tuple[list[str], Callable]]:
  """``{torch parameter name: (laplax parameter paths, converter)}`` of a peer.

  The converter takes the list of laplax arrays (``/``-joined paths of the
  Flax tree) and returns the torch parameter's array: kernels transposed,
  the ``[p, p, C, W]`` patch kernel as ``[W, C, p, p]``, q/k/v stacked for a
  fused ``qkv``. Only the peer's parameters are listed (biases off: none).
  """
  gpt = isinstance(model, GPT)
  if gpt:
    top = [
      ("wte.weight", ["token_embedding/embedding"], _copy),
      ("wpe", ["pos_embedding"], _copy),
      ("ln_f.weight", ["final_norm/scale"], _copy),
      ("ln_f.bias", ["final_norm/bias"], _copy),
      ("lm_head.weight", ["lm_head/kernel"], _transpose),
    ]
  else:
    top = [
      ("patch.weight", ["embedding/kernel"], _patch_kernel),
      ("patch.bias", ["embedding/bias"], _copy),
      ("pos", ["pos_embedding"], _copy),
      ("cls", ["cls"], _copy),
      ("norm.weight", ["encoder_norm/scale"], _copy),
      ("norm.bias", ["encoder_norm/bias"], _copy),
      ("head.weight", ["head/kernel"], _transpose),
      ("head.bias", ["head/bias"], _copy),
    ]
  for i in range(len(model.blocks)):
    top += list(_block_map(i, fused_qkv=not gpt))
  names = dict(model.named_parameters())
  return {name: (paths, fn) for name, paths, fn in top if name in names}


def flat_params(params: Any) -> dict[str, np.ndarray]:
  """A Flax parameter tree as ``{"a/b/c": array}``."""
  out = {}

  def walk(tree, prefix):
    for key, value in tree.items():
      path = f"{prefix}/{key}" if prefix else str(key)
      if hasattr(value, "items"):
        walk(value, path)
      else:
        out[path] = np.asarray(value)

  walk(params, "")
  return out


def load_laplax_params(model: nn.Module, params: Any) -> None:
  """Copies a laplax parameter tree into ``model`` (in place, float32).

  Raises:
    ValueError: a laplax parameter left unmapped, a missing one, or a shape
      that does not fit (the peer and the config differ).
  """
  flat = flat_params(params)
  mapping = param_map(model)
  used = {p for paths, _ in mapping.values() for p in paths}
  if set(flat) != used:
    raise ValueError(
      f"laplax and the peer differ: only laplax has {sorted(set(flat) - used)}, "
      f"only the peer {sorted(used - set(flat))}"
    )
  torch_params = dict(model.named_parameters())
  with torch.no_grad():
    for name, (paths, fn) in mapping.items():
      value = torch.from_numpy(
        np.array(fn([flat[p] for p in paths]), dtype=np.float32, order="C", copy=True)
      )
      if value.shape != torch_params[name].shape:
        raise ValueError(
          f"{name}: laplax gives {tuple(value.shape)}, the peer has "
          f"{tuple(torch_params[name].shape)}"
        )
      torch_params[name].copy_(value)


def make_optimizer(model: nn.Module, config) -> torch.optim.Optimizer:
  """AdamW at ``optim.lr`` with ``optim.b1, b2``, decaying what laplax decays.

  A parameter is decayed (``optim.weight_decay``) when its laplax
  counterparts have two or more dimensions and no path matching
  ``optim.weight_decay_exclude`` (:func:`laplax.optim.decay_mask`).
  PyTorch's fused AdamW kernel (the fastest of its three on CPU).
  """
  o = config.optim
  exclude = tuple(o.get("weight_decay_exclude", ()) or ())
  mapping = param_map(model)
  decay, no_decay = [], []
  for name, p in model.named_parameters():
    paths = mapping[name][0]
    # Each peer parameter has its laplax counterparts' number of dimensions.
    keep = p.dim() >= 2 and not any(re.search(e, path) for e in exclude for path in paths)
    (decay if keep else no_decay).append(p)
  groups = [
    {"params": decay, "weight_decay": float(o.weight_decay)},
    {"params": no_decay, "weight_decay": 0.0},
  ]
  return torch.optim.AdamW(
    groups, lr=float(o.lr), betas=(float(o.b1), float(o.b2)), eps=1e-8, fused=True
  )


def train_step(
  loss_fn: Callable,
  model: nn.Module,
  opt: torch.optim.Optimizer,
  grad_clip: float | None,
  batch: tuple,
  grad_accum_steps: int = 1,
) -> torch.Tensor:
  """One step: ``loss_fn(*batch)``, backward, global-norm clip, AdamW; the loss.

  With ``grad_accum_steps = n > 1`` (laplax's ``optim.grad_accum_steps``) the
  batch is cut into ``n`` equal micro-batches along its first axis, each
  one's ``loss / n`` is backpropagated into the summed gradients, and the
  loss returned is the sum of those: the whole batch's mean loss and its
  gradient, as laplax's accumulation. Raises ValueError if ``n`` does not
  divide the batch.
  """
  n = int(grad_accum_steps)
  if batch[0].shape[0] % n:
    raise ValueError(f"a batch of {batch[0].shape[0]} cannot be cut into {n} micro-batches")
  opt.zero_grad(set_to_none=True)
  if n == 1:
    loss = loss_fn(*batch)
    loss.backward()
  else:
    loss = 0.0
    for micro in zip(*(torch.chunk(x, n) for x in batch)):
      part = loss_fn(*micro) / n
      part.backward()
      loss = loss + part.detach()
  if grad_clip:
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
  opt.step()
  return loss.detach()


def torch_batch(batch: dict) -> tuple:
  """A laplax batch (NumPy) as the peer's arguments: ``(tokens int64,)`` or
  ``(images NCHW float32, labels int64)``."""
  if "tokens" in batch:
    return (torch.from_numpy(np.asarray(batch["tokens"], np.int64)),)
  images = np.ascontiguousarray(np.transpose(np.asarray(batch["image"], np.float32), (0, 3, 1, 2)))
  return torch.from_numpy(images), torch.from_numpy(np.asarray(batch["label"], np.int64))


def num_params(model: nn.Module) -> int:
  """Parameters of the peer (its buffers, the rotary tables, are not counted)."""
  return sum(p.numel() for p in model.parameters())


def main() -> None:
  """Prints the parameter counts of both default peers and of laplax's models."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax

  from bench import common

  for path in ("configs/gpt_shakespeare.py", "configs/vit_fashion_mnist.py"):
    config = common.load_config(path)
    task = common.make_task(config, (28, 28, 1), 10)
    params = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    laplax_n = sum(x.size for x in jax.tree_util.tree_leaves(params))
    print(f"{path}: laplax {laplax_n} parameters, PyTorch peer {num_params(from_config(config))}")


if __name__ == "__main__":
  main()
