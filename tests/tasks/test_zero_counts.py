"""An evaluation that counts nothing is one ``DataError`` line, in every task.

The summaries of the language model (target tokens, and bytes of them), the
masked LM (masked tokens), the LRA sequence classifier (examples) and GLUE
(examples of a split) divide sums by a count: with no counted target they
raise instead of dividing by zero (or reporting a mean over nothing), and
with targets they are the closed-form means.
"""

import math
import types

import numpy as np
import pytest

from laplax.data.errors import DataError
from laplax.tasks.glue import GLUETask
from laplax.tasks.language_model import LanguageModelTask
from laplax.tasks.mlm import MaskedLMTask
from laplax.tasks.sequence_classification import SequenceClassificationTask


@pytest.mark.parametrize(
  "summarize, sums",
  [
    (SequenceClassificationTask.summarize, {"count": 0.0, "correct": 0.0, "loss": 0.0}),
    (SequenceClassificationTask.summarize, None),
    (MaskedLMTask.summarize, {"count": 0.0, "correct": 0.0, "loss": 0.0}),
    (MaskedLMTask.summarize, None),
    (LanguageModelTask.summarize, {"count": 0.0, "loss": 0.0, "bytes": 0.0}),
    (LanguageModelTask.summarize, {"count": 3.0, "loss": 3.0, "bytes": 0.0}),  # special tokens only
  ],
)
def test_nothing_counted_is_one_line(summarize, sums):
  with pytest.raises(DataError, match="counted no") as e:
    summarize(sums)
  assert "\n" not in str(e.value)


def test_the_means_when_something_is_counted():
  got = SequenceClassificationTask.summarize({"count": 4.0, "correct": 3.0, "loss": 2.0})
  assert got == {"accuracy": 0.75, "loss": 0.5, "num_examples": 4}
  got = MaskedLMTask.summarize({"count": 8.0, "correct": 2.0, "loss": 4.0})
  assert got == {"loss": 0.5, "perplexity": math.exp(0.5), "accuracy": 0.25, "num_masked": 8}
  got = LanguageModelTask.summarize({"count": 2.0, "loss": 2.0, "bytes": 4.0})
  assert got["bits_per_byte"] == pytest.approx(2.0 / math.log(2) / 4.0)


def test_a_glue_split_with_no_example_is_one_line():
  task = types.SimpleNamespace(eval_splits={"": "validation"}, _batches=lambda split: iter(()))
  with pytest.raises(DataError, match="counted no example of validation"):
    GLUETask.evaluate(task, state=None)
  # One example: the loss is its loss (the metrics themselves are test_glue's).
  batch = {"weight": np.array([1.0, 0.0], np.float32), "label": np.array([1, 1])}
  task = types.SimpleNamespace(
    eval_splits={"": "validation"},
    _batches=lambda split: iter([batch]),
    _predict=lambda params, b: {"output": np.array([1, 0]), "loss": np.array([0.25, 9.0])},
    num_labels=2,
    name="sst2",
  )
  out = GLUETask.evaluate(task, state=types.SimpleNamespace(params=None))
  assert out["loss"] == 0.25 and out["num_examples"] == 1 and out["accuracy"] == 1.0
