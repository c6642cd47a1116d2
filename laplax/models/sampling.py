"""Generation with the KV cache, and log-likelihoods, for :class:`~laplax.models.gpt.GPT`.

:func:`generate` continues one prompt; :func:`generate_batch` continues a
batch of prompts of different lengths at once (with stop tokens and forced
tokens, e.g. a tool's output); :func:`continuation_logprob` and
:func:`continuation_logprobs` score continuations.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from laplax.models.gpt import GPT


def generate(
  model: GPT,
  params: Any,
  prompt: np.ndarray,
  *,
  max_new_tokens: int,
  temperature: float = 1.0,
  top_k: int | None = None,
  rng: jax.Array | None = None,
) -> np.ndarray:
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
      f"{model.spec.max_length}; shorten the prompt"
    )
  rng = jax.random.PRNGKey(0) if rng is None else rng
  empty_cache = _empty_cache(model)
  step = _decode_step(model, float(temperature), top_k)

  seq = list(prompt)
  out = []
  cache, tokens, filled = empty_cache, prompt[None], prompt.size
  for i in range(max_new_tokens):
    if filled > model.spec.max_length:  # the cache is full: restart on the last half
      keep = seq[-(model.spec.max_length // 2) :]
      cache, tokens, filled = empty_cache, np.asarray(keep, np.int32)[None], len(keep)
    cache, tokens = step(params, cache, tokens, rng, np.int32(i))
    nxt = np.asarray(tokens).item()  # one transfer per token
    out.append(nxt)
    seq.append(nxt)
    filled += 1
  return np.asarray(out, np.int32)


def continuation_logprob(
  model: GPT, params: Any, context: np.ndarray, continuation: np.ndarray
) -> float:
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
      f"of {model.spec.max_length}"
    )
  tokens = np.concatenate([context, continuation])[-(model.spec.max_length + 1) :]
  inputs = np.zeros(model.spec.max_length, np.int32)  # right padding: causal, so
  inputs[: len(tokens) - 1] = tokens[:-1]  # it cannot change the scores
  logits, _ = _forward(model)(params, jnp.asarray(inputs)[None])
  logp = np.asarray(jax.nn.log_softmax(logits[0, : len(tokens) - 1], axis=-1))
  targets = tokens[1:]
  picked = logp[np.arange(len(targets)), targets]
  return float(picked[-continuation.size :].sum())


def generate_batch(
  model: GPT,
  params: Any,
  prompts: Sequence[np.ndarray],
  *,
  max_new_tokens: int,
  temperature: float = 0.0,
  top_k: int | None = None,
  rng: jax.Array | None = None,
  stop_tokens: Sequence[int] = (),
  tool: Callable[[int, int], Sequence[int]] | None = None,
  rows: int | None = None,
) -> list[np.ndarray]:
  """Continues prompts of different lengths in one batch with the KV cache.

  All rows advance through the same positions: the first ``2^floor(log2(m))``
  tokens (``m`` the shortest prompt) fill the cache in one call, then one
  position per call, a row's own prompt tokens being fed (forced) until its
  prompt ends and its sampled tokens after that. Each row thus sees exactly
  its own tokens at their own positions: the result equals :func:`generate`
  row by row (without its sliding window), and nothing is padded inside a
  row. The same mechanism forces a tool's output (nanochat's
  ``Engine.generate``): after each new token of row ``i``, ``tool(i, token)``
  returns the tokens to feed next in place of samples (e.g. a calculator's
  result); forced tokens count towards ``max_new_tokens``.

  Args:
    model, params: the GPT and its parameters.
    prompts: int token arrays (each at least one token, at most
      ``max_length``).
    max_new_tokens: most tokens a row gets (sampled and forced).
    temperature: 0 = greedy (argmax), else softmax sampling at this temperature.
    top_k: sample among the ``k`` most likely tokens (``None`` = all).
    rng: PRNG key for sampling (default ``PRNGKey(0)``; position ``t`` uses
      ``fold_in(rng, t)``).
    stop_tokens: a row ends at the first of these (not included in its output).
    tool: the forced-token hook above (``None``: nothing forced).
    rows: pad the batch to this many rows (copies of the first prompt,
      discarded), so that batches of one size compile once.

  Returns:
    One int32 array per prompt: its new tokens, without the stop token. A row
    also ends when the context (``spec.max_length`` positions) is full.

  Raises:
    ValueError: no prompts, an empty prompt or one longer than the context,
      ``rows`` below the number of prompts.
  """
  prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
  max_length = model.spec.max_length
  if not prompts:
    raise ValueError("no prompts to continue")
  if any(p.size == 0 or p.size > max_length for p in prompts):
    raise ValueError(
      f"every prompt needs 1 to {max_length} tokens (the model's context); "
      f"got lengths {[p.size for p in prompts]}"
    )
  n = len(prompts)
  rows = n if rows is None else rows
  if rows < n:
    raise ValueError(f"rows={rows} is below the {n} prompts")
  prompts = prompts + [prompts[0]] * (rows - n)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  step = _batch_step(model, float(temperature), top_k)
  start = 1 << (int(min(p.size for p in prompts[:n])).bit_length() - 1)
  cache = _empty_cache(model, rows)
  cache, sampled = step(
    params, cache, np.stack([p[:start] for p in prompts]), rng, np.int32(start - 1)
  )
  stops = set(int(t) for t in stop_tokens)
  out = [[] for _ in range(rows)]
  forced = [collections.deque() for _ in range(rows)]
  done = [i >= n for i in range(rows)]
  pos = start
  while pos < max_length and not all(done):
    sampled = np.asarray(sampled)  # one transfer per position
    column = np.zeros(rows, np.int32)
    for i, prompt in enumerate(prompts):
      if pos < prompt.size:
        column[i] = prompt[pos]
        continue
      if done[i]:
        continue
      token = forced[i].popleft() if forced[i] else int(sampled[i])
      column[i] = token
      if token in stops:
        done[i] = True
        continue
      out[i].append(token)
      if tool is not None:
        forced[i].extend(int(t) for t in tool(i, token))
      done[i] = len(out[i]) >= max_new_tokens
    if all(done) or pos == max_length - 1:
      break
    cache, sampled = step(params, cache, column[:, None], rng, np.int32(pos))
    pos += 1
  return [np.asarray(row, np.int32) for row in out[:n]]


def continuation_logprobs(
  model: GPT, params: Any, pairs: Sequence[tuple[np.ndarray, np.ndarray]], batch_size: int = 8
) -> list[tuple[float, bool]]:
  """:func:`continuation_logprob` of many ``(context, continuation)`` pairs in
  batches, and whether greedy decoding gives the continuation.

  Each row is ``context + continuation`` without its last token (the oldest
  context tokens dropped beyond ``spec.max_length``), right-padded with 0 to
  a power of two (at most ``max_length``; causal attention, so the padding
  cannot change the scores); the batch is padded to ``batch_size`` rows.

  Returns:
    Per pair ``(sum_t log p(continuation_t | ...)`` in nats, ``is_greedy``:
    every continuation token is the argmax of its logits).

  Raises:
    ValueError: an empty context or continuation, or a continuation longer
      than the context window.
  """
  rows = []
  for context, continuation in pairs:
    context = np.asarray(context, np.int32).reshape(-1)
    continuation = np.asarray(continuation, np.int32).reshape(-1)
    if context.size == 0 or continuation.size == 0:
      raise ValueError(
        "the context and the continuation need at least one token each "
        "(start an empty context with the BOS token)"
      )
    if continuation.size > model.spec.max_length:
      raise ValueError(
        f"a continuation of {continuation.size} tokens does not fit the "
        f"context of {model.spec.max_length}"
      )
    tokens = np.concatenate([context, continuation])[-(model.spec.max_length + 1) :]
    rows.append((tokens, continuation.size))
  forward = _scores(model)
  results = []
  for b in range(0, len(rows), batch_size):
    chunk = rows[b : b + batch_size]
    longest = max(t.size - 1 for t, _ in chunk)
    width = min(model.spec.max_length, 1 << (longest - 1).bit_length())
    inputs = np.zeros((batch_size, width), np.int32)
    targets = np.zeros((batch_size, width), np.int32)
    for i, (tokens, _) in enumerate(chunk):
      inputs[i, : tokens.size - 1] = tokens[:-1]
      targets[i, : tokens.size - 1] = tokens[1:]
    logp, greedy = (np.asarray(a) for a in forward(params, inputs, targets))
    for i, (tokens, k) in enumerate(chunk):
      span = slice(tokens.size - 1 - k, tokens.size - 1)
      results.append((float(logp[i, span].sum()), bool(greedy[i, span].all())))
  return results


_BATCH_CACHE: dict = {}
_SCORE_CACHE: dict = {}


def _batch_step(model: GPT, temperature: float, top_k: int | None):
  """``(params, cache, tokens [rows, n], rng, pos) -> (cache, next [rows])``:
  the next token after each row's last input, with the key ``fold_in(rng,
  pos)``; jitted once per ``(model, temperature, top_k)``."""
  key = (model, temperature, top_k)
  if key not in _BATCH_CACHE:

    def step(params, cache, tokens, rng, pos):
      (logits, _), updated = model.apply(
        {"params": params, "cache": cache}, tokens, decode=True, mutable=["cache"]
      )
      logits = logits[:, -1]
      if top_k is not None:
        kth = jnp.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])]
        logits = jnp.where(logits < kth[:, None], -jnp.inf, logits)
      if temperature == 0:
        nxt = jnp.argmax(logits, axis=-1)
      else:
        nxt = jax.random.categorical(jax.random.fold_in(rng, pos), logits / temperature)
      return updated["cache"], nxt.astype(jnp.int32)

    _BATCH_CACHE[key] = jax.jit(step)
  return _BATCH_CACHE[key]


def _scores(model: GPT):
  """``(params, inputs, targets) -> (log p(target) [b, n], target == argmax [b, n])``, jitted."""
  if model not in _SCORE_CACHE:

    def scores(params, inputs, targets):
      logits, _ = model.apply({"params": params}, inputs)
      logp = jax.nn.log_softmax(logits, axis=-1)
      picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
      return picked, jnp.argmax(logits, axis=-1) == targets

    _SCORE_CACHE[model] = jax.jit(scores)
  return _SCORE_CACHE[model]


_FORWARD_CACHE: dict = {}
_DECODE_CACHE: dict = {}


def _empty_cache(model: GPT, batch: int = 1) -> Any:
  """The model's empty KV cache for ``batch`` sequences (every entry of the
  ``"cache"`` collection starts at zero), built from shapes alone: no
  parameters are initialised."""
  shapes = jax.eval_shape(
    lambda: model.init(
      jax.random.PRNGKey(0), jnp.zeros((batch, model.spec.max_length), jnp.int32), decode=True
    )["cache"]
  )
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
      (logits, _), updated = model.apply(
        {"params": params, "cache": cache}, tokens, decode=True, mutable=["cache"]
      )
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
