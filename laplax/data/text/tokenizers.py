"""Tokenizers of the language-model pipeline: UTF-8 bytes, byte-level BPE, or nanochat's.

Typical use (``laplax.data.text.corpus.prepare`` does this and re-exports the names)::

  tok = tokenizers.make_tokenizer(cfg.data, train_texts)  # byte, or BPE trained on the texts
  ids = tok.encode("To be, or not")        # int32 [n]
  text = tok.decode(ids)                   # round-trips exactly
  tok = tokenizers.load_tokenizer(cfg.data, workdir)  # BPE: WORKDIR/tokenizer.json

``data.tokenizer="nanochat"`` is nanochat's GPT-4-style BPE with special
tokens (:mod:`laplax.data.text.nanochat_tokenizer`, saved as
``WORKDIR/nanochat_tokenizer.json``). All kinds have ``name``, ``vocab_size``, ``token_bytes`` (int32
[vocab_size], each token's UTF-8 byte length, for bits per byte; 0 for a
special token, whose loss bits per byte leaves out) and
``fingerprint`` (identifies the tokenizer in the token cache key).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import ml_collections
import numpy as np
import tokenizers  # HuggingFace tokenizers (absolute import: not this module)

from laplax.data.errors import DataError
from laplax.data.text.nanochat_tokenizer import NanochatTokenizer
from laplax.data.text.nanochat_tokenizer import tokenizer_path as nanochat_tokenizer_path
from laplax.utils import atomic_write, first_line

TOKENIZERS = ("byte", "bpe", "nanochat", "wordpiece")
#: The special tokens of the WordPiece tokenizer (BERT's), ids 0..4 in this order.
WORDPIECE_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"  # the BPE tokenizer, in the workdir
#: ``data.wordpiece_normalizer``, how a new WordPiece tokenizer reads text:
#: ``"cramming"`` is cramming's (JonasGeiping/cramming,
#: ``data/tokenizer_preparation.py``: ``_get_sane_normalizers`` with the
#: ``force_lowercase``, ``strip_accents`` and ``force_english_keyboard`` of its
#: The Pile and BookCorpus-Wikipedia configs; the ``Whitespace`` pre-tokenizer
#: of its ``WordPiece``; ``include_sep_token_in_corpus``: every encoded text
#: ends in ``[SEP]``). ``"bert"`` is what laplax trained before: Hugging
#: Face's ``BertNormalizer`` without lower-casing, ``BertPreTokenizer``, no
#: ``[SEP]``. A trained tokenizer keeps its rules in its ``tokenizer.json``.
WORDPIECE_NORMALIZERS = ("cramming", "bert")

_BYTE_TOKEN_BYTES = np.ones(256, np.int32)
_BYTE_TOKEN_BYTES.setflags(write=False)


class ByteTokenizer:
  """UTF-8 bytes as tokens: vocabulary 256; nothing to train or save.

  Attributes:
    name: ``"byte"``.
    vocab_size: 256.
    token_bytes: int32 [256], all ones.
    fingerprint: identifies the tokenizer in the token cache key.
  """

  name = "byte"
  vocab_size = 256
  token_bytes = _BYTE_TOKEN_BYTES
  fingerprint = "byte"

  def encode(self, text: str) -> np.ndarray:
    """``text`` -> int32 [number of UTF-8 bytes] token ids."""
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """``encode`` of each text: a list of int32 [n_i]."""
    return [self.encode(t) for t in texts]

  def decode(self, ids) -> str:
    """Int [n] token ids -> text; invalid UTF-8 becomes U+FFFD.

    Raises:
      ValueError: an id outside [0, 256).
    """
    ids = np.asarray(ids).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= 256):
      raise ValueError(f"byte token ids must be in [0, 256), got [{ids.min()}, {ids.max()}]")
    return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class BPETokenizer:
  """Byte-level BPE (HuggingFace ``tokenizers``, GPT-2 style pre-tokenisation).

  Ids 0..255 are the bytes, the rest learned merges; no special tokens. Every
  string round-trips exactly through ``encode``/``decode``.

  Attributes:
    name: ``"bpe"``.
    vocab_size: number of tokens.
    token_bytes: int32 [vocab_size], the UTF-8 byte length of each token.
    fingerprint: a hash of the vocabulary and merges, for the token cache key.
  """

  name = "bpe"

  def __init__(self, tokenizer: tokenizers.Tokenizer):
    self._tokenizer = tokenizer
    self.vocab_size = tokenizer.get_vocab_size()
    # Byte-level BPE spells each byte as one character, so a token's string
    # length is its byte length.
    self.token_bytes = np.array(
      [len(tokenizer.id_to_token(i)) for i in range(self.vocab_size)], np.int32
    )
    self.token_bytes.setflags(write=False)
    canonical = json.dumps(json.loads(tokenizer.to_str()), sort_keys=True)
    self.fingerprint = "bpe-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

  @classmethod
  def train(cls, texts: Sequence[str], vocab_size: int) -> BPETokenizer:
    """Learns ``vocab_size - 256`` merges on ``texts``.

    Raises:
      DataError: the texts support fewer than ``vocab_size`` tokens.
    """
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
      special_tokens=[],
      show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
      raise DataError(
        f"BPE learned only {tokenizer.get_vocab_size()} tokens from the train split but "
        f"--config.data.vocab_size={vocab_size}; lower it or use a larger corpus."
      )
    return cls(tokenizer)

  @classmethod
  def load(cls, path: str) -> BPETokenizer:
    """Reads a tokenizer written by :meth:`save`.

    Raises:
      DataError: the file is missing or not a tokenizer.
    """
    try:
      return cls(tokenizers.Tokenizer.from_file(path))
    except Exception as e:  # tokenizers raises plain Exception for bad JSON.
      raise DataError(
        f"Cannot load the BPE tokenizer {path} ({first_line(e)}); delete it to retrain it "
        "(a run resumed from this workdir then needs the old file back)."
      ) from None

  def save(self, path: str) -> None:
    """Writes the tokenizer to ``path`` (pretty JSON, as ``tokenizers``' own save), atomically."""
    from laplax import store

    if store.is_remote(path):  # a gs:// workdir: one upload
      store.write(path, self._tokenizer.to_str(pretty=True))
      return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, self._tokenizer.to_str(pretty=True))

  def encode(self, text: str) -> np.ndarray:
    """``text`` -> int32 [n] token ids."""
    return np.asarray(self._tokenizer.encode(text).ids, np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """``encode`` of each text (in parallel threads): a list of int32 [n_i]."""
    return [np.asarray(e.ids, np.int32) for e in self._tokenizer.encode_batch(list(texts))]

  def decode(self, ids) -> str:
    """Int [n] token ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
    return self._tokenizer.decode(np.asarray(ids).reshape(-1).tolist())


def cramming_normalizer() -> tokenizers.normalizers.Normalizer:
  """cramming's text normalisation for its WordPiece tokenizers.

  In its order: doubled backquotes and doubled apostrophes become a double
  quote, Unicode NFD, lower case, combining accents removed, runs of spaces
  become one, every non-ASCII character removed (``_get_sane_normalizers(force_english_keyboard=True,
  force_lowercase=True, strip_accents=True)``, JonasGeiping/cramming
  ``data/tokenizer_preparation.py``)."""
  n = tokenizers.normalizers
  return n.Sequence(
    [
      n.Replace("``", '"'),
      n.Replace("''", '"'),
      n.NFD(),
      n.Lowercase(),
      n.StripAccents(),
      n.Replace(tokenizers.Regex(" {2,}"), " "),
      n.Replace(tokenizers.Regex(r"[^\x00-\x7F]+"), ""),
    ]
  )


class WordPieceTokenizer(BPETokenizer):
  """BERT's WordPiece (HuggingFace ``tokenizers``' ``WordPiece`` model and
  ``WordPieceTrainer``; the normalisation, word splitting and ``[SEP]`` of
  :data:`WORDPIECE_NORMALIZERS`), for masked-LM pre-training
  (:mod:`laplax.tasks.mlm`). Ids 0..4 are
  :data:`WORDPIECE_SPECIAL` (``[PAD] [UNK] [CLS] [SEP] [MASK]``); saved as
  ``WORKDIR/tokenizer.json``, the file ``BertForMaskedLM`` directories carry.
  ``decode`` joins the word pieces (whitespace is not kept exactly). Training
  is not reproducible where pair counts tie (``tokenizers`` breaks ties in
  hash-map order): a run keeps its trained file, so it resumes exactly.

  Attributes:
    name: ``"wordpiece"``.
    vocab_size: number of pieces.
    fingerprint: a hash of the vocabulary, for the token cache key.
    token_bytes: int32 [vocab_size], the UTF-8 length of each piece without
      its ``##`` prefix; 0 for the special tokens.
    mask_id: 4, the id of ``[MASK]`` (``[PAD] [UNK] [CLS] [SEP]`` are 0..3).
  """

  name = "wordpiece"
  pad_id, unk_id, cls_id, sep_id, mask_id = range(len(WORDPIECE_SPECIAL))

  def __init__(self, tokenizer: tokenizers.Tokenizer):
    super().__init__(tokenizer)
    for i, token in enumerate(WORDPIECE_SPECIAL):
      if tokenizer.token_to_id(token) != i:
        raise DataError(
          f"the WordPiece tokenizer has {token} at id {tokenizer.token_to_id(token)}, not {i}; "
          "delete its tokenizer.json to retrain it"
        )
    pieces = [tokenizer.id_to_token(i) for i in range(self.vocab_size)]
    self.token_bytes = np.array(
      [0 if p in WORDPIECE_SPECIAL else len(p.removeprefix("##").encode()) for p in pieces],
      np.int32,
    )
    self.token_bytes.setflags(write=False)
    self.fingerprint = "wordpiece-" + self.fingerprint.split("-", 1)[1]

  @classmethod
  def train(
    cls, texts: Sequence[str], vocab_size: int, normalizer: str = "cramming"
  ) -> WordPieceTokenizer:
    """Learns a WordPiece vocabulary of ``vocab_size`` on ``texts``, reading
    text as ``normalizer`` (:data:`WORDPIECE_NORMALIZERS`) says.

    Raises:
      DataError: the texts support fewer than ``vocab_size`` pieces.
      ValueError: an unknown ``normalizer``.
    """
    if normalizer not in WORDPIECE_NORMALIZERS:
      raise ValueError(f"normalizer={normalizer!r}; use one of {WORDPIECE_NORMALIZERS}")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    if normalizer == "cramming":
      tokenizer.normalizer = cramming_normalizer()
      tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
      sep = WORDPIECE_SPECIAL.index("[SEP]")
      tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="$A [SEP]", special_tokens=[("[SEP]", sep)]
      )
    else:
      tokenizer.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=False)
      tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = tokenizers.decoders.WordPiece()
    trainer = tokenizers.trainers.WordPieceTrainer(
      vocab_size=vocab_size, special_tokens=list(WORDPIECE_SPECIAL), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
      raise DataError(
        f"WordPiece learned only {tokenizer.get_vocab_size()} pieces from the train split but "
        f"--config.data.vocab_size={vocab_size}; lower it or use a larger corpus."
      )
    return cls(tokenizer)


Tokenizer = ByteTokenizer | BPETokenizer | NanochatTokenizer | WordPieceTokenizer


def tokenizer_kind(data_config: ml_collections.ConfigDict) -> str:
  """``data_config.tokenizer`` (``"byte"``, ``"bpe"`` or ``"nanochat"``), with
  ``vocab_size`` checked for the trained kinds.

  Raises:
    DataError: unknown tokenizer name, or a ``vocab_size`` that is not an
      integer >= 256 (BPE) or >= 265 (nanochat: 256 bytes, 9 special tokens).
  """
  kind = _tokenizer_name(data_config)
  if kind != "byte":
    _bpe_vocab_size(data_config)
  return kind


def _tokenizer_name(data_config) -> str:
  kind = data_config.tokenizer
  if kind not in TOKENIZERS:
    raise DataError(
      f"Unknown tokenizer {kind!r}; valid names: {', '.join(TOKENIZERS)} (--config.data.tokenizer)."
    )
  return kind


def _bpe_vocab_size(data_config) -> int:
  size, kind = data_config.vocab_size, data_config.tokenizer
  least = {"nanochat": 265, "wordpiece": 16}.get(kind, 256)
  if isinstance(size, bool) or not isinstance(size, int) or size < least:
    what = {
      "nanochat": "256 bytes, 9 special tokens",
      "wordpiece": "5 special tokens, the characters and learned pieces",
    }.get(kind, "the 256 bytes plus learned merges")
    raise DataError(
      f"--config.data.vocab_size={size!r} must be an integer >= {least} for the {kind} "
      f"tokenizer ({what})."
    )
  return size


def _wordpiece_normalizer(data_config) -> str:
  normalizer = data_config.wordpiece_normalizer
  if normalizer not in WORDPIECE_NORMALIZERS:
    raise DataError(
      f"--config.data.wordpiece_normalizer={normalizer!r} is unknown; use one of "
      f"{', '.join(WORDPIECE_NORMALIZERS)}."
    )
  return normalizer


def tokenizer_path(workdir: str, kind: str = "bpe") -> str:
  """Where the trained tokenizer of a run lives: ``WORKDIR/tokenizer.json``
  (BPE) or ``WORKDIR/nanochat_tokenizer.json`` (``kind="nanochat"``)."""
  if kind == "nanochat":
    return nanochat_tokenizer_path(workdir)
  return os.path.join(os.path.expanduser(workdir), TOKENIZER_FILE)


def make_tokenizer(data_config: ml_collections.ConfigDict, texts: Sequence[str]) -> Tokenizer:
  """A new tokenizer of kind ``data_config.tokenizer``; writes nothing.

  Args:
    data_config: data config (see ``default_config``).
    texts: training texts; the BPE tokenizer learns its merges on them.

  Returns:
    A :class:`ByteTokenizer`, or a :class:`BPETokenizer` or
    :class:`NanochatTokenizer` of exactly ``data_config.vocab_size`` tokens.

  Raises:
    DataError: unknown tokenizer name, bad ``vocab_size``, or too little text
      for ``vocab_size``.
  """
  kind = tokenizer_kind(data_config)
  if kind == "byte":
    return ByteTokenizer()
  if kind == "nanochat":
    return NanochatTokenizer.train(texts, _bpe_vocab_size(data_config))
  if kind == "wordpiece":
    return WordPieceTokenizer.train(
      texts, _bpe_vocab_size(data_config), _wordpiece_normalizer(data_config)
    )
  return BPETokenizer.train(texts, _bpe_vocab_size(data_config))


def load_tokenizer(data_config: ml_collections.ConfigDict, workdir: str | None) -> Tokenizer:
  """The tokenizer of the run in ``workdir`` (trained there by :func:`prepare`).

  Args:
    data_config: data config (see ``default_config``).
    workdir: the run's directory; unused for the byte tokenizer.

  Returns:
    A :class:`ByteTokenizer`, or the :class:`BPETokenizer` read from
    ``WORKDIR/tokenizer.json``, or the :class:`NanochatTokenizer` read from
    ``WORKDIR/nanochat_tokenizer.json``.

  Raises:
    DataError: unknown tokenizer name; for BPE and nanochat, no readable
      tokenizer file in ``workdir`` or one whose vocabulary size is not
      ``data_config.vocab_size``.
  """
  kind = tokenizer_kind(data_config)
  if kind == "byte":
    return ByteTokenizer()
  vocab_size = _bpe_vocab_size(data_config)
  from laplax import store

  path = tokenizer_path(workdir, kind) if workdir is not None else None
  if path is None or not store.isfile(path):
    where = f"in workdir {workdir}" if workdir is not None else "without a workdir"
    raise DataError(
      f"No {'BPE' if kind == 'bpe' else kind} tokenizer "
      f"{os.path.basename(tokenizer_path('.', kind))} {where}; run "
      "laplax.data.text.corpus.prepare(config.data, workdir) (train.py does) first."
    )
  path = store.local_copy(path)  # gs://: read from a local copy
  if kind == "nanochat":
    tokenizer = NanochatTokenizer.from_path(path)
  elif kind == "wordpiece":
    try:
      tokenizer = WordPieceTokenizer(tokenizers.Tokenizer.from_file(path))
    except DataError:
      raise
    except Exception as e:  # tokenizers raises plain Exception for bad JSON.
      raise DataError(f"Cannot load the WordPiece tokenizer {path} ({first_line(e)}).") from None
  else:
    tokenizer = BPETokenizer.load(path)
  if tokenizer.vocab_size != vocab_size:
    raise DataError(
      f"{path} has {tokenizer.vocab_size} tokens but --config.data.vocab_size="
      f"{vocab_size}; set it to {tokenizer.vocab_size} or use a new --workdir."
    )
  return tokenizer
