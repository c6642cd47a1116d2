"""GLUE fine-tuning of a pre-trained BERT (Wang et al. 2019), with cramming's recipe.

:class:`GLUETask` is the ``"glue"`` entry of :data:`laplax.tasks.TASKS`: one
of the nine GLUE tasks (``glue.task``, :data:`TASKS`) read from TFDS's
``glue/*`` builders (``tfds.data_source`` on array_record files in
``data.data_dir``; no TensorFlow), each example encoded as BERT's ``[CLS] a
[SEP] b [SEP]`` with the WordPiece tokenizer of the pre-trained run
(``WORKDIR/tokenizer.json``, copied from ``config.init_from``), cut to
``data.max_length`` tokens by removing the last token of the longer
sentence (Hugging Face's ``longest_first``). The model is the pre-trained
:class:`~laplax.models.bert.BERT` with its pooled classifier
(``num_labels``; 1 for STS-B's regression), pooled as ``glue.pooler``
(cramming's ``arch_modifications.classification_head.pooler: zero_index``:
token 0), with cramming's fine-tuning dropout (its ``eval_in_train_mode``):
``glue.dropout`` on the embeddings, residual branches and classifier
(``hidden_dropout_prob``), ``glue.attention_dropout`` on the attention
probabilities (``attention.dropout_prob``), 0.1 each.

Loss: softmax cross-entropy (mean squared error for STS-B). Evaluation
(:meth:`GLUETask.evaluate`) on ``validation`` (MNLI: ``validation_matched``
and, suffix ``_mm``, ``validation_mismatched``), scored with the official
metric of the task (:func:`scores`, as Hugging Face ``evaluate``'s
``glue`` metric that cramming's ``eval.py`` uses). :func:`glue_average` is
cramming's GLUE average (``eval.py``'s ``GLUE_amean``) of those scores.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tensorflow_datasets as tfds
import tokenizers
from ml_collections import config_dict

from laplax.config import defaults
from laplax.config import validation as config_lib
from laplax.data.errors import DataError
from laplax.models import spec as spec_lib
from laplax.models.bert import BERT
from laplax.tasks.base import TaskBase, counted, model_spec

#: glue.task -> (TFDS text features, number of labels (1: regression),
#: eval splits by score suffix, cramming's target metrics in its average).
#: Features and splits: TFDS ``glue`` (``tensorflow_datasets/text/glue.py``);
#: targets: cramming ``config/eval/tasks/*.yaml`` ``target_metrics``.
TASKS = {
  "cola": (("sentence",), 2, {"": "validation"}, ("matthews_correlation",)),
  "sst2": (("sentence",), 2, {"": "validation"}, ("accuracy",)),
  "mrpc": (("sentence1", "sentence2"), 2, {"": "validation"}, ("f1",)),
  "qqp": (("question1", "question2"), 2, {"": "validation"}, ("f1",)),
  "stsb": (("sentence1", "sentence2"), 1, {"": "validation"}, ("pearson",)),
  "mnli": (
    ("premise", "hypothesis"),
    3,
    {"": "validation_matched", "_mm": "validation_mismatched"},
    ("accuracy", "accuracy_mm"),
  ),
  "qnli": (("question", "sentence"), 2, {"": "validation"}, ("accuracy",)),
  "rte": (("sentence1", "sentence2"), 2, {"": "validation"}, ("accuracy",)),
  "wnli": (("sentence1", "sentence2"), 2, {"": "validation"}, ("accuracy",)),
}
#: The tasks of cramming's GLUE average (its ``eval/GLUE_sane.yaml``: WNLI left out).
AVERAGED = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb")
#: Training examples of each task (TFDS ``glue`` 2.0.0's ``train`` split; the
#: configs derive ``total_steps`` from them).
TRAIN_EXAMPLES = {
  "cola": 8551,
  "sst2": 67349,
  "mrpc": 3668,
  "qqp": 363846,
  "stsb": 5749,
  "mnli": 392702,
  "qnli": 104743,
  "rte": 2490,
  "wnli": 635,
}
POOLERS = ("cls", "mean")


# --------------------------------------------------------------------------
# Metrics (NumPy; float64).


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
  """Share of ``predictions`` equal to ``labels`` (int ``[n]`` each)."""
  return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1(labels: np.ndarray, predictions: np.ndarray) -> float:
  """F1 of the positive class 1: ``2 TP / (2 TP + FP + FN)`` (0 when
  ``TP + FP + FN = 0``, as scikit-learn's ``f1_score(zero_division=0)``)."""
  y, p = np.asarray(labels) == 1, np.asarray(predictions) == 1
  tp, fp, fn = np.sum(y & p), np.sum(~y & p), np.sum(y & ~p)
  return float(2 * tp / (2 * tp + fp + fn)) if tp + fp + fn else 0.0


def matthews_correlation(labels: np.ndarray, predictions: np.ndarray) -> float:
  """Matthews (1975) correlation of binary ``labels`` and ``predictions``:
  ``(TP TN - FP FN) / sqrt((TP + FP)(TP + FN)(TN + FP)(TN + FN))``, 0 when a
  factor of the denominator is 0 (scikit-learn's ``matthews_corrcoef``)."""
  y, p = np.asarray(labels) == 1, np.asarray(predictions) == 1
  tp, tn = float(np.sum(y & p)), float(np.sum(~y & ~p))
  fp, fn = float(np.sum(~y & p)), float(np.sum(y & ~p))
  denominator = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
  return (tp * tn - fp * fn) / math.sqrt(denominator) if denominator else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson's correlation ``cov(x, y) / (std x std y)`` of float ``[n]`` arrays."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denominator = math.sqrt(float(np.sum(x * x) * np.sum(y * y)))
  return float(np.sum(x * y) / denominator) if denominator else 0.0


def average_ranks(x: np.ndarray) -> np.ndarray:
  """Ranks 1..n of ``x [n]``, ties given the mean of their ranks (float64)."""
  _, inverse, counts = np.unique(np.asarray(x), return_inverse=True, return_counts=True)
  last = np.cumsum(counts).astype(np.float64)
  return (last - (counts - 1) / 2.0)[inverse.reshape(-1)]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman's rank correlation: :func:`pearson` of the :func:`average_ranks`;
  NaN when ``x`` or ``y`` holds a NaN (a diverged model's predictions), as
  SciPy's ``spearmanr`` (``nan_policy="propagate"``) that Hugging Face's
  metric calls, not the finite rank of a NaN."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if np.isnan(x).any() or np.isnan(y).any():
    return math.nan
  return pearson(average_ranks(x), average_ranks(y))


def scores(task: str, labels: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
  """The official GLUE metrics of ``task`` (those of Hugging Face
  ``evaluate``'s ``glue`` metric): CoLA ``matthews_correlation``; STS-B
  ``pearson`` and ``spearmanr``; MRPC and QQP ``f1`` and ``accuracy``; the
  others ``accuracy``.

  Args:
    task: a key of :data:`TASKS`.
    labels: ``[n]`` int classes (STS-B: float similarities).
    outputs: ``[n]`` predicted classes (STS-B: predicted similarities).
  """
  if task == "stsb":
    return {"pearson": pearson(outputs, labels), "spearmanr": spearman(outputs, labels)}
  out = {"accuracy": accuracy(labels, outputs)}
  if task == "cola":
    return {"matthews_correlation": matthews_correlation(labels, outputs)}
  if task in ("mrpc", "qqp"):
    out["f1"] = f1(labels, outputs)
  return out


def glue_average(results: Mapping[str, Mapping[str, float]]) -> float:
  """cramming's GLUE average (``eval.py``'s ``GLUE_amean``): the mean of the
  target metrics (:data:`TASKS`) of the :data:`AVERAGED` tasks, CoLA's
  Matthews correlation, MNLI's matched and mismatched accuracy, MRPC's and
  QQP's F1, STS-B's Pearson and the others' accuracy (9 numbers; WNLI left out).

  Args:
    results: task -> its :func:`scores` (as ``eval.json``'s ``glue`` entry).

  Raises:
    KeyError: a task of :data:`AVERAGED` or one of its metrics is missing.
  """
  values = [float(results[t][m]) for t in AVERAGED for m in TASKS[t][3]]
  return float(np.mean(values))


# --------------------------------------------------------------------------
# Data.


def encode_pairs(
  tokenizer: tokenizers.Tokenizer, columns: list[list[str]], max_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """BERT's input of one or two sentences per example.

  ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``, the pair cut to
  ``max_length`` by dropping the last token of the longer sentence until it
  fits (Hugging Face ``truncation="longest_first"``), padded with ``[PAD]``.

  Args:
    tokenizer: a WordPiece tokenizer with ``[CLS]``, ``[SEP]`` and ``[PAD]``.
    columns: one or two lists of ``n`` texts.
    max_length: tokens per example (>= 2 per sentence + 1).

  Returns:
    ``(tokens, types, mask)``, int32 ``[n, max_length]`` each: the ids, the
    segment (0 for ``[CLS] a [SEP]``, 1 for ``b [SEP]``) and 1 for a real token.
  """
  cls, sep, pad = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
  encoded = [
    [e.ids for e in tokenizer.encode_batch(list(c), add_special_tokens=False)] for c in columns
  ]
  n = len(columns[0])
  tokens = np.full((n, max_length), pad, np.int32)
  types = np.zeros((n, max_length), np.int32)
  mask = np.zeros((n, max_length), np.int32)
  budget = max_length - 1 - len(columns)
  for i in range(n):
    parts = [list(c[i]) for c in encoded]
    while sum(map(len, parts)) > budget:
      longest = max(range(len(parts)), key=lambda j: (len(parts[j]), j))  # ties: the second
      parts[longest].pop()
    row, seg = [cls], [0]
    for j, part in enumerate(parts):
      row += part + [sep]
      seg += [j] * (len(part) + 1)
    tokens[i, : len(row)], types[i, : len(row)], mask[i, : len(row)] = row, seg, 1
  return tokens, types, mask


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def open_split(data_config: ml_collections.ConfigDict, task: str, split: str):
  """The TFDS data source of ``glue/TASK`` ``split`` in ``data.data_dir``.

  Raises:
    DataError: not prepared or unreadable (one line with the fix).
  """
  import tensorflow_datasets.text.glue  # noqa: F401  (registers glue/*, without TensorFlow)

  name, data_dir = f"glue/{task}", os.path.expanduser(data_config.data_dir)
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises AssertionError, ValueError, ... here
    raise DataError(
      f"cannot read split {split!r} of TFDS {name!r} in {data_dir} "
      f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}); prepare it "
      f"on a machine with internet (`tfds build glue/{task} --data_dir=DIR "
      f"--file_format=array_record`) and set --config.data.data_dir=DIR"
    ) from None


def data_config() -> ml_collections.ConfigDict:
  """The ``data`` keys: the TFDS folder of the prepared ``glue/*`` builders
  and the tokens per example (cramming's ``max_seq_length``: 128)."""
  d = ml_collections.ConfigDict()
  d.name = "glue"
  d.data_dir = "~/tensorflow_datasets"
  d.source_dir = "~/tensorflow_datasets"
  d.max_length = 128
  d.vocab_size = 32768  # taken from config.init_from (the pre-trained tokenizer)
  d.tokenizer = "wordpiece"
  return d


def base_config() -> ml_collections.ConfigDict:
  """:func:`laplax.config.defaults.bert_base_config`'s model turned into GLUE
  fine-tuning with cramming's recipe (``JonasGeiping/cramming``,
  ``config/eval/GLUE_sane.yaml`` and ``eval/optim/adam.yaml``): AdamW lr
  4e-5, betas (0.9, 0.98), eps 1e-6, no weight decay, no gradient clipping,
  batch 16, 5 epochs, linear warm-up over 10% of the steps then cosine decay
  to 0, 128 tokens, token-0 pooler, dropout 0.1 on the hidden states and on
  the attention probabilities (its ``eval_in_train_mode``, ``arch/crammed-bert.yaml``'s
  ``hidden_dropout_prob`` and ``attention.dropout_prob``)."""
  c = defaults.bert_base_config()
  c.task = "glue"
  c.evals = "glue"
  c.data = data_config()
  del c.mlm
  c.glue = ml_collections.ConfigDict()
  c.glue.task = "cola"
  c.glue.pooler = "cls"
  c.glue.dropout = 0.1
  c.glue.attention_dropout = 0.1
  c.batch_size = 16
  c.eval_batch_size = 128
  c.optim.lr = 4e-5
  c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.98, 1e-6
  c.optim.weight_decay = 0.0
  del c.optim.grad_clip  # cramming's eval config: no clipping (a null key)
  c.optim.grad_clip = config_dict.placeholder(float)
  c.optim.schedule = "cosine"
  c.optim.min_lr_ratio = 0.0
  epochs = 5
  c.total_steps = epochs * math.ceil(TRAIN_EXAMPLES["cola"] / c.batch_size)
  c.optim.warmup_steps = c.total_steps // 10
  c.eval_every = c.total_steps
  c.checkpoint_every = 500
  return c


class GLUETask(TaskBase):
  """One GLUE task with the pooled classifier of :class:`~laplax.models.bert.BERT`.

  Batches: ``{"tokens", "types", "mask"}`` int32 ``[B, max_length]``
  (:func:`encode_pairs`) and ``"label"`` float32 ``[B]`` (a class, or
  STS-B's similarity in [0, 5]); eval batches also ``"weight"`` float32
  ``[B]`` (1 = a real example).

  Args:
    config: the run's config.
    tokenizer: the pre-trained run's ``tokenizers.Tokenizer`` (``None``:
      only sizes, from :meth:`from_shapes`).
    vocab_size: embedding rows (default: the tokenizer's).
  """

  family = "bert"
  base_config = staticmethod(base_config)
  #: Parameters a pre-trained masked-LM run has not, or has that this model
  #: has not (:func:`laplax.train.finetune.initial_params`).
  init_fresh = ("pooler", "classifier")
  init_dropped = ("mlm_dense", "mlm_norm", "mlm_bias")

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """``glue.task``, ``glue.pooler``, ``glue.dropout`` and ``data.max_length``.

    Raises:
      ConfigError: one line naming the key and the fix.
    """
    task = config_lib.get(config, "glue.task")
    config_lib.require(
      task in TASKS, f"config.glue.task={task!r} is unknown; use one of {', '.join(TASKS)}"
    )
    pooler = config_lib.get(config, "glue.pooler")
    config_lib.require(
      pooler in POOLERS,
      f"config.glue.pooler={pooler!r} is unknown; use one of {', '.join(POOLERS)}",
    )
    config_lib.check_float(config, "glue.dropout", 0.0, 1.0)
    config_lib.check_float(config, "glue.attention_dropout", 0.0, 0.99)
    config_lib.check_int(config, "data.max_length", 5)
    n, m = config.data.max_length, config.model.max_length
    config_lib.require(
      n <= m, f"config.data.max_length={n} exceeds config.model.max_length={m}; lower it"
    )

  @classmethod
  def attention_lengths(cls, config, image_side=None) -> tuple[int, ...]:
    """``data.max_length``."""
    del image_side
    return (int(config.data.max_length),)

  def __init__(
    self,
    config,
    tokenizer: tokenizers.Tokenizer | None,
    vocab_size=None,
    *,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    self.config = config
    self.spec = model_spec(config, spec)
    self.tokenizer = tokenizer
    self.name = config.glue.task
    self.features, self.num_labels, self.eval_splits, self.targets = TASKS[self.name]
    self.length = int(config.data.max_length)
    vocab = vocab_size or (tokenizer.get_vocab_size() if tokenizer else config.data.vocab_size)
    attention = dataclasses.replace(
      self.spec.attention, attention_dropout=float(config.glue.attention_dropout)
    )
    spec = dataclasses.replace(
      self.spec,
      pooler=config.glue.pooler,
      dropout=float(config.glue.dropout),
      attention=attention,
    )
    self.model = BERT(spec, vocab_size=int(vocab), num_labels=self.num_labels)

  @classmethod
  def from_shapes(cls, config, *, image_shape=None, num_classes=None, vocab_size=None, spec=None):
    """The task for ``vocab_size`` tokens (default ``data.vocab_size``), no data read."""
    del image_shape, num_classes
    return cls(config, None, vocab_size or int(config.data.vocab_size), spec=spec)

  @classmethod
  def from_data(
    cls,
    config: ml_collections.ConfigDict,
    workdir: str | None,
    *,
    spec: spec_lib.TransformerSpec | None = None,
  ):
    """Reads the tokenizer (``WORKDIR/tokenizer.json``, else that of
    ``config.init_from``) and opens the training split once.

    Raises:
      DataError: no tokenizer, or the split cannot be read.
    """
    places = [d for d in (workdir, config.init_from) if d]
    paths = [os.path.join(os.path.expanduser(d), "tokenizer.json") for d in places]
    path = next((p for p in paths if os.path.isfile(p)), None)
    if path is None:
      raise DataError(
        "GLUE fine-tuning reads the pre-trained run's tokenizer.json; set "
        "--config.init_from=WORKDIR of a masked-LM run (or a laplax.convert --from hf-bert one)"
      )
    tokenizer = tokenizers.Tokenizer.from_file(path)
    missing = [t for t in ("[CLS]", "[SEP]", "[PAD]") if tokenizer.token_to_id(t) is None]
    if missing:
      raise DataError(f"{path} has no {missing[0]} token; GLUE needs a BERT WordPiece tokenizer")
    task = cls(config, tokenizer, spec=spec)
    task._source("train")
    return task

  def _source(self, split: str):
    cache = self.__dict__.setdefault("_sources", {})
    if split not in cache:
      cache[split] = open_split(self.config.data, self.name, split)
    return cache[split]

  def _encode(self, rows: list[dict]) -> dict:
    columns = [[_text(r[f]) for r in rows] for f in self.features]
    tokens, types, mask = encode_pairs(self.tokenizer, columns, self.length)
    label = np.asarray([r["label"] for r in rows], np.float32)
    return {"tokens": tokens, "types": types, "mask": mask, "label": label}

  def tokens_per_example(self) -> int:
    """``data.max_length``."""
    return self.length

  def data_limits(self) -> list[tuple]:
    """The batch against the training examples."""
    n = len(self._source("train"))
    return [("the training split", n, "examples", "train", "batch_size", self.config.batch_size)]

  def train_dataset(self, process_index: int = 0, process_count: int = 1):
    """Infinite batches of training examples, reshuffled each epoch by
    ``(seed, epoch)`` (a grain dataset with ``get_state``/``set_state``), this
    process's share."""
    source = self._source("train")
    n, seed = len(source), int(self.config.seed)
    per_process = self.config.batch_size // process_count
    order = functools.lru_cache(maxsize=2)(
      lambda epoch: np.random.default_rng((seed, epoch)).permutation(n)
    )

    def batch(b):
      rows = []
      for j in range(per_process):
        epoch, pos = divmod((b * per_process + j) * process_count + process_index, n)
        rows.append(int(order(epoch)[pos]))
      return self._encode([source[i] for i in rows])

    return grain.MapDataset.range(0, 2**40).map(batch).to_iter_dataset()

  def _batches(self, split: str) -> Iterator[dict]:
    source, size = self._source(split), int(self.config.eval_batch_size)
    for start in range(0, len(source), size):
      rows = [source[i] for i in range(start, min(start + size, len(source)))]
      k = len(rows)
      batch = self._encode(rows + [rows[-1]] * (size - k))
      batch["weight"] = (np.arange(size) < k).astype(np.float32)
      yield batch

  def eval_batches(self) -> Iterator[dict]:
    """Every example of the (first) eval split once, the last batch padded (weight 0)."""
    return self._batches(self.eval_splits[""])

  def batch_spec(self, batch_size: int) -> dict:
    """``jax.ShapeDtypeStruct`` per field of a training batch."""
    shape = (batch_size, self.length)
    spec = {k: jax.ShapeDtypeStruct(shape, jnp.int32) for k in ("tokens", "types", "mask")}
    return dict(spec, label=jax.ShapeDtypeStruct((batch_size,), jnp.float32))

  def init(self, rng: jax.Array) -> Any:
    """Initial parameters from ``rng`` (encoder, pooler and classifier)."""
    tokens = jnp.zeros((1, self.length), jnp.int32)
    return self.model.init({"params": rng}, tokens, tokens, tokens + 1)["params"]

  def _outputs(self, params, batch, train, rng=None):
    rngs = {"dropout": rng} if rng is not None else None
    logits, _ = self.model.apply(
      {"params": params},
      batch["tokens"],
      batch["types"],
      batch["mask"],
      train=train,
      rngs=rngs,
    )
    return logits.astype(jnp.float32)

  def _losses(self, logits, label):
    if self.num_labels == 1:
      return jnp.square(logits[:, 0] - label)
    return optax.softmax_cross_entropy_with_integer_labels(logits, label.astype(jnp.int32))

  def loss(self, params, batch, rng, task_state=None, step=None):
    """Mean cross-entropy (STS-B: squared error) and ``(metrics, None)``."""
    del task_state, step
    logits = self._outputs(params, batch, True, rng)
    loss = self._losses(logits, batch["label"]).mean()
    return loss, ({"loss": loss}, None)

  def readout(self, state: Any) -> np.ndarray:
    """The classifier ``[num_labels, pooler_dim]``."""
    return np.asarray(state.params["classifier"]["kernel"]).T

  def predict(self, params, batch) -> dict:
    """``{"output": [B] predicted class or similarity, "loss": [B]}`` (jitted per task)."""
    logits = self._outputs(params, batch, False)
    output = logits[:, 0] if self.num_labels == 1 else jnp.argmax(logits, -1).astype(jnp.float32)
    return {"output": output, "loss": self._losses(logits, batch["label"])}

  @functools.cached_property
  def _predict(self):
    return jax.jit(self.predict)

  def evaluate(self, state: Any, place=None) -> dict:
    """The task's :func:`scores` on each eval split (MNLI mismatched with the
    suffix ``_mm``), the mean ``loss`` and ``num_examples``; a
    :class:`DataError` for an eval split with no example."""
    out = {}
    for suffix, split in self.eval_splits.items():
      labels, outputs, losses = [], [], []
      for batch in self._batches(split):
        keep = batch["weight"] > 0
        got = jax.device_get(self._predict(state.params, place(batch) if place else batch))
        labels.append(batch["label"][keep])
        outputs.append(np.asarray(got["output"])[keep])
        losses.append(np.asarray(got["loss"])[keep])
      counted({"count": sum(len(x) for x in labels)}, what=f"example of {split}")
      labels, outputs = np.concatenate(labels), np.concatenate(outputs)
      if self.num_labels > 1:
        labels, outputs = labels.astype(np.int64), outputs.astype(np.int64)
      for key, value in scores(self.name, labels, outputs).items():
        out[key + suffix] = value
      out["loss" + suffix] = float(np.mean(np.concatenate(losses)))
      out["num_examples" + suffix] = int(len(labels))
    return out


def main(argv: list[str]) -> int:
  """``python -m laplax.tasks.glue WORKDIR...``: prints, as JSON, cramming's
  GLUE average (:func:`glue_average`) of the fine-tuned runs (one per task of
  :data:`AVERAGED`; ``glue.task`` from each ``config.json``, its scores from
  the ``eval.json`` that ``eval.py`` wrote) and each task's scores.
  Exits 2 with one line when a file or a task is missing."""
  results = {}
  for workdir in argv:
    try:
      with open(os.path.join(os.path.expanduser(workdir), "config.json")) as f:
        task = json.load(f)["glue"]["task"]
      with open(os.path.join(os.path.expanduser(workdir), "eval.json")) as f:
        results[task] = json.load(f)
    except (OSError, ValueError, KeyError, TypeError) as e:
      print(f"{workdir}: no GLUE config.json and eval.json ({type(e).__name__}); run eval.py on it")
      return 2
  missing = [t for t in AVERAGED if t not in results]
  if missing:
    print(f"no run of {', '.join(missing)}; the GLUE average needs {', '.join(AVERAGED)}")
    return 2
  try:
    average = glue_average(results)
  except KeyError as e:
    print(f"an eval.json lacks the score {e}; rerun eval.py with config.evals=glue")
    return 2
  print(json.dumps({"glue_average": average, "tasks": results}))
  return 0


if __name__ == "__main__":
  import sys

  sys.exit(main(sys.argv[1:]))
