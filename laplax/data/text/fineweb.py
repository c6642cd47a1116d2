"""FineWeb-Edu input as nanochat reads it: parquet shards -> one packed token stream.

Typical use (``configs/gpt_d20.py``; ``LanguageModelTask`` does this)::

  tok = fineweb.prepare(cfg.data, workdir)     # nanochat tokenizer: load, copy or train
  it = iter(fineweb.train_dataset(cfg.data, tok, batch_size=32, seq_len=2048))
  batch = next(it)                             # {"tokens": int32 [32, 2049]}
  state = it.get_state()                       # the stream positions (JSON); it.set_state(state)
  for batch in fineweb.eval_batches(cfg.data, tok, batch_size=32, seq_len=2048,
                                    train_batch_size=32): ...   # + "mask"

The source (``data.source_dir``) is a directory of parquet files with a
``text`` column, FineWeb-Edu's shards as nanochat publishes them
(``shard_00000.parquet``, ...). The files are sorted by name; the last is
the validation split, the others the train split (Karpathy's nanochat,
``nanochat/dataset.py`` and ``nanochat/dataloader.py``, first release);
:mod:`laplax.data.text.fineweb_shards` lists and reads them.

The packing, per stream (one stream per nanochat rank): the stream reads the
row groups ``s, s + W, s + 2W, ...`` of each file in order (``W`` =
``data.streams``), starting again at the first file when it runs out (the
validation stream too, as nanochat's loader never stops). Each document
becomes ``[BOS] + encode(text)`` and the documents are concatenated into one
first-in-first-out token stream: a document runs on across rows and batches
and nothing masks its boundary. A *pop* takes the next ``R * T + 1`` tokens
``x`` (``R`` = ``data.pop_rows``, nanochat's per-device batch, ``T`` the
context): row ``i`` is ``x[i T : i T + T + 1]``, so the model reads ``x[:-1]``
as ``[R, T]`` and predicts ``x[1:]``; ``x``'s last token is a target only
and is not read again (nanochat's ``B * T + 1``).

How that maps on laplax's batches: a global batch of ``B`` rows is the ``W``
streams' rows in stream order, ``B / W`` rows each, made of ``B / (W R)``
pops of each stream (nanochat's gradient-accumulation micro-steps; with
``pop_rows`` None, ``R = B / W``: one pop per stream per step). So with ``W``
= nanochat's number of GPUs and ``R`` its ``device_batch_size``, step ``s``
holds exactly the tokens of nanochat's step ``s``. Process ``p`` of ``P``
holds rows ``p B / P`` to ``(p + 1) B / P - 1``: it reads streams ``p W / P``
to ``(p + 1) W / P - 1`` when ``W`` is a multiple of ``P``, and with fewer
streams than processes the one stream those rows are in, keeping its part
(:func:`process_streams`: the batch does not depend on ``P``); the trainer
puts its ``B / P`` rows on its own devices
(``jax.make_array_from_process_local_data``). The stream is a function of the files, the tokenizer,
``W``, ``R`` and ``T`` only (no seed: nanochat does not shuffle; the shards
were shuffled when made).

Resume: a stream's position is (index of its row group, offset into that
row group's tokens); ``get_state()`` is the JSON ``{"streams": W,
"positions": {stream: [row group index, offset]}}`` of all streams (on
several processes gathered from all of them), and ``set_state`` re-reads and
re-encodes that one row group, so a resumed run sees exactly the tokens the
uninterrupted run would.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import grain
import ml_collections
import numpy as np
from ml_collections import config_dict

from laplax.data.errors import DataError
from laplax.data.text.fineweb_shards import (
  DEFAULT_SOURCE_DIR,
  iter_documents,
  list_shards,
  read_row_group,
  row_group_counts,
)
from laplax.data.text.nanochat_tokenizer import NanochatTokenizer, training_texts
from laplax.data.text.tokenizers import load_tokenizer, tokenizer_kind, tokenizer_path

DATASET_NAME = "fineweb_edu"


def default_config() -> ml_collections.ConfigDict:
  """A FineWeb-Edu data config with every key this module reads, at its default.

  Keys: ``name`` (``"fineweb_edu"``), ``data_dir`` (not read here; every
  config has it), ``source_dir`` (the parquet shards;
  default ``$LAPLAX_DATA/fineweb_edu``), ``tokenizer`` (``"nanochat"``),
  ``vocab_size`` (65536), ``tokenizer_dir`` (a nanochat tokenizer directory
  or file to use; empty: train one on the train shards),
  ``tokenizer_max_chars`` and ``tokenizer_doc_cap`` (the training text:
  nanochat's speedrun 2e9 characters, documents cut to 10,000),
  ``streams`` (``W``), ``pop_rows`` (``R``; None: one pop per stream and
  step), ``max_eval_tokens`` (nanochat's ``eval_tokens``; None: the whole
  validation shard once), ``encode_threads`` (tiktoken), ``prefetch``
  (batches prepared ahead in a thread; 0: none).
  """
  return ml_collections.ConfigDict(
    {
      "name": DATASET_NAME,
      "data_dir": "~/tensorflow_datasets",
      "source_dir": DEFAULT_SOURCE_DIR,
      "tokenizer": "nanochat",
      "vocab_size": 65536,
      "tokenizer_dir": "",
      "tokenizer_max_chars": 2_000_000_000,
      "tokenizer_doc_cap": 10_000,
      "streams": 1,
      "pop_rows": config_dict.placeholder(int),
      "max_eval_tokens": config_dict.placeholder(int),
      "encode_threads": 4,
      "prefetch": 2,
    }
  )


# --------------------------------------------------------------------------
# The shards (listed and read by laplax.data.text.fineweb_shards).


def stream_row_groups(
  paths: Sequence[str], counts: Sequence[int], stream: int, streams: int
) -> list[tuple[str, int]]:
  """``(file, row group)`` of stream ``stream`` of ``streams``: row groups
  ``stream, stream + streams, ...`` of each file, file by file."""
  return [(p, g) for p, n in zip(paths, counts) for g in range(stream, n, streams)]


# --------------------------------------------------------------------------
# One stream.


class TokenStream:
  """One stream's FIFO of ``[BOS] + encode(document)`` tokens.

  Args:
    row_groups: the stream's ``(file, row group)`` list (:func:`stream_row_groups`).
    tokenizer: a :class:`NanochatTokenizer`.
    repeat: start again at the first row group after the last (else
      :meth:`take` returns None when the tokens run out).
    encode_threads: tiktoken threads.

  Attributes:
    position: ``[row group index, token offset]``, the next token to take.
  """

  def __init__(self, row_groups, tokenizer, *, repeat: bool = True, encode_threads: int = 4):
    if not row_groups:
      raise ValueError("a stream needs at least one row group")
    self._groups, self._tokenizer = list(row_groups), tokenizer
    self._repeat, self._threads = repeat, encode_threads
    self._loaded = -1
    self._tokens = np.zeros(0, np.int32)
    self.position = [0, 0]

  def _load(self, k: int) -> bool:
    if k != self._loaded:
      if not self._repeat and k >= len(self._groups):
        return False
      path, group = self._groups[k % len(self._groups)]
      docs = self._tokenizer.encode_documents(read_row_group(path, group), self._threads)
      self._tokens = np.concatenate(docs) if docs else np.zeros(0, np.int32)
      self._loaded = k
    return True

  def take(self, n: int) -> np.ndarray | None:
    """The next ``n`` tokens (int32 [n]), or None when a non-repeating stream ends."""
    pieces, k, offset = [], *self.position
    while n > 0:
      if not self._load(k):
        return None
      piece = self._tokens[offset : offset + n]
      pieces.append(piece)
      n -= len(piece)
      offset += len(piece)
      if offset >= len(self._tokens) and n > 0:
        k, offset = k + 1, 0
    self.position = [k, offset]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)

  def pop_rows(self, rows: int, seq_len: int) -> np.ndarray | None:
    """One pop: the next ``rows * seq_len + 1`` tokens as int32 [rows, seq_len + 1]
    (row ``i`` = tokens ``i seq_len .. i seq_len + seq_len``), or None at the end."""
    x = self.take(rows * seq_len + 1)
    if x is None:
      return None
    return x[np.arange(rows)[:, None] * seq_len + np.arange(seq_len + 1)]


# --------------------------------------------------------------------------
# Settings.


def _geometry(data_config, batch_size: int, process_count: int = 1) -> tuple[int, int]:
  """``(W, R)``: streams and rows per pop, checked against the batch and processes
  (:func:`geometry`).

  Raises:
    DataError: ``streams``/``pop_rows`` not positive integers, or not dividing.
  """
  w, r = data_config.streams, data_config.pop_rows
  if isinstance(w, bool) or not isinstance(w, int) or w < 1 or batch_size % w:
    raise DataError(
      f"--config.data.streams={w!r} must be a positive integer dividing the "
      f"batch size {batch_size}."
    )
  if w % process_count and process_count % w:
    raise DataError(
      f"--config.data.streams={w} must be a multiple or a divisor of the "
      f"{process_count} processes (each process reads whole streams, or its part of one)."
    )
  if batch_size % process_count:
    raise DataError(
      f"The batch size {batch_size} must be a multiple of the {process_count} "
      "processes (each process takes its own rows of every batch)."
    )
  per_stream = batch_size // w
  r = per_stream if r is None else r
  if isinstance(r, bool) or not isinstance(r, int) or r < 1 or per_stream % r:
    raise DataError(
      f"--config.data.pop_rows={r!r} must be a positive integer dividing the "
      f"{per_stream} rows of each stream in a batch (batch {batch_size} / "
      f"{w} streams)."
    )
  return w, r


def geometry(data_config, batch_size: int, process_count: int = 1) -> tuple[int, int]:
  """``(W, R)``, ``data.streams`` and the rows each pop of a stream takes, for a
  global batch of ``batch_size`` rows read by ``process_count`` processes
  (``python -m laplax.plan`` checks a target with it; mid-training's chat
  streams follow the same rules).

  Raises:
    DataError: ``streams`` not a positive integer dividing the batch, nor a
      multiple or a divisor of the processes, a batch the processes do not
      divide, or ``pop_rows`` not dividing a stream's rows.
  """
  return _geometry(data_config, batch_size, process_count)


def process_streams(
  streams: int, batch_size: int, process_index: int, process_count: int
) -> tuple[range, slice]:
  """Which streams process ``process_index`` of ``process_count`` reads, and
  which of their rows it keeps: ``(streams, rows)``, ``rows`` a slice of the
  concatenation of those streams' rows of a step (``batch_size / streams``
  rows each, stream by stream).

  The global batch is the streams' rows in stream order and process ``p``
  holds rows ``p B / P`` to ``(p + 1) B / P - 1`` of it. With ``W`` a multiple
  of ``P`` that is ``W / P`` whole streams (the slice keeps everything); with
  fewer streams than processes (8 streams on a 16-host slice) several
  processes read the same stream and each keeps its part of its rows, so the
  batch is the same whatever the number of processes (each stream is then
  read and tokenised ``P / W`` times, once per process that shares it).
  :func:`geometry` asks ``W`` to be a multiple or a divisor of ``P``, so every
  process reads as many streams as every other.
  """
  per_stream = batch_size // streams
  per_process = batch_size // process_count
  first_row = process_index * per_process
  first = first_row // per_stream
  end = -(-(first_row + per_process) // per_stream)
  start = first_row - first * per_stream
  return range(first, end), slice(start, start + per_process)


def _stream_groups(data_config, split: str, streams: int) -> list[list[tuple[str, int]]]:
  paths = list_shards(data_config.source_dir)
  paths = paths[:-1] if split == "train" else paths[-1:]
  counts = row_group_counts(paths)
  if streams > max(counts):
    raise DataError(
      f"The {split} shards have at most {max(counts)} row groups per file, "
      f"fewer than --config.data.streams={streams}; lower it."
    )
  return [stream_row_groups(paths, counts, s, streams) for s in range(streams)]


# --------------------------------------------------------------------------
# Public pipelines.


def prepare(
  data_config: ml_collections.ConfigDict,
  workdir: str | None = None,
  *,
  seq_len: int | None = None,
  batch_size: int | None = None,
) -> NanochatTokenizer:
  """Checks the shards (and, given ``batch_size``, the global batch, the
  ``streams``/``pop_rows`` against it; with ``seq_len`` too, that the
  validation shard holds a pop of each stream) and returns the run's tokenizer.

  The tokenizer is ``WORKDIR/nanochat_tokenizer.json`` when there (a
  resumed run, or one ``laplax.convert --from nanochat`` wrote); else the
  one in ``data.tokenizer_dir`` (nanochat's ``tokenizer.pkl``, or laplax's
  JSON); else trained on the train shards (``tokenizer_max_chars``,
  ``tokenizer_doc_cap``, ``vocab_size``). A tokenizer not read from the
  workdir is saved there.

  Raises:
    DataError: another tokenizer than ``"nanochat"``; a missing or unreadable
      shard directory; bad ``streams``/``pop_rows``; a tokenizer of another
      ``vocab_size``.
  """
  if tokenizer_kind(data_config) != "nanochat":
    raise DataError(
      f"The FineWeb-Edu input needs --config.data.tokenizer=nanochat, not "
      f"{data_config.tokenizer!r} (its documents begin with <|bos|>)."
    )
  paths = list_shards(data_config.source_dir)
  row_group_counts(paths)  # every file readable, with a text column
  if batch_size is not None:
    streams, _ = _geometry(data_config, batch_size)
    for split in ("train", "validation"):
      _stream_groups(data_config, split, streams)
  path = tokenizer_path(workdir, "nanochat") if workdir is not None else None
  if path is not None and os.path.isfile(path):
    return load_tokenizer(data_config, workdir)
  source = data_config.tokenizer_dir or ""
  if source:
    tokenizer = NanochatTokenizer.from_path(source)
    if tokenizer.vocab_size != data_config.vocab_size:
      raise DataError(
        f"The tokenizer {source} has {tokenizer.vocab_size} tokens but "
        f"--config.data.vocab_size={data_config.vocab_size}; set it to "
        f"{tokenizer.vocab_size}."
      )
  else:
    texts = training_texts(
      iter_documents(paths[:-1]), data_config.tokenizer_max_chars, data_config.tokenizer_doc_cap
    )
    tokenizer = NanochatTokenizer.train(texts, data_config.vocab_size)
  if batch_size is not None and seq_len is not None:  # the validation split holds a pop
    next(
      eval_batches(
        data_config, tokenizer, batch_size=1, seq_len=seq_len, train_batch_size=batch_size
      )
    )
  if path is not None:
    tokenizer.save(path)
  return tokenizer


class _TrainIterator(grain.DatasetIterator):
  """The batches of this process's streams; state: their positions (see _GatheredState)."""

  def __init__(
    self,
    streams: dict[int, TokenStream],
    num_streams: int,
    rows: int,
    pops: int,
    seq_len: int,
    keep: slice | None = None,
  ):
    super().__init__()
    self._streams, self._num = streams, num_streams
    self._rows, self._pops, self._seq_len = rows, pops, seq_len
    self._keep = keep  # of the streams' rows: a stream shared with other processes

  def __next__(self) -> dict:
    rows = [
      s.pop_rows(self._rows, self._seq_len)
      for _, s in sorted(self._streams.items())
      for _ in range(self._pops)
    ]
    tokens = np.concatenate(rows)
    if self._keep is not None and (self._keep.start, self._keep.stop) != (0, len(tokens)):
      tokens = tokens[self._keep]
    return {"tokens": tokens}

  def get_state(self) -> dict:
    local = {str(i): list(s.position) for i, s in self._streams.items()}
    return {"streams": self._num, "positions": local}

  def set_state(self, state: dict) -> None:
    if state.get("streams") != self._num:
      raise DataError(
        f"The checkpoint's data position is of {state.get('streams')} "
        f"FineWeb-Edu streams, this run has --config.data.streams={self._num}; "
        "resume with the run's setting or use a new --workdir."
      )
    for i, stream in self._streams.items():
      if str(i) not in state.get("positions", {}):
        raise DataError(
          f"The checkpoint's data position has no FineWeb-Edu stream {i}; it "
          "was saved by another run: use a new --workdir."
        )
      stream.position = [int(v) for v in state["positions"][str(i)]]


class _GatheredState(grain.DatasetIterator):
  """Wraps the (prefetching) iterator: ``get_state`` holds every process's
  stream positions (``gather``: local positions -> all processes' list)."""

  def __init__(self, inner, gather: Callable | None):
    super().__init__()
    self._inner, self._gather = inner, gather

  def __next__(self):
    return next(self._inner)

  def get_state(self) -> dict:
    state = self._inner.get_state()
    if self._gather is None:
      return state
    positions = {}
    for part in self._gather(state["positions"]):
      positions.update(part)
    return {"streams": state["streams"], "positions": positions}

  def set_state(self, state: dict) -> None:
    self._inner.set_state(state)


class _TrainDataset(grain.IterDataset):
  def __init__(self, make: Callable[[], _TrainIterator]):
    super().__init__()
    self._make = make

  def __iter__(self) -> _TrainIterator:
    return self._make()


def _allgather_positions(local: dict) -> list[dict]:
  """Every process's ``{stream: [k, offset]}`` (a collective: all processes call it)."""
  from jax.experimental import multihost_utils

  keys = sorted(local, key=int)
  mine = np.array([[int(k), *local[k]] for k in keys], np.int64)
  every = np.asarray(multihost_utils.process_allgather(mine))
  return [{str(r[0]): [int(r[1]), int(r[2])] for r in part} for part in every]


def train_dataset(
  data_config: ml_collections.ConfigDict,
  tokenizer: NanochatTokenizer,
  *,
  batch_size: int,
  seq_len: int,
  seed: int = 0,
  process_index: int = 0,
  process_count: int = 1,
  gather: Callable | None = None,
) -> grain.IterDataset:
  """This process's infinite packed batches (see the module docstring).

  Args:
    data_config: data config (see ``default_config``).
    tokenizer: from :func:`prepare`.
    batch_size: rows per batch on this process (the global batch / ``process_count``).
    seq_len: model context ``T``; rows have ``T + 1`` tokens.
    seed: unused (nanochat's order has none); kept for the task interface.
    process_index, process_count: this process and their number.
    gather: local positions -> every process's (tests); default: JAX's
      all-gather when ``process_count > 1``.

  Returns:
    A ``grain.IterDataset`` whose iterator gives dicts with ``tokens``
    (int32 ``[batch_size, seq_len + 1]``) and has ``get_state``/``set_state``.

  Raises:
    DataError: bad shards, ``streams`` or ``pop_rows`` (see :func:`_geometry`).
    ValueError: ``batch_size``/``seq_len`` < 1 or ``process_index`` out of range.
  """
  del seed
  if batch_size < 1 or seq_len < 1 or not 0 <= process_index < process_count:
    raise ValueError(
      f"need batch_size, seq_len >= 1 and 0 <= process_index < process_count, "
      f"got {batch_size}, {seq_len}, {process_index}, {process_count}"
    )
  w, r = _geometry(data_config, batch_size * process_count, process_count)
  groups = _stream_groups(data_config, "train", w)
  mine, keep = process_streams(w, batch_size * process_count, process_index, process_count)
  threads = int(data_config.encode_threads)
  if gather is None and process_count > 1:
    gather = _allgather_positions

  def make():
    streams = {s: TokenStream(groups[s], tokenizer, encode_threads=threads) for s in mine}
    pops = batch_size * process_count // w // r
    return _TrainIterator(streams, w, r, pops, seq_len, keep)

  ds = _TrainDataset(make)
  prefetch = int(data_config.prefetch or 0)
  if prefetch > 0:
    ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
  return _Gathering(ds, gather)


class _Gathering(grain.IterDataset):
  def __init__(self, parent: grain.IterDataset, gather: Callable | None):
    super().__init__(parent)
    self._gather = gather

  def __iter__(self):
    return _GatheredState(iter(self._parent), self._gather)


def eval_batches(
  data_config: ml_collections.ConfigDict,
  tokenizer: NanochatTokenizer,
  *,
  batch_size: int,
  seq_len: int,
  train_batch_size: int,
) -> Iterator[dict[str, np.ndarray]]:
  """The validation shard packed as the train stream, from its start, all streams.

  Each of the ``W`` validation streams (row groups ``s, s + W, ...`` of the
  last shard) pops ``R`` rows at a time (``W, R`` from the train batch, see
  :func:`_geometry`), pop-major: pop 0 of streams 0..W-1, then pop 1, ...;
  ``max_eval_tokens // (R T W)`` pops per stream (nanochat's ``eval_steps``;
  the stream repeats if the shard is short), or with ``max_eval_tokens``
  None until a stream runs out. The rows are cut into batches of
  ``batch_size``, the last padded with zero rows of mask 0.

  Returns:
    An iterator of dicts with ``tokens`` (int32 ``[batch_size, seq_len + 1]``)
    and ``mask`` (float32 ``[batch_size, seq_len]``).

  Raises:
    DataError: bad shards or settings, or not one pop of validation tokens.
  """
  w, r = _geometry(data_config, train_batch_size)
  groups = _stream_groups(data_config, "validation", w)
  cap = data_config.max_eval_tokens
  if cap is not None and (
    isinstance(cap, bool) or not isinstance(cap, int) or cap < r * seq_len * w
  ):
    raise DataError(
      f"--config.data.max_eval_tokens={cap!r} must be None (the validation "
      f"shard once) or an integer >= {r * seq_len * w} (one pop of each stream)."
    )
  pops = None if cap is None else cap // (r * seq_len * w)
  threads = int(data_config.encode_threads)
  streams = [
    TokenStream(g, tokenizer, repeat=cap is not None, encode_threads=threads) for g in groups
  ]
  return _eval_rows(streams, pops, r, seq_len, batch_size)


def _eval_rows(streams, pops, rows, seq_len, batch_size):
  buffer, done, p = [], False, 0
  while not done and (pops is None or p < pops):
    popped = [s.pop_rows(rows, seq_len) for s in streams]
    if any(x is None for x in popped):
      if p == 0:
        raise DataError(
          "The validation shard holds fewer tokens than one pop of each stream "
          f"({rows} x {seq_len} + 1); use a larger last shard, fewer rows per "
          "pop or a shorter context."
        )
      done = True
    else:
      buffer.extend(np.concatenate(popped))
      p += 1
    while len(buffer) >= batch_size or (done and buffer) or (pops == p and buffer):
      take, buffer = buffer[:batch_size], buffer[batch_size:]
      yield _padded(np.stack(take), batch_size, seq_len)


def _padded(tokens: np.ndarray, batch_size: int, seq_len: int) -> dict:
  n = len(tokens)
  mask = np.zeros((batch_size, seq_len), np.float32)
  mask[:n] = 1.0
  out = np.zeros((batch_size, seq_len + 1), np.int32)
  out[:n] = tokens
  return {"tokens": out, "mask": mask}
