"""Evaluators chosen by name: ``config.evals``.

A run's evaluations are the comma-separated names in ``config.evals`` (as
big_vision's ``config.evals`` names its evaluators; here one name per
evaluator, its settings in the config's ``eval`` section). The training loop
runs those whose :attr:`Evaluator.stages` hold ``"train"`` at every
``eval_every`` steps and at the last step (their numbers are the ``eval``
records of ``metrics.jsonl``); ``eval.py`` runs those that hold ``"eval"``
and writes their numbers into ``eval.json``. Both build the list with
:func:`build`, so the two cannot drift apart.

======================  ==============  ===========  ======================================
name                    task            stages       what it reports
======================  ==============  ===========  ======================================
``classification``      classification  train, eval  ``accuracy``, ``loss``, ``num_examples``
``bits_per_byte``       lm              train, eval  ``loss``, ``perplexity``,
                                                     ``bits_per_byte``, ``num_tokens``
``samples``             lm              train        the text ``sample``
                                                     (``eval.sample_tokens``)
``multiple_choice``     lm              eval         ``choices_accuracy``, ``num_questions``
                                                     (added by ``eval.py --choices FILE``)
``knn``                 dino            train, eval  ``knn_accuracy``, ``num_examples``
``linear_probe``        dino            train, eval  ``linear_probe_accuracy``
``raw_pixel_knn``       dino            eval         ``raw_pixel_knn_accuracy``
``segmentation``        dino            eval         ``segmentation_*``
                                                     (:mod:`laplax.evaluators.dino_segmentation`)
``patch_pca``           dino            eval         the figure ``patch_pca.png``
======================  ==============  ===========  ======================================

Which names a task accepts is its class's ``evaluator_names``, and its
default list the ``evals`` of its base config, so the config is checked
without this module. A run saved before ``config.evals`` existed gets the
list its old switches meant (:func:`names`,
:meth:`laplax.tasks.base.TaskBase.saved_evals`).

Adding an evaluator is one class here (or in its own module) and one entry
in :data:`EVALUATORS`, and its name in the task's ``evaluator_names``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, ClassVar

import ml_collections
import numpy as np

from laplax.evaluators import probes
from laplax.config import validation as config_lib
from laplax.evaluators import dino_segmentation, lm_samples
from laplax.tasks.base import Task

#: The stage of the training loop's evaluations.
TRAIN = "train"
#: The stage of ``eval.py``.
EVAL = "eval"
#: File name of the patch-feature PCA picture (``patch_pca``).
PCA_FIGURE = "patch_pca.png"
#: File name of the segmentation probe's picture (``segmentation``).
SEGMENTATION_FIGURE = "segmentation.png"


@dataclasses.dataclass
class Context:
  """What one evaluation round gives its evaluators.

  Attributes:
    place: maps a host batch to device arrays (the trainer's
      :func:`laplax.sharding.whole_batch`); ``None``: batches as they are.
    out_dir: the directory for figures (``eval.py``'s workdir or ``--out``'s
      directory); ``None`` (the training loop): no figures.
    say: prints a line for the user.
    mesh: a device mesh for evaluators that split batches over devices
      (``eval.py`` passes one over every device; ``None``: the default device).
    figures: paths of the figures written in this round (evaluators append).
    cache: values shared within one round (the DINO teacher's features, which
      ``knn``, ``linear_probe`` and ``patch_pca`` use), by key.
    tokens: patch tokens of this many eval images are kept with the eval
      split's features (:func:`run` sets it: ``patch_pca``'s
      :meth:`Evaluator.tokens_wanted`), so one pass gives all of them.
  """
  place: Callable | None = None
  out_dir: str | None = None
  say: Callable[[str], Any] = print
  mesh: Any = None
  figures: list[str] = dataclasses.field(default_factory=list)
  cache: dict = dataclasses.field(default_factory=dict)
  tokens: int = 0


class Evaluator:
  """One named evaluation of a task's :class:`~laplax.state.TrainState`.

  Subclasses set :attr:`name` and :attr:`stages`, may read or check their
  data in :meth:`prepare` (called for every evaluator of a list before any of
  them computes, so bad data fails before anything is computed or written),
  and return their numbers from :meth:`run` and their text from :meth:`texts`.
  """
  name: ClassVar[str]
  #: Where it runs: :data:`TRAIN` (the training loop), :data:`EVAL` (``eval.py``).
  stages: ClassVar[tuple[str, ...]] = (TRAIN, EVAL)

  def __init__(self, task: Task):
    self.task = task
    self.config = task.config

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """Checks the evaluator's own settings in ``config`` (none here).

    Raises:
      ConfigError: the first bad key, with its fix.
    """

  def prepare(self) -> None:
    """Reads and checks what :meth:`run` needs (nothing here).

    Raises:
      DataError, ConfigError: the evaluator's data cannot be used.
    """

  def run(self, state: Any, ctx: Context) -> dict:
    """The evaluator's numbers (JSON scalars, or lists of them) for ``state``."""
    raise NotImplementedError

  def texts(self, state: Any) -> dict[str, str]:
    """Text the model generates, by name (none here)."""
    del state
    return {}

  def tokens_wanted(self, ctx: Context) -> int:
    """Eval images whose patch tokens this evaluator needs (none here)."""
    del ctx
    return 0


class EvalSums(Evaluator):
  """The task's summed eval-split metrics (:meth:`laplax.tasks.base.TaskBase.evaluate`):
  for classification accuracy, loss (nats) and ``num_examples``; for a
  language model loss (nats per token), perplexity, bits per byte and
  ``num_tokens``."""

  def run(self, state: Any, ctx: Context) -> dict:
    return self.task.evaluate(state, ctx.place)


class Classification(EvalSums):
  """``classification``: top-1 accuracy and cross-entropy on the eval split."""
  name = "classification"


class BitsPerByte(EvalSums):
  """``bits_per_byte``: next-token loss, perplexity and bits per byte on the
  validation split (nanochat's ``bpb``)."""
  name = "bits_per_byte"


class Samples(Evaluator):
  """``samples``: ``{"sample": text}``, the first ``eval.sample_prompt_tokens``
  tokens of the validation text (at most half the context) continued by
  ``eval.sample_tokens`` greedily decoded tokens
  (:func:`laplax.evaluators.lm_samples.greedy_sample`). The same prompt at
  every evaluation, so a run's samples show its text change; none when
  ``eval.sample_tokens`` is 0. Training only (``eval.py --sample`` samples)."""
  name = "samples"
  stages = (TRAIN,)

  def run(self, state: Any, ctx: Context) -> dict:
    del state, ctx
    return {}

  def texts(self, state: Any) -> dict[str, str]:
    e = self.config.eval
    if e.sample_tokens <= 0:
      return {}
    k = max(1, min(int(e.sample_prompt_tokens), self.task.seq_len // 2))
    prompt = next(iter(self.task.eval_batches()))["tokens"][0, :k]
    return {"sample": lm_samples.greedy_sample(self.task.model, state.params,
                                               self.task.tokenizer, prompt, e.sample_tokens)}


class MultipleChoice(Evaluator):
  """``multiple_choice``: accuracy on a JSON-lines file of questions by summed
  log-likelihood of each choice (:func:`laplax.evaluators.lm_samples.score_choices`).
  ``eval.py --choices FILE`` adds it, with the file's items."""
  name = "multiple_choice"
  stages = (EVAL,)

  def __init__(self, task: Task, items: list[dict]):
    super().__init__(task)
    self.items = items

  def run(self, state: Any, ctx: Context) -> dict:
    del ctx
    result = lm_samples.score_choices(self.task.model, state.params, self.task.tokenizer,
                                      self.items)
    return {"choices_accuracy": result["choices_accuracy"],
            "num_questions": result["num_questions"]}


def teacher_features(task: Task, state: Any, ctx: Context, split: str):
  """The DINO teacher's class-token features of ``split``
  (:meth:`laplax.tasks.dino.DINOTask.features`; the eval split's with the patch
  tokens of its first ``ctx.tokens`` images), computed once per round and kept
  in ``ctx.cache``."""
  key = ("teacher_features", split)
  if key not in ctx.cache:
    _, params = task.backbone(state)
    tokens = ctx.tokens if split == task.config.data.eval_split else 0
    ctx.cache[key] = task.features(params, split, with_tokens=tokens)
  return ctx.cache[key]


class KNN(Evaluator):
  """``knn``: DINO's weighted k-NN classifier (Wu et al. 2018) on the teacher's
  class-token features, fitted on the train split and scored on the eval
  split (``eval.knn_k``, ``eval.knn_temperature``); ``knn_accuracy`` in
  [0, 1] and ``num_examples`` (the eval split's size). Labels are used only here."""
  name = "knn"

  def run(self, state: Any, ctx: Context) -> dict:
    data, e = self.config.data, self.config.eval
    train_x, train_y, _, _ = teacher_features(self.task, state, ctx, data.train_split)
    test_x, test_y, _, _ = teacher_features(self.task, state, ctx, data.eval_split)
    accuracy = probes.knn_accuracy(train_x, train_y, test_x, test_y,
                                   num_classes=self.task.num_classes, k=e.knn_k,
                                   temperature=e.knn_temperature)
    return {"knn_accuracy": float(accuracy), "num_examples": int(len(test_y))}


class LinearProbe(Evaluator):
  """``linear_probe``: a multinomial logistic regression on the teacher's
  class-token features (:func:`laplax.evaluators.probes.linear_probe`, seeded
  with ``config.seed``), fitted on the train split and scored on the eval
  split; ``linear_probe_accuracy`` in [0, 1]."""
  name = "linear_probe"

  def run(self, state: Any, ctx: Context) -> dict:
    data = self.config.data
    train_x, train_y, _, _ = teacher_features(self.task, state, ctx, data.train_split)
    test_x, test_y, _, _ = teacher_features(self.task, state, ctx, data.eval_split)
    probe = probes.linear_probe(train_x, train_y, test_x, test_y,
                                num_classes=self.task.num_classes, seed=self.config.seed)
    return {"linear_probe_accuracy": float(probe["accuracy"])}


class RawPixelKNN(Evaluator):
  """``raw_pixel_knn``: the same k-NN as ``knn`` on the normalised pixels (a
  reference that needs no network); ``raw_pixel_knn_accuracy`` in [0, 1]."""
  name = "raw_pixel_knn"
  stages = (EVAL,)

  def run(self, state: Any, ctx: Context) -> dict:
    del state, ctx  # the pixels, no network
    data, e = self.config.data, self.config.eval
    pixels, labels = {}, {}
    for split in (data.train_split, data.eval_split):
      rows, ys = [], []
      for b in self.task.eval_batches(split):
        n = int(b["mask"].sum())
        rows.append(b["image"][:n].reshape(n, -1))
        ys.append(b["label"][:n])
      pixels[split], labels[split] = np.concatenate(rows), np.concatenate(ys)
    accuracy = probes.knn_accuracy(pixels[data.train_split], labels[data.train_split],
                                   pixels[data.eval_split], labels[data.eval_split],
                                   num_classes=self.task.num_classes, k=e.knn_k,
                                   temperature=e.knn_temperature)
    return {"raw_pixel_knn_accuracy": float(accuracy)}


class PatchPCA(Evaluator):
  """``patch_pca``: the first three principal components of the teacher's
  final-norm patch features of the first ``eval.pca_images`` eval images, as
  RGB beside the images (DINO's Fig. 1-style picture), written to
  :data:`PCA_FIGURE` in ``ctx.out_dir``. No numbers."""
  name = "patch_pca"
  stages = (EVAL,)

  def tokens_wanted(self, ctx: Context) -> int:
    """``eval.pca_images`` when there is a directory for the figure."""
    return int(self.config.eval.pca_images) if ctx.out_dir is not None else 0

  def run(self, state: Any, ctx: Context) -> dict:
    num = self.tokens_wanted(ctx)
    if not num:
      return {}
    _, _, shown, tokens = teacher_features(self.task, state, ctx, self.config.data.eval_split)
    p = self.config.model.patch_size
    figure = os.path.join(ctx.out_dir, PCA_FIGURE)
    probes.save_pca_figure(figure, shown, probes.patch_pca_rgb(
        tokens, (shown.shape[1] // p, shown.shape[2] // p)))
    ctx.figures.append(figure)
    ctx.say(f"patch-feature PCA of {num} test images: {figure}")
    return {}


class Segmentation(Evaluator):
  """``segmentation``: DINOv2's linear segmentation probe on the teacher's
  patch tokens (:func:`laplax.evaluators.dino_segmentation.evaluate`; the data
  and sizes are the ``eval.segmentation*`` settings), its batches split over
  ``ctx.mesh``; the test masks are drawn to :data:`SEGMENTATION_FIGURE` in
  ``ctx.out_dir``. Nothing when the run has no masks to use ("auto")."""
  name = "segmentation"
  stages = (EVAL,)

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """The ``eval.segmentation*`` keys (:func:`laplax.evaluators.dino_segmentation.validate`)."""
    dino_segmentation.validate(config)

  def prepare(self) -> None:
    """Reads the segmentation images and masks
    (:func:`laplax.evaluators.dino_segmentation.load_data`).

    Raises:
      DataError: the data is not prepared, unreadable or does not fit the backbone.
      ConfigError: the image size is not divisible by the patch size.
    """
    self.data = dino_segmentation.load_data(self.config, self.task.image_shape)

  def run(self, state: Any, ctx: Context) -> dict:
    settings = dino_segmentation.settings(self.config)
    if self.data is None:
      ctx.say(f"no segmentation probe: {self.config.data.name} has no masks and is not "
              f"Fashion-MNIST; add --config.eval.segmentation_dataset=ade20k "
              f"--config.eval.segmentation_dir=DIR (ADEChallengeData2016 unpacked in DIR)")
      return {}
    shown = settings["segmentation_figure_images"]
    figure = os.path.join(ctx.out_dir, SEGMENTATION_FIGURE) if ctx.out_dir else None
    _, params = self.task.backbone(state)
    out = dino_segmentation.evaluate(self.config, self.task.teacher.backbone, params,
                                     self.data, mesh=ctx.mesh, figure=figure)
    ctx.say(f"linear segmentation probe on {out['segmentation_dataset']}: mIoU "
            f"{out['segmentation_miou']:.4f}" + (
                f"; masks of {shown} test images: {figure}" if shown and figure else ""))
    if shown and figure:
      ctx.figures.append(figure)
    return out


#: Name -> evaluator class; :attr:`Evaluator.name` of each.
EVALUATORS: dict[str, type[Evaluator]] = {e.name: e for e in (
    Classification, BitsPerByte, Samples, MultipleChoice, KNN, LinearProbe,
    RawPixelKNN, Segmentation, PatchPCA)}


def names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The evaluator names of ``config.evals`` in order (empty names dropped);
  a run saved before the key existed has it from
  :func:`laplax.tasks.schema.complete`
  (:meth:`laplax.tasks.base.TaskBase.saved_evals`)."""
  return config_lib.split_evals(config.evals)


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the settings of every evaluator ``config.evals`` names
  (:meth:`Evaluator.validate`); the names themselves are checked with the
  task's config (:mod:`laplax.config.validation`).

  Raises:
    ConfigError: the first bad key, with its fix.
  """
  for name in names(config):
    EVALUATORS[name].validate(config)


def build(task: Task, stage: str, **extra: Evaluator) -> list[Evaluator]:
  """The evaluators of ``task.config.evals`` that run at ``stage``
  (:data:`TRAIN` or :data:`EVAL`), in the config's order, then ``extra``'s
  (``eval.py --choices``' ``multiple_choice``). ``prepare`` is called on each
  (data read and checked before anything is computed).

  Raises:
    DataError, ConfigError: an evaluator's data cannot be used.
  """
  out = [EVALUATORS[n](task) for n in names(task.config) if stage in EVALUATORS[n].stages]
  out += [e for e in extra.values() if e is not None]
  for evaluator in out:
    evaluator.prepare()
  return out


def run(evaluators: list[Evaluator], state: Any, ctx: Context) -> tuple[dict, dict[str, str]]:
  """Runs ``evaluators`` on ``state`` in order: their numbers merged into one
  summary (later keys win: the DINO evaluators all report the same
  ``num_examples``) and their texts. Figures go to ``ctx.figures``."""
  summary, texts = {}, {}
  ctx.tokens = max([ctx.tokens] + [e.tokens_wanted(ctx) for e in evaluators])
  for evaluator in evaluators:
    summary.update(evaluator.run(state, ctx))
    texts.update(evaluator.texts(state))
  return summary, texts
