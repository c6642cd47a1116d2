"""Generation with the KV cache, and log-likelihoods, for :class:`~laplax.models.gpt.GPT`.

One sampler serves every caller (``eval.py --sample``, the generation
evaluators, the chat of :mod:`laplax.proj.nanochat.chat`): :func:`stream` yields one
prompt's new tokens as they are decoded (with stop tokens and forced tokens,
e.g. a tool's output), :func:`generate` collects them, :func:`generate_batch`
continues a batch of prompts of different lengths at once;
:func:`continuation_logprob` and :func:`continuation_logprobs` score
continuations.

Compilation is bounded: a decoding step is jitted once per model
(:func:`decode_step`, an LRU cache of :data:`CACHED_MODELS` models) with the
temperature and top-k as traced arguments, and is compiled once per input
shape. A prompt is right-padded to a power-of-two bucket (at most
``spec.max_length``), so prompts of any length compile at most
``log2(max_length) + 1`` prefill shapes, and each token after it is one
``[rows, 1]`` step. The KV cache holds ``spec.max_length`` positions; the
padded positions it is filled with are rewritten before any query can see
them (the cache mask hides positions after the query's own).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from laplax.models.gpt import GPT

#: Models whose jitted functions are kept (least recently used dropped first).
CACHED_MODELS = 4

# Names of the KV cache's position counters (laplax.attention and laplax.models.gpt).
_COUNTERS = ("cache_index", "position")


def bucket(length: int, max_length: int) -> int:
  """The padded prefill width of a prompt of ``length`` tokens: the next
  power of two, at most ``max_length``."""
  return min(max_length, 1 << max(0, int(length) - 1).bit_length())


@functools.lru_cache(maxsize=CACHED_MODELS)
def _cache_shapes(model: GPT, rows: int) -> Any:
  """Shapes of the model's KV cache for ``rows`` sequences (``jax.eval_shape``
  of ``init``: no parameters are initialised)."""
  return jax.eval_shape(
    lambda: model.init(
      jax.random.PRNGKey(0), jnp.zeros((rows, model.spec.max_length), jnp.int32), decode=True
    )["cache"]
  )


def empty_cache(model: GPT, rows: int = 1) -> Any:
  """The model's empty KV cache (``"cache"`` collection, all zeros) for
  ``rows`` sequences of ``spec.max_length`` positions."""
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), _cache_shapes(model, rows))


@functools.cache
def _default_key() -> jax.Array:
  """``jax.random.PRNGKey(0)``, made once (a dispatch less per prompt)."""
  return jax.random.PRNGKey(0)


def sample_logits(logits, rng, temperature, top_k):
  """The next token of each row of float ``logits [rows, vocab]``.

  ``temperature`` (float scalar, may be traced) 0 takes the argmax, else a
  sample of ``softmax(logits / temperature)`` restricted to the ``top_k``
  (int scalar, may be traced; ``vocab`` = all) largest logits, with ``rng``.
  Returns int32 ``[rows]``.
  """
  vocab = logits.shape[-1]
  k = jnp.clip(top_k, 1, vocab)
  kth = jnp.take(jnp.sort(logits, axis=-1), vocab - k, axis=-1)
  kept = jnp.where(logits < kth[:, None], -jnp.inf, logits)
  greedy = jnp.argmax(logits, axis=-1)
  drawn = jax.random.categorical(rng, kept / jnp.where(temperature > 0, temperature, 1.0))
  return jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)


@functools.lru_cache(maxsize=CACHED_MODELS)
def decode_step(model: GPT):
  """The one jitted decoding step of ``model``:

  ``(params, cache, tokens int32 [rows, n], used, rng, salt, temperature,
  top_k) -> (cache, next int32 [rows])``: feeds ``tokens`` at the cache's
  position, of which the first ``used`` are real (the rest is bucket padding:
  the cache's counters advance by ``used`` only), and samples each row's next
  token after its token ``used - 1`` (:func:`sample_logits`, key
  ``fold_in(rng, salt)``). ``cache=None`` starts from the empty cache
  (:func:`empty_cache`), made inside the compiled step: a prompt's prefill
  is one dispatch. Compiled once per ``(rows, n)`` and cache or ``None``.
  """

  def step(params, cache, tokens, used, rng, salt, temperature, top_k):
    if cache is None:
      shapes = _cache_shapes(model, tokens.shape[0])
      cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    (logits, _), updated = model.apply(
      {"params": params, "cache": cache}, tokens, decode=True, mutable=["cache"]
    )
    pad = tokens.shape[1] - used

    def rewind(path, leaf):
      name = getattr(path[-1], "key", None)
      return leaf - pad if name in _COUNTERS else leaf

    cache = jax.tree_util.tree_map_with_path(rewind, updated["cache"])
    last = jax.lax.dynamic_index_in_dim(logits, used - 1, axis=1, keepdims=False)
    rng = jax.random.fold_in(rng, salt)
    return cache, sample_logits(last, rng, temperature, top_k)

  return jax.jit(step)


def _options(model: GPT, temperature: float, top_k: int | None):
  vocab = model.vocab_size
  k = vocab if top_k is None or top_k <= 0 else min(int(top_k), vocab)
  return np.float32(temperature), np.int32(k)


def stream(
  model: GPT,
  params: Any,
  prompt: np.ndarray,
  *,
  max_new_tokens: int,
  temperature: float = 1.0,
  top_k: int | None = None,
  rng: jax.Array | None = None,
  stop_tokens: Sequence[int] = (),
  tool: Callable[[int], Sequence[int]] | None = None,
  slide: bool = True,
) -> Iterator[int]:
  """Yields the new tokens of ``prompt`` one by one as they are decoded.

  The prompt is fed in one call (padded to :func:`bucket`), then one token
  per call. After each new token, ``tool(token)`` returns tokens to feed next
  in place of samples (nanochat's calculator; they are yielded too and count
  towards ``max_new_tokens``). Token ``i`` is sampled with the key
  ``fold_in(rng, i)``. When prompt plus continuation fill
  ``model.spec.max_length``, ``slide=True`` goes on in a sliding window (a
  fresh cache is filled with the last ``spec.max_length // 2`` tokens: each
  token still sees at least half a context); ``slide=False`` stops there.

  Args:
    model, params: the GPT and its parameters.
    prompt: int ``[length]`` token ids (at least one, at most ``max_length``).
    max_new_tokens: most tokens to yield.
    temperature: softmax temperature (0 = greedy).
    top_k: sample among the ``k`` most likely tokens (``None`` or 0 = all).
    rng: PRNG key (default ``PRNGKey(0)``).
    stop_tokens: stop at the first of these (not yielded).
    tool: the forced-token hook above (``None``: nothing forced).
    slide: what happens at a full context (above).

  Yields:
    int token ids.

  Raises:
    ValueError: an empty prompt or one longer than ``model.spec.max_length``.
  """
  prompt = np.asarray(prompt, np.int32).reshape(-1)
  max_length = model.spec.max_length
  if prompt.size == 0:
    raise ValueError("the prompt is empty; give at least one token")
  if prompt.size > max_length:
    raise ValueError(
      f"the prompt has {prompt.size} tokens but the model's context is "
      f"{max_length}; shorten the prompt"
    )
  rng = _default_key() if rng is None else rng
  step = decode_step(model)
  temperature, top_k = _options(model, temperature, top_k)
  stops = set(int(t) for t in stop_tokens)

  def prefill(tokens):
    padded = np.zeros((1, bucket(tokens.size, max_length)), np.int32)
    padded[0, : tokens.size] = tokens
    return padded, tokens.size

  seq = list(prompt)
  forced: collections.deque = collections.deque()
  cache = None  # the step makes the empty cache (decode_step)
  feed, used = prefill(prompt)
  filled = prompt.size  # tokens in the cache once ``feed`` is in
  for i in range(max_new_tokens):
    cache, nxt = step(params, cache, feed, np.int32(used), rng, np.int32(i), temperature, top_k)
    token = forced.popleft() if forced else int(np.asarray(nxt)[0])  # one transfer a token
    if token in stops:
      return
    yield token
    seq.append(token)
    if tool is not None:
      forced.extend(int(t) for t in tool(token))
    if filled >= max_length:  # no room for the token: the window slides, or decoding ends
      if not slide:
        return
      keep = np.asarray(seq[-(max_length // 2) :], np.int32)
      cache, (feed, used), filled = None, prefill(keep), keep.size
    else:
      feed, used, filled = np.asarray([[token]], np.int32), 1, filled + 1


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
  """Samples a continuation of ``prompt`` token by token with the KV cache
  (:func:`stream` collected, sliding past a full context).

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
  tokens = stream(
    model,
    params,
    prompt,
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    top_k=top_k,
    rng=rng,
  )
  return np.fromiter(tokens, np.int32, count=max_new_tokens)


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
  rng = _default_key() if rng is None else rng
  step = decode_step(model)
  options = _options(model, temperature, top_k)
  start = 1 << (int(min(p.size for p in prompts[:n])).bit_length() - 1)
  cache = empty_cache(model, rows)
  first = np.stack([p[:start] for p in prompts])
  cache, sampled = step(params, cache, first, np.int32(start), rng, np.int32(start - 1), *options)
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
    cache, sampled = step(params, cache, column[:, None], np.int32(1), rng, np.int32(pos), *options)
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


@functools.lru_cache(maxsize=CACHED_MODELS)
def _scores(model: GPT):
  """``(params, inputs, targets) -> (log p(target) [b, n], target == argmax [b, n])``, jitted."""

  def scores(params, inputs, targets):
    logits, _ = model.apply({"params": params}, inputs)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return picked, jnp.argmax(logits, axis=-1) == targets

  return jax.jit(scores)


@functools.lru_cache(maxsize=CACHED_MODELS)
def _forward(model: GPT):
  """``(params, tokens) -> model.apply(...)``, jitted."""
  return jax.jit(lambda p, t: model.apply({"params": p}, t))
