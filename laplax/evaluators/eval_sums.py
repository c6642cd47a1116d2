"""The task's own eval-split metrics as evaluators: ``classification`` and
``bits_per_byte`` (:meth:`laplax.tasks.base.TaskBase.evaluate`, the sums of
every eval batch jitted once per task)."""

from __future__ import annotations

from typing import Any

from laplax.evaluators.base import Context, Evaluator


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
  tasks = ("classification", "sequence_classification")


class BitsPerByte(EvalSums):
  """``bits_per_byte``: next-token loss, perplexity and bits per byte on the
  validation split (nanochat's ``bpb``)."""

  name = "bits_per_byte"
  tasks = ("lm",)


class MaskedLMLoss(EvalSums):
  """``mlm_loss``: the masked-LM loss (nats per masked token), its
  perplexity and accuracy on the validation split (:mod:`laplax.tasks.mlm`)."""

  name = "mlm_loss"
  tasks = ("mlm",)


class GLUEScores(EvalSums):
  """``glue``: the official metric of the GLUE task (:func:`laplax.tasks.glue.scores`)
  on its validation split(s), the mean loss and ``num_examples``."""

  name = "glue"
  tasks = ("glue",)
