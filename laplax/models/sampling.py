"""Generation with the KV cache, and log-likelihoods, for :class:`~laplax.models.gpt.GPT`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from laplax.models.gpt import GPT


def generate(model: GPT, params: Any, prompt: np.ndarray, *, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None,
             rng: jax.Array | None = None) -> np.ndarray:
  """Samples a continuation of ``prompt`` token by token with the KV cache.

  When prompt plus continuation reach ``model.spec.max_length``, decoding goes on
  in a sliding window: a fresh cache is filled with the last ``spec.max_length //
  2`` tokens and sampling continues from there (each token still sees at least
  half a context).

  Args:
    model: the GPT.
    params: its parameters.
    prompt: int ``[length]`` token ids (at least one, at most ``max_length``).
    max_new_tokens: tokens to sample.
    temperature: softmax temperature (0 = greedy).
    top_k: sample among the ``k`` most likely tokens (``None`` = all).
    rng: PRNG key (default ``PRNGKey(0)``).

  Returns:
    int32 ``[max_new_tokens]``: the sampled tokens (without the prompt).

  Raises:
    ValueError: an empty prompt or one longer than ``model.spec.max_length``.
  """
  prompt = np.asarray(prompt, np.int32)
  if prompt.size == 0:
    raise ValueError("the prompt is empty; give at least one token")
  if prompt.size > model.spec.max_length:
    raise ValueError(
        f"the prompt has {prompt.size} tokens but the model's context is "
        f"{model.spec.max_length}; shorten the prompt")
  rng = jax.random.PRNGKey(0) if rng is None else rng
  empty_cache = _empty_cache(model)
  step = _decode_step(model, float(temperature), top_k)

  seq = list(prompt)
  out = []
  cache, tokens, filled = empty_cache, prompt[None], prompt.size
  for i in range(max_new_tokens):
    if filled > model.spec.max_length:  # the cache is full: restart on the last half
      keep = seq[-(model.spec.max_length // 2):]
      cache, tokens, filled = empty_cache, np.asarray(keep, np.int32)[None], len(keep)
    cache, tokens = step(params, cache, tokens, rng, np.int32(i))
    nxt = np.asarray(tokens).item()  # one transfer per token
    out.append(nxt)
    seq.append(nxt)
    filled += 1
  return np.asarray(out, np.int32)


def continuation_logprob(model: GPT, params: Any, context: np.ndarray,
                         continuation: np.ndarray) -> float:
  """``sum_t log p(continuation_t | context, continuation_<t)`` in nats.

  ``context`` and ``continuation`` are int token arrays; when together they
  exceed ``model.spec.max_length`` the oldest context tokens are dropped.

  Raises:
    ValueError: an empty continuation, or a continuation alone longer than
      the context window.
  """
  context = np.asarray(context, np.int32)
  continuation = np.asarray(continuation, np.int32)
  if continuation.size == 0:
    raise ValueError("the continuation is empty")
  if continuation.size >= model.spec.max_length:
    raise ValueError(
        f"a continuation of {continuation.size} tokens does not fit the context "
        f"of {model.spec.max_length}")
  tokens = np.concatenate([context, continuation])[-(model.spec.max_length + 1):]
  inputs = np.zeros(model.spec.max_length, np.int32)  # right padding: causal, so
  inputs[:len(tokens) - 1] = tokens[:-1]          # it cannot change the scores
  logits, _ = _forward(model)(params, jnp.asarray(inputs)[None])
  logp = np.asarray(jax.nn.log_softmax(logits[0, :len(tokens) - 1], axis=-1))
  targets = tokens[1:]
  picked = logp[np.arange(len(targets)), targets]
  return float(picked[-continuation.size:].sum())


_FORWARD_CACHE: dict = {}
_DECODE_CACHE: dict = {}


def _empty_cache(model: GPT) -> Any:
  """The model's empty KV cache for one sequence (every entry of the
  ``"cache"`` collection starts at zero), built from shapes alone: no
  parameters are initialised."""
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, model.spec.max_length), jnp.int32),
      decode=True)["cache"])
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _decode_step(model: GPT, temperature: float, top_k: int | None):
  """``(params, cache, tokens [1, n], rng, i) -> (cache, next token [1, 1])``
  with the key ``fold_in(rng, i)``, jitted once per ``(model, temperature,
  top_k)``: the parameters are an argument, so sampling again (each
  evaluation of a training run) compiles nothing new for prompts of a length
  seen before."""
  key = (model, temperature, top_k)
  if key not in _DECODE_CACHE:
    def step(params, cache, tokens, rng, i):
      rng = jax.random.fold_in(rng, i)
      (logits, _), updated = model.apply({"params": params, "cache": cache}, tokens,
                                         decode=True, mutable=["cache"])
      logits = logits[0, -1]
      if top_k is not None:
        kth = jnp.sort(logits)[-min(top_k, logits.shape[-1])]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
      if temperature == 0:
        nxt = jnp.argmax(logits)
      else:
        nxt = jax.random.categorical(rng, logits / temperature)
      return updated["cache"], nxt.astype(jnp.int32)[None, None]
    _DECODE_CACHE[key] = jax.jit(step)
  return _DECODE_CACHE[key]


def _forward(model: GPT):
  if model not in _FORWARD_CACHE:
    _FORWARD_CACHE[model] = jax.jit(lambda p, t: model.apply({"params": p}, t))
  return _FORWARD_CACHE[model]
