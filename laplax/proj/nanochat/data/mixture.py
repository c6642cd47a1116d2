"""The input of nanochat's chat stages: mid-training and SFT (supervised fine-tuning).

Both read their conversations from local files in the published formats
(:mod:`laplax.proj.nanochat.data.sources`) under one directory, ``data.source_dir``,
laid out as the Hugging Face repositories are (:data:`SOURCES`), and follow
Karpathy's nanochat (first release, ``scripts/mid_train.py``,
``scripts/chat_sft.py``, ``tasks/common.py``):

* **the mixture** (:func:`mixture`): each data set in the order of
  ``shuffle(seed=42)`` (:func:`~laplax.proj.nanochat.data.sources.shuffled`), cut to
  its first ``stop`` conversations where nanochat cuts it, then the list of
  every ``(data set, index)`` pair shuffled by Python's
  ``random.Random(42).shuffle`` (nanochat's ``TaskMixture``). Mid-training
  (``data.name="chat_mid"``): SmolTalk train + MMLU ``auxiliary_train`` +
  GSM8K main train; validation SmolTalk test + MMLU ``all`` test[:5200] +
  GSM8K test[:420]. SFT (``"chat_sft"``): ARC-Easy train + ARC-Challenge
  train + GSM8K train + SmolTalk train[:10,000] (``data.smoltalk_stop``);
  validation SmolTalk test. With ``data.sft_mixture="nanochat-fork"``, SFT's
  is instead the Laplacian authors' fork's (``yuchongzhang/nanochat``
  1f70b557, ``scripts/chat_sft.py``): SmolTalk train + MMLU
  ``auxiliary_train`` x 3 + GSM8K main train x 4 (each repeat one more set
  in the list, as its ``TaskMixture``), validation mid-training's (SmolTalk
  test + MMLU test[:5200] + GSM8K test[:420]). Only the mixture: the fork's
  best-fit packing of several conversations per row is not laplax's
  one-conversation rows.
* **mid-training batches** (:func:`train_dataset`): packed as pretraining
  packs documents, with **no loss mask**. Stream ``s`` of ``W``
  (``data.streams``, nanochat's ranks) renders the mixture's conversations
  ``s, s + W, s + 2W, ...`` (modulo its length: the stream goes round again
  as nanochat's cursor does) with :func:`~laplax.proj.nanochat.data.render.render_conversation`
  (cut to ``data.max_conversation_tokens``, nanochat's 2048) into one
  first-in-first-out token stream; a pop takes ``R T + 1`` tokens (``R`` =
  ``data.pop_rows``, default ``B / W``) and row ``i`` is tokens ``i T .. i T
  + T``. A batch is the streams' rows in stream order (``{"tokens": int32
  [B, T + 1]}``, the model reads ``tokens[:, :-1]`` and predicts every
  ``tokens[:, 1:]``).
* **SFT batches** (:func:`sft_rows`): row ``r`` of batch ``k`` is
  conversation ``(k B + r) mod N`` of the mixture (nanochat's rank ``g`` of
  ``W`` takes conversations ``g, g + W, ...``, so rank ``g``'s micro-batch
  is rows ``g, g + W, ...``: exactly laplax's micro-batch ``g`` with
  ``optim.grad_accum_steps = W``). A conversation of ids ``x`` and mask
  ``m`` (``n`` tokens, rendered to at most ``min(max_conversation_tokens,
  T + 1)``) gives inputs ``x[:n-1]`` then ``<|assistant_end|>`` up to ``T``
  and targets ``t_j = x[j+1] if m[j+1] else -1`` then ``-1``:
  ``{"tokens": int32 [B, T + 1], "targets": int32 [B, T]}`` (``tokens[:,
  T]`` is padding, never read). nanochat pads each micro-batch to its
  longest conversation minus one; padding further to ``T`` changes no
  valid position's logits (attention is causal) and adds only targets -1,
  so the loss, the mean over targets ``!= -1`` of each micro-batch
  (:class:`~laplax.tasks.language_model.LanguageModelTask`), is the same.

Evaluation batches (``eval_batches``): mid-training, the validation
mixture packed the same way (each of the ``W`` streams ``max_eval_tokens //
(R T W)`` pops, or until a stream runs out), mask 1 on every target;
SFT, the first ``data.max_eval_conversations`` validation conversations as
SFT rows with mask ``targets != -1``. Both give ``{"tokens", "mask"}`` as the
pretraining pipelines do.

Resume: a mid-training iterator's state is ``{"streams": W, "positions":
{stream: [conversations taken, token offset]}}`` (several processes:
gathered from all), an SFT iterator's ``{"batches": k}``; ``set_state``
re-renders one conversation per stream, so a resumed run sees exactly the
tokens of the uninterrupted one.

The tokenizer is the run's (``WORKDIR/nanochat_tokenizer.json``, which
``train.py`` copies from ``config.init_from``) and must have nanochat's
special tokens. Bad input is a :class:`~laplax.data.errors.DataError`, one
line: a missing split (the expected path shown), a malformed JSON line, a
parquet file without the expected column, a tokenizer without the chat
special tokens, bad ``streams`` / ``pop_rows``.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable, Iterator

import grain
import ml_collections
import numpy as np
from ml_collections import config_dict

from laplax import utils
from laplax.data.errors import DataError
from laplax.data.text import fineweb
from laplax.data.text.tokenizers import load_tokenizer, tokenizer_kind
from laplax.proj.nanochat.data import sources as chat_sources
from laplax.proj.nanochat.data.render import MAX_TOKENS, chat_tokens, render_conversation

MID, SFT = "chat_mid", "chat_sft"
#: ``data.sft_mixture``: nanochat's first release, or the Laplacian authors' fork.
SFT_MIXTURES = ("nanochat", "nanochat-fork")
_FORK_SFT = "chat_sft:nanochat-fork"
#: ``data.name`` of the two chat stages.
NAMES = (MID, SFT)
MIXTURE_SEED = 42  # nanochat's TaskMixture: random.Random(42).shuffle
#: ``data.source_dir``'s default: ``$LAPLAX_DATA/chat`` (``~/.cache/laplax/chat``).
DEFAULT_SOURCE_DIR = os.path.join(os.environ.get("LAPLAX_DATA", "~/.cache/laplax"), "chat")


@dataclasses.dataclass(frozen=True)
class Source:
  """One published data set: ``subsets`` (directory names tried in turn by
  :func:`~laplax.proj.nanochat.data.sources.find_split`), the example ``layout`` shown
  in errors, and the reader (files -> conversations)."""

  subsets: tuple[str, ...]
  layout: str
  reader: Callable[[list[str]], list[dict]]


#: The data sets of the two stages, by name; ``{split}`` in a layout is the split.
SOURCES = {
  "smoltalk": Source(
    ("smol-smoltalk/data", "smol-smoltalk"),
    "smol-smoltalk/data/{split}-00000-of-00001.parquet",
    chat_sources.smoltalk,
  ),
  "mmlu_auxiliary": Source(
    ("auxiliary_train",), "mmlu/auxiliary_train/{split}-00000-of-00001.parquet", chat_sources.mmlu
  ),
  "mmlu": Source(("all",), "mmlu/all/{split}-00000-of-00001.parquet", chat_sources.mmlu),
  "gsm8k": Source(("main",), "gsm8k/main/{split}-00000-of-00001.parquet", chat_sources.gsm8k),
  "arc_easy": Source(
    ("ARC-Easy",), "ai2_arc/ARC-Easy/{split}-00000-of-00001.parquet", chat_sources.arc
  ),
  "arc_challenge": Source(
    ("ARC-Challenge",), "ai2_arc/ARC-Challenge/{split}-00000-of-00001.parquet", chat_sources.arc
  ),
}

# (source, split, stop) per stage and split, as nanochat's scripts list them;
# stop "smoltalk_stop" is read from the data config.
MIXTURES = {
  (MID, "train"): (
    ("smoltalk", "train", None),
    ("mmlu_auxiliary", "train", None),
    ("gsm8k", "train", None),
  ),
  (MID, "validation"): (("smoltalk", "test", None), ("mmlu", "test", 5200), ("gsm8k", "test", 420)),
  (SFT, "train"): (
    ("arc_easy", "train", None),
    ("arc_challenge", "train", None),
    ("gsm8k", "train", None),
    ("smoltalk", "train", "smoltalk_stop"),
  ),
  (SFT, "validation"): (("smoltalk", "test", None),),
  (_FORK_SFT, "train"): (
    ("smoltalk", "train", None),
    *[("mmlu_auxiliary", "train", None)] * 3,
    *[("gsm8k", "train", None)] * 4,
  ),
  (_FORK_SFT, "validation"): (
    ("smoltalk", "test", None),
    ("mmlu", "test", 5200),
    ("gsm8k", "test", 420),
  ),
}


def default_config(name: str = MID) -> ml_collections.ConfigDict:
  """A chat-stage data config with every key this module reads.

  Keys: ``name`` (``"chat_mid"`` or ``"chat_sft"``), ``data_dir`` (not read
  here; every config has it), ``source_dir`` (the data directory,
  :data:`SOURCES`; default :data:`DEFAULT_SOURCE_DIR`), ``tokenizer`` (``"nanochat"``), ``vocab_size``,
  ``max_conversation_tokens`` (nanochat's 2048), ``streams`` and
  ``pop_rows`` (mid-training, as FineWeb-Edu's), ``max_eval_tokens``
  (mid-training; None: the validation mixture once),
  ``max_eval_conversations`` (SFT; None: all), ``smoltalk_stop`` (SFT's
  SmolTalk train[:10,000]), ``sft_mixture`` (SFT: ``"nanochat"``, or
  ``"nanochat-fork"``: the fork's mixture, see the module).
  """
  return ml_collections.ConfigDict(
    {
      "name": name,
      "data_dir": "~/tensorflow_datasets",
      "source_dir": DEFAULT_SOURCE_DIR,
      "tokenizer": "nanochat",
      "vocab_size": 65536,
      "max_conversation_tokens": MAX_TOKENS,
      "streams": 1,
      "pop_rows": config_dict.placeholder(int),
      "max_eval_tokens": config_dict.placeholder(int),
      "max_eval_conversations": config_dict.placeholder(int),
      "smoltalk_stop": 10_000,
      "sft_mixture": "nanochat",
    }
  )


def mixture_key(data_config, split: str) -> tuple[str, str]:
  """The :data:`MIXTURES` key of ``data.name``'s ``split`` (``data.sft_mixture``
  chooses SFT's).

  Raises:
    DataError: an unknown ``sft_mixture``, or another than nanochat's for
      mid-training (which has one).
  """
  choice = data_config.sft_mixture
  if choice not in SFT_MIXTURES:
    raise DataError(
      f"config.data.sft_mixture={choice!r} is unknown; use {' or '.join(SFT_MIXTURES)}"
    )
  if choice != "nanochat" and data_config.name != SFT:
    raise DataError(
      f"config.data.sft_mixture={choice!r} is for SFT (data.name={SFT!r}); "
      f"{data_config.name} has nanochat's mixture only"
    )
  return (_FORK_SFT if choice == "nanochat-fork" else data_config.name, split)


def split_files(data_config, source: str, split: str) -> list[str]:
  """The files of ``split`` of ``source`` under ``data.source_dir``.

  Raises:
    DataError: no such split (the expected path shown).
  """
  root = data_config.source_dir or DEFAULT_SOURCE_DIR
  s = SOURCES[source]
  for subset in s.subsets[:-1]:
    try:
      return chat_sources.find_split(root, subset, split, s.layout.format(split=split))
    except DataError:
      pass
  return chat_sources.find_split(root, s.subsets[-1], split, s.layout.format(split=split))


_CACHE: dict = {}


def mixture(data_config, split: str) -> list[dict]:
  """The conversations of ``data.name``'s ``split`` (``"train"`` or
  ``"validation"``) in nanochat's mixed order (see the module docstring);
  read once per process (cached by the files' paths and sizes).

  Raises:
    DataError: see :func:`split_files` and the readers of
      :mod:`~laplax.proj.nanochat.data.sources`; an empty mixture.
  """
  parts = []
  for source, part, stop in MIXTURES[mixture_key(data_config, split)]:
    if isinstance(stop, str):
      stop = data_config[stop]
    files = split_files(data_config, source, part)
    parts.append((source, tuple((f, os.path.getsize(f), os.path.getmtime(f)) for f in files), stop))
  key = tuple(parts)
  if key not in _CACHE:
    sets, read = [], {}
    for part in parts:  # a set repeated (the fork's epochs) is read once
      source, files, stop = part
      if part not in read:
        items = chat_sources.shuffled(SOURCES[source].reader([f for f, _, _ in files]))
        read[part] = items if stop is None else items[:stop]
      sets.append(read[part])
    index = [(t, i) for t, items in enumerate(sets) for i in range(len(items))]
    random.Random(MIXTURE_SEED).shuffle(index)
    if not index:
      raise DataError(
        f"The {data_config.name} {split} mixture under "
        f"{data_config.source_dir} holds no conversation."
      )
    while len(_CACHE) >= 4:  # a run's train and validation mixtures, and a few more
      _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = [sets[t][i] for t, i in index]
  return _CACHE[key]


def prepare(data_config, workdir: str | None, *, batch_size: int | None = None):
  """The run's tokenizer (``WORKDIR/nanochat_tokenizer.json``), checked for
  the chat special tokens, and (given ``batch_size``) the streams against the
  batch. Reads no conversation (:func:`check` does, before training).

  Raises:
    DataError: a tokenizer other than nanochat's (a byte or BPE run as
      ``init_from``), none in the workdir, bad ``streams``/``pop_rows``.
  """
  if data_config.name not in NAMES:
    raise DataError(
      f"config.data.name={data_config.name!r} is not a chat stage ({', '.join(NAMES)})."
    )
  mixture_key(data_config, "train")
  if tokenizer_kind(data_config) != "nanochat":
    raise DataError(
      f"The tokenizer ({data_config.tokenizer}) has no chat special tokens; "
      "mid-training and SFT need a run trained with "
      "--config.data.tokenizer=nanochat as config.init_from."
    )
  tokenizer = load_tokenizer(data_config, workdir)
  chat_tokens(tokenizer)
  if batch_size is not None and data_config.name == MID:
    fineweb._geometry(data_config, batch_size)
  return tokenizer


def check(data_config, tokenizer, seq_len: int | None = None) -> None:
  """Reads (and caches) both splits' conversations, so that bad files stop
  ``train.py`` before it writes anything; for SFT with ``seq_len`` (``T``,
  ``model.max_length``) also checks that each split has a trainable target.

  A conversation trains on the assistant tokens that survive the render
  limit (:func:`render_limit`); when no training conversation keeps one the
  run would train nothing (loss and gradient 0 at every step), and when none
  of the evaluated validation conversations (``data.max_eval_conversations``)
  keeps one the evaluation counts no target. Each split's conversations are
  rendered in order until one has a target (all of them only to refuse).

  Raises:
    DataError: see :func:`mixture`; an SFT split without a trainable target
      (naming the keys that limit the rendered conversations).
  """
  for split in ("train", "validation"):
    items = mixture(data_config, split)
    if data_config.name != SFT or seq_len is None:
      continue
    if split == "validation" and data_config.max_eval_conversations is not None:
      items = items[: data_config.max_eval_conversations]
    limit = render_limit(data_config, seq_len)
    if not any(np.any(render_conversation(tokenizer, c, limit)[1][1:] == 1) for c in items):
      what = "training" if split == "train" else "evaluated validation"
      raise DataError(
        f"No conversation of the SFT {what} split ({len(items)}) keeps an assistant "
        f"token to train on within its first {limit} tokens "
        f"(min(config.data.max_conversation_tokens={data_config.max_conversation_tokens}, "
        f"config.model.max_length + 1={seq_len + 1})): the run would train "
        f"nothing; raise config.data.max_conversation_tokens (nanochat: {MAX_TOKENS}) "
        f"or config.model.max_length."
      )


def render_limit(data_config, seq_len: int) -> int:
  """Tokens kept of a rendered conversation: ``max_conversation_tokens``, and
  for SFT at most ``seq_len + 1`` (the inputs are all but the last)."""
  cap = int(data_config.max_conversation_tokens)
  return min(cap, seq_len + 1) if data_config.name == SFT else cap


class ConversationStream(fineweb.TokenStream):
  """Stream ``stream`` of ``streams`` of the conversations: their rendered
  ids, first in first out (mid-training; :class:`laplax.data.text.fineweb.TokenStream`'s
  ``take`` and ``pop_rows`` over conversations instead of row groups).

  Attributes:
    position: ``[conversations taken, token offset]``, the next token.
  """

  def __init__(
    self, conversations, tokenizer, stream: int, streams: int, max_tokens: int, repeat: bool = True
  ):
    self._items, self._tok = conversations, tokenizer
    self._stream, self._streams, self._max = stream, streams, max_tokens
    self._repeat = repeat
    self._loaded, self._tokens = -1, np.zeros(0, np.int32)
    self.position = [0, 0]

  def _load(self, k: int) -> bool:
    if k != self._loaded:
      index = self._stream + k * self._streams
      if not self._repeat and index >= len(self._items):
        return False
      self._tokens = render_conversation(
        self._tok, self._items[index % len(self._items)], self._max
      )[0]
      self._loaded = k
    return True


def sft_rows(
  rendered: list[tuple[np.ndarray, np.ndarray]], seq_len: int, pad_id: int
) -> dict[str, np.ndarray]:
  """SFT rows of rendered conversations (see the module docstring).

  Args:
    rendered: ``(ids, mask)`` per conversation, at most ``seq_len + 1`` ids each.
    seq_len: ``T``.
    pad_id: ``<|assistant_end|>``'s id.

  Returns:
    ``{"tokens": int32 [n, T + 1], "targets": int32 [n, T]}``.
  """
  tokens = np.full((len(rendered), seq_len + 1), pad_id, np.int32)
  targets = np.full((len(rendered), seq_len), -1, np.int32)
  for i, (ids, mask) in enumerate(rendered):
    n = len(ids)
    tokens[i, : n - 1] = ids[:-1]
    targets[i, : n - 1] = np.where(np.asarray(mask[1:]) == 1, ids[1:], -1)
  return {"tokens": tokens, "targets": targets}


class _MidIterator(fineweb._TrainIterator):
  """Mid-training batches of this process's streams (state: their positions),
  as FineWeb-Edu's; only the message of a position of another run differs."""

  def set_state(self, state: dict) -> None:
    positions = state.get("positions", {}) if isinstance(state, dict) else {}
    if state.get("streams") != self._num or not all(str(i) in positions for i in self._streams):
      raise DataError(
        f"The checkpoint's data position is not of this run's "
        f"{self._num} mid-training streams (--config.data.streams); resume "
        "with the run's settings or use a new --workdir."
      )
    for i, stream in self._streams.items():
      stream.position = [int(v) for v in positions[str(i)]]


class _SFTIterator(grain.DatasetIterator):
  """SFT batches: this process's rows of batch ``k`` (state: ``k``)."""

  def __init__(
    self,
    conversations,
    tokenizer,
    rows: int,
    first: int,
    global_rows: int,
    seq_len: int,
    max_tokens: int,
  ):
    super().__init__()
    self._items, self._tok, self._rows, self._first = conversations, tokenizer, rows, first
    self._global, self._seq_len, self._max = global_rows, seq_len, max_tokens
    self._pad = chat_tokens(tokenizer)["<|assistant_end|>"]
    self._batches = 0

  def __next__(self) -> dict:
    start = self._batches * self._global + self._first
    rendered = [
      render_conversation(self._tok, self._items[(start + i) % len(self._items)], self._max)
      for i in range(self._rows)
    ]
    self._batches += 1
    return sft_rows(rendered, self._seq_len, self._pad)

  def get_state(self) -> dict:
    return {"batches": self._batches}

  def set_state(self, state: dict) -> None:
    if not isinstance(state, dict) or not isinstance(state.get("batches"), int):
      raise DataError(
        "The checkpoint's data position is not an SFT run's; resume with "
        "the run's config or use a new --workdir."
      )
    self._batches = state["batches"]


def train_dataset(
  data_config,
  tokenizer,
  *,
  batch_size: int,
  seq_len: int,
  process_index: int = 0,
  process_count: int = 1,
  gather: Callable | None = None,
) -> grain.IterDataset:
  """This process's infinite training batches (``batch_size`` rows, its part
  of the global batch; see the module docstring).

  Args:
    gather: mid-training, local stream positions -> every process's (tests);
      default JAX's all-gather with several processes.

  Raises:
    DataError: see :func:`mixture`, :func:`prepare`.
  """
  items = mixture(data_config, "train")
  limit = render_limit(data_config, seq_len)
  if data_config.name == SFT:
    return fineweb._TrainDataset(
      lambda: _SFTIterator(
        items,
        tokenizer,
        batch_size,
        process_index * batch_size,
        batch_size * process_count,
        seq_len,
        limit,
      )
    )
  w, r = fineweb._geometry(
    data_config,
    batch_size * process_count,
    process_count,
  )
  mine, keep = fineweb.process_streams(w, batch_size * process_count, process_index, process_count)
  pops = batch_size * process_count // w // r

  def make():
    streams = {s: ConversationStream(items, tokenizer, s, w, limit) for s in mine}
    return _MidIterator(streams, w, r, pops, seq_len, keep)

  if gather is None and process_count > 1:
    gather = fineweb._allgather_positions
  return fineweb._Gathering(fineweb._TrainDataset(make), gather)


def eval_batches(
  data_config, tokenizer, *, batch_size: int, seq_len: int, train_batch_size: int
) -> Iterator[dict]:
  """The validation batches, ``{"tokens": int32 [batch_size, T + 1], "mask":
  float32 [batch_size, T]}`` (see the module docstring; the last batch padded
  with rows of mask 0).

  Raises:
    DataError: see :func:`mixture`; a validation mixture shorter than one pop
      of each stream; a bad ``max_eval_tokens``.
  """
  items = mixture(data_config, "validation")
  limit = render_limit(data_config, seq_len)
  if data_config.name == MID:
    w, r = fineweb._geometry(data_config, train_batch_size)
    cap = data_config.max_eval_tokens
    if cap is not None and (
      isinstance(cap, bool) or not isinstance(cap, int) or cap < r * seq_len * w
    ):
      raise DataError(
        f"--config.data.max_eval_tokens={cap!r} must be None (the validation "
        f"mixture once) or an integer >= {r * seq_len * w} (one pop of each "
        "stream)."
      )
    streams = [
      ConversationStream(items, tokenizer, s, w, limit, repeat=cap is not None) for s in range(w)
    ]
    pops = None if cap is None else cap // (r * seq_len * w)
    return fineweb._eval_rows(streams, pops, r, seq_len, batch_size)
  return _sft_eval(items, tokenizer, data_config, batch_size, seq_len, limit)


def _sft_eval(items, tokenizer, data_config, batch_size, seq_len, limit):
  cap = data_config.max_eval_conversations
  items = items if cap is None else items[:cap]
  pad = chat_tokens(tokenizer)["<|assistant_end|>"]
  for start in range(0, len(items), batch_size):
    chunk = [render_conversation(tokenizer, c, limit) for c in items[start : start + batch_size]]
    rows = sft_rows(chunk, seq_len, pad)
    tokens = np.full((batch_size, seq_len + 1), pad, np.int32)
    mask = np.zeros((batch_size, seq_len), np.float32)
    for i, (ids, _) in enumerate(chunk):  # the targets are tokens[:, 1:] where mask is 1
      tokens[i, : len(ids)] = ids
    mask[: len(chunk)] = rows["targets"] >= 0
    yield {"tokens": tokens, "mask": mask}


def epoch_steps(data_config, tokenizer, *, batch_size: int, seq_len: int) -> int:
  """Mid-training steps of one epoch of the train mixture: the fewest whole
  pops (``R T + 1`` tokens) any stream's conversations fill, over the pops a
  step takes of each stream (nanochat stops when the first stream's cursor
  goes round; its count can differ by a step, its pops being drawn ahead).
  Renders every conversation once.

  Raises:
    DataError: see :func:`mixture`, :func:`prepare`.
  """
  items = mixture(data_config, "train")
  w, r = fineweb._geometry(data_config, batch_size)
  limit = render_limit(data_config, seq_len)
  tokens = [
    sum(len(render_conversation(tokenizer, items[i], limit)[0]) for i in range(s, len(items), w))
    for s in range(w)
  ]
  return min(tokens) // (r * seq_len + 1) // (batch_size // w // r)


def main(argv: list[str] | None = None) -> int:
  """``python -m laplax.proj.nanochat.data.mixture --workdir W [--config FILE.py]
  [--source_dir DIR]``: the conversations of the mid-training mixture and the
  steps of one epoch (:func:`epoch_steps`) at the config's batch and
  context, with the tokenizer of workdir ``W`` (the pretrained run)."""
  import argparse
  import sys

  parser = argparse.ArgumentParser(description="One epoch of nanochat's mid-training mixture.")
  parser.add_argument("--workdir", required=True, help="the run whose tokenizer renders it")
  parser.add_argument("--config", default="configs/gpt_d20_mid.py")
  parser.add_argument("--source_dir", default=None, help="default: the config's")
  args = parser.parse_args(argv)
  try:
    config = utils.config_from_file(args.config)
    if args.source_dir:
      config.data.source_dir = args.source_dir
    tokenizer = prepare(config.data, args.workdir, batch_size=config.batch_size)
    steps = epoch_steps(
      config.data, tokenizer, batch_size=config.batch_size, seq_len=config.model.max_length
    )
  except (DataError, OSError) as e:
    print(str(e).splitlines()[0] if str(e) else type(e).__name__, file=sys.stderr)
    return 2
  print(
    f"{len(mixture(config.data, 'train'))} conversations; one epoch = {steps} steps "
    f"of {config.batch_size} x {config.model.max_length} (--config.total_steps={steps})"
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
