"""nanochat's tokenizer: GPT-4-style byte-level BPE with nine special tokens.

Typical use::

  tok = NanochatTokenizer.train(texts, vocab_size=65536)   # rustbpe merges
  tok = NanochatTokenizer.from_path("~/.cache/nanochat/tokenizer")  # nanochat's tokenizer.pkl
  ids = tok.encode("Hello")                # int32 [n], special strings as plain text
  docs = tok.encode_documents(texts)       # each [BOS] + encode(text)
  tok.save(tokenizer_path(workdir))        # laplax's own file (JSON, no pickle)

The vocabulary (Karpathy's nanochat, ``nanochat/tokenizer.py`` and
``scripts/tok_train.py``, first release): ids 0..255 are the 256 bytes, ids
256..vocab_size - 10 the merges in the order they were learned (rustbpe: the
most frequent adjacent pair over the chunks of :data:`SPLIT_PATTERN`, ties
to the smallest pair), and the last nine ids the :data:`SPECIAL_TOKENS` in
that order (65527..65535 at nanochat's 65,536). Text is split by the GPT-4
pattern with numbers of at most two digits and encoded with ``tiktoken``;
every byte is a token, so every string round-trips. ``encode`` treats the
special strings as plain text (tiktoken's ``encode_ordinary``), as nanochat's
data loader does.

Bits per byte (nanochat's ``evaluate_bpb``) counts each target token as
``token_bytes[id]`` = the UTF-8 length of ``decode([id])`` (a token that is
not valid UTF-8 on its own decodes to U+FFFD, 3 bytes each) and 0 for the
special tokens, whose loss is then left out.

Files: laplax keeps the tokenizer as ``WORKDIR/nanochat_tokenizer.json``
(:meth:`NanochatTokenizer.save`). nanochat keeps it as ``tokenizer.pkl``, a
pickled ``tiktoken.Encoding``; :func:`read_tokenizer_pkl` reads that with an
unpickler that admits nothing but the encoding's plain data, so a pickle
that tries to run code is refused. ``python -m laplax.data.text.nanochat_tokenizer``
trains one on a directory of parquet shards (see :func:`main`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pickle
from collections.abc import Iterable, Sequence

import numpy as np
import tiktoken

from laplax.data.errors import DataError
from laplax.utils import atomic_write, first_line

SPECIAL_TOKENS = (
  "<|bos|>",  # begins every document
  "<|user_start|>",
  "<|user_end|>",
  "<|assistant_start|>",
  "<|assistant_end|>",
  "<|python_start|>",
  "<|python_end|>",
  "<|output_start|>",
  "<|output_end|>",
)
BOS = SPECIAL_TOKENS[0]
# GPT-4's split pattern with \p{N}{1,2} in place of \p{N}{1,3}.
SPLIT_PATTERN = (
  r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
  r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
TOKENIZER_FILE = "nanochat_tokenizer.json"  # laplax's own form, in the workdir
PICKLE_FILE = "tokenizer.pkl"  # nanochat's form, in its tokenizer directory
_FORMAT = "laplax.nanochat_tokenizer/1"
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


def tokenizer_path(workdir: str) -> str:
  """Where a run keeps its nanochat tokenizer: ``WORKDIR/nanochat_tokenizer.json``."""
  return os.path.join(os.path.expanduser(workdir), TOKENIZER_FILE)


class NanochatTokenizer:
  """nanochat's byte-level BPE, run by ``tiktoken``.

  Attributes:
    name: ``"nanochat"``.
    vocab_size: number of ids (merges + 256 bytes + 9 special tokens).
    bos_id: id of ``<|bos|>`` (``vocab_size - 9``).
    token_bytes: int32 [vocab_size]: UTF-8 length of ``decode([id])``
      (errors replaced), 0 for the special tokens (nanochat's bits per byte).
    fingerprint: hash of pattern, ranks and special tokens (token cache keys).
    encoding: the ``tiktoken.Encoding``.

  Raises (constructor):
    DataError: the ranks are not the 256 bytes plus merges with ids 0..n-1,
      or the special tokens are not :data:`SPECIAL_TOKENS` at ids n..n+8.
  """

  name = "nanochat"

  def __init__(self, encoding: tiktoken.Encoding):
    ranks, special = encoding._mergeable_ranks, encoding._special_tokens
    n = len(ranks)
    if sorted(ranks.values()) != list(range(n)) or any(
      ranks.get(bytes([b])) != b for b in range(256)
    ):
      raise DataError(
        "The tokenizer's ranks are not the 256 bytes (ids 0-255) plus merges "
        "with consecutive ids; it is not a nanochat tokenizer."
      )
    if special != {s: n + i for i, s in enumerate(SPECIAL_TOKENS)}:
      raise DataError(
        f"The tokenizer's special tokens are {sorted(special, key=special.get)}, "
        f"not nanochat's {list(SPECIAL_TOKENS)} at ids {n}..{n + 8}."
      )
    self.encoding = encoding
    self.vocab_size = n + len(SPECIAL_TOKENS)
    self.bos_id = n
    self.token_bytes = np.array(
      [len(encoding.decode([i]).encode("utf-8")) for i in range(n)] + [0] * len(SPECIAL_TOKENS),
      np.int32,
    )
    self.token_bytes.setflags(write=False)
    digest = hashlib.sha256(encoding._pat_str.encode())
    for token in sorted(ranks, key=ranks.get):
      digest.update(len(token).to_bytes(2, "little") + token)
    self.fingerprint = "nanochat-" + digest.hexdigest()[:16]

  # ----- construction ------------------------------------------------------

  @classmethod
  def from_ranks(cls, ranks: dict[bytes, int], pattern: str = SPLIT_PATTERN) -> NanochatTokenizer:
    """The tokenizer of ``ranks`` (token bytes -> id) with nanochat's special tokens after them."""
    special = {s: len(ranks) + i for i, s in enumerate(SPECIAL_TOKENS)}
    try:
      encoding = tiktoken.Encoding(
        name="rustbpe", pat_str=pattern, mergeable_ranks=dict(ranks), special_tokens=special
      )
    except Exception as e:  # tiktoken raises ValueError/AssertionError on bad input
      raise DataError(f"Cannot build the nanochat tokenizer ({first_line(e)}).") from None
    return cls(encoding)

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int) -> NanochatTokenizer:
    """Learns ``vocab_size - 265`` merges on ``texts`` with ``rustbpe``, as nanochat does.

    Args:
      texts: training documents (nanochat cuts each to 10,000 characters
        first; see :func:`training_texts`).
      vocab_size: total ids including the 256 bytes and 9 special tokens.

    Raises:
      DataError: ``vocab_size`` below 265, or too little text for it.
    """
    import rustbpe

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < _MIN_VOCAB:
      raise DataError(
        f"--config.data.vocab_size={vocab_size!r} must be an integer >= "
        f"{_MIN_VOCAB} for the nanochat tokenizer (256 bytes, 9 special tokens)."
      )
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(
      iter(texts), vocab_size - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN
    )
    ranks = {bytes(token): rank for token, rank in trainer.get_mergeable_ranks()}
    if len(ranks) + len(SPECIAL_TOKENS) != vocab_size:
      raise DataError(
        f"BPE learned only {len(ranks) - 256} merges from the training text but "
        f"--config.data.vocab_size={vocab_size} needs {vocab_size - _MIN_VOCAB}; lower it "
        "or train on more text."
      )
    return cls.from_ranks(ranks, trainer.get_pattern())

  @classmethod
  def from_path(cls, path: str) -> NanochatTokenizer:
    """Reads a tokenizer: laplax's ``nanochat_tokenizer.json``, nanochat's
    ``tokenizer.pkl``, or a directory holding either (the JSON first).

    Raises:
      DataError: nothing readable there, or not a nanochat tokenizer.
    """
    path = os.path.expanduser(path)
    if os.path.isdir(path):
      for name in (TOKENIZER_FILE, PICKLE_FILE):
        if os.path.isfile(os.path.join(path, name)):
          return cls.from_path(os.path.join(path, name))
      raise DataError(
        f"Tokenizer directory {path} has neither {TOKENIZER_FILE} nor "
        f"{PICKLE_FILE}; give nanochat's tokenizer directory or a laplax workdir."
      )
    if path.endswith(".pkl"):
      return cls(read_tokenizer_pkl(path))
    try:
      with open(path) as f:
        data = json.load(f)
      if data.get("format") != _FORMAT:
        raise ValueError(f"format {data.get('format')!r} is not {_FORMAT!r}")
      ranks = {base64.b64decode(t): i for i, t in enumerate(data["tokens"])}
      pattern = data["pattern"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise DataError(
        f"Cannot read the nanochat tokenizer {path} ({first_line(e)}); restore "
        "the file or use a new --workdir."
      ) from None
    return cls.from_ranks(ranks, pattern)

  # ----- files -------------------------------------------------------------

  def _ranked_tokens(self) -> list[bytes]:
    ranks = self.encoding._mergeable_ranks
    return sorted(ranks, key=ranks.get)

  def save(self, path: str) -> None:
    """Writes laplax's JSON form atomically: format, pattern, special tokens,
    and ``tokens``, the base64 bytes of ids 0..n-1 in id order."""
    data = {
      "format": _FORMAT,
      "pattern": self.encoding._pat_str,
      "special_tokens": list(SPECIAL_TOKENS),
      "tokens": [base64.b64encode(t).decode("ascii") for t in self._ranked_tokens()],
    }
    from laplax import store

    if store.is_remote(path):  # a gs:// workdir: one upload
      store.write(path, json.dumps(data, indent=0))
      return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, json.dumps(data, indent=0))

  def save_nanochat(self, directory: str) -> str:
    """Writes ``DIRECTORY/tokenizer.pkl`` as nanochat saves it (a pickled
    ``tiktoken.Encoding``); returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, PICKLE_FILE)
    atomic_write(path, pickle.dumps(self.encoding))
    return path

  # ----- encoding ----------------------------------------------------------

  def encode(self, text: str) -> np.ndarray:
    """``text`` -> int32 [n] ids; special-token strings are plain text."""
    return np.asarray(self.encoding.encode_ordinary(text), np.int32)

  def encode_batch(self, texts: Sequence[str], num_threads: int = 4) -> list[np.ndarray]:
    """``encode`` of each text (tiktoken's threads): a list of int32 [n_i]."""
    return [
      np.asarray(ids, np.int32)
      for ids in self.encoding.encode_ordinary_batch(list(texts), num_threads=num_threads)
    ]

  def encode_documents(self, texts: Sequence[str], num_threads: int = 4) -> list[np.ndarray]:
    """Each text as nanochat's data loader reads it: ``[bos_id] + encode(text)``, int32."""
    ids = self.encoding.encode_ordinary_batch(list(texts), num_threads=num_threads)
    return [np.asarray([self.bos_id] + row, np.int32) for row in ids]

  def decode(self, ids) -> str:
    """Int [n] ids -> text (invalid UTF-8 becomes U+FFFD; special ids their names).

    Raises:
      ValueError: an id outside [0, vocab_size).
    """
    ids = np.asarray(ids).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
      raise ValueError(
        f"token ids must be in [0, {self.vocab_size}), got [{ids.min()}, {ids.max()}]"
      )
    return self.encoding.decode(ids.tolist())


# --------------------------------------------------------------------------
# nanochat's tokenizer.pkl, read without running code.


class _EncodingState:
  """Stands in for ``tiktoken.core.Encoding`` while unpickling: records the
  state nanochat's pickle carries and runs nothing."""

  state = None

  def __setstate__(self, state):
    self.state = state


class _TiktokenUnpickler(pickle.Unpickler):
  """An unpickler that resolves one global, ``tiktoken.core.Encoding``, to
  :class:`_EncodingState`; every other global is refused."""

  def find_class(self, module, name):
    if (module, name) == ("tiktoken.core", "Encoding"):
      return _EncodingState
    raise pickle.UnpicklingError(
      f"it refers to {module}.{name}, which a tiktoken encoding does not contain"
    )


def read_tokenizer_pkl(path: str) -> tiktoken.Encoding:
  """nanochat's ``tokenizer.pkl`` (a pickled ``tiktoken.Encoding``) as an encoding.

  The pickle is read by an unpickler that admits only the encoding class
  (replaced by an inert stand-in) and plain containers: a pickle naming any
  other global (``os.system``, ...) is refused before anything runs. The
  recorded state must be ``{"name": str, "pat_str": str, "mergeable_ranks":
  {bytes: int}, "special_tokens": {str: int}}``; the encoding is then built
  from it.

  Raises:
    DataError: unreadable file, a refused or malformed pickle (one line,
      naming the file and saying how to export the tokenizer instead).
  """
  fix = (
    "export a copy you trust as laplax's nanochat_tokenizer.json (docs/language-models.md, "
    '"nanochat\'s d20") or train one with `python -m laplax.data.text.nanochat_tokenizer`'
  )
  try:
    with open(path, "rb") as f:
      loaded = _TiktokenUnpickler(io.BytesIO(f.read())).load()
  except OSError as e:
    raise DataError(f"Cannot read the tokenizer {path} ({e.strerror}).") from None
  except Exception as e:  # any malformed pickle: UnpicklingError, EOFError, ...
    raise DataError(f"Refused the tokenizer pickle {path}: {first_line(e)}; {fix}.") from None
  state = loaded.state if isinstance(loaded, _EncodingState) else None
  ok = (
    isinstance(state, dict)
    and set(state) <= {"name", "pat_str", "mergeable_ranks", "special_tokens", "explicit_n_vocab"}
    and isinstance(state.get("name"), str)
    and isinstance(state.get("pat_str"), str)
    and isinstance(state.get("mergeable_ranks"), dict)
    and all(isinstance(k, bytes) and type(v) is int for k, v in state["mergeable_ranks"].items())
    and isinstance(state.get("special_tokens"), dict)
    and all(isinstance(k, str) and type(v) is int for k, v in state["special_tokens"].items())
  )
  if not ok:
    raise DataError(
      f"The pickle {path} is not a tiktoken encoding's data (name, pat_str, "
      f"mergeable_ranks, special_tokens); {fix}."
    )
  try:
    return tiktoken.Encoding(
      name=state["name"],
      pat_str=state["pat_str"],
      mergeable_ranks=state["mergeable_ranks"],
      special_tokens=state["special_tokens"],
    )
  except Exception as e:  # tiktoken's own checks
    raise DataError(
      f"The tokenizer pickle {path} is not a usable encoding ({first_line(e)}); {fix}."
    ) from None


# --------------------------------------------------------------------------
# Training on parquet shards.


def training_texts(documents: Iterable[str], max_chars: int, doc_cap: int = 10_000):
  """nanochat's tokenizer-training text: each document cut to ``doc_cap``
  characters, stopping after the document that takes the total past ``max_chars``."""
  seen = 0
  for text in documents:
    text = text[:doc_cap]
    seen += len(text)
    yield text
    if seen > max_chars:
      return


def main(argv: Sequence[str] | None = None) -> int:
  """``python -m laplax.data.text.nanochat_tokenizer --source_dir DIR --out OUT``.

  Trains nanochat's tokenizer on the train shards of ``DIR`` (sorted
  ``*.parquet``, all but the last, in row-group order) and writes
  ``OUT/nanochat_tokenizer.json`` and ``OUT/tokenizer.pkl``; train.py takes
  it with ``--config.data.tokenizer_dir=OUT``. Options ``--vocab_size``
  (65536), ``--max_chars`` (2,000,000,000, nanochat's speedrun),
  ``--doc_cap`` (10,000). Returns the exit code: 0, or 2 with one error line.
  """
  import argparse
  import sys

  from laplax.data.text import fineweb_shards

  parser = argparse.ArgumentParser(
    prog="python -m laplax.data.text.nanochat_tokenizer", description=main.__doc__.split("\n\n")[1]
  )
  parser.add_argument("--source_dir", required=True, help="directory of *.parquet shards")
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--vocab_size", type=int, default=65536)
  parser.add_argument("--max_chars", type=int, default=2_000_000_000)
  parser.add_argument("--doc_cap", type=int, default=10_000)
  args = parser.parse_args(argv)
  try:
    shards = fineweb_shards.list_shards(args.source_dir)
    texts = training_texts(fineweb_shards.iter_documents(shards[:-1]), args.max_chars, args.doc_cap)
    tokenizer = NanochatTokenizer.train(texts, args.vocab_size)
    tokenizer.save(os.path.join(args.out, TOKENIZER_FILE))
    tokenizer.save_nanochat(args.out)
  except (DataError, OSError) as e:
    print(f"error: {first_line(e)}", file=sys.stderr)
    return 2
  print(f"wrote {tokenizer.vocab_size}-token nanochat tokenizer to {args.out}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
