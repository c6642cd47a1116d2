"""GSM8K's scorer counts only real answers: a reference without ``####`` is
refused when the data is read (and when scored), and a completion without
an answer is never right."""

import json

import pytest

from laplax.data.errors import DataError
from laplax.proj.nanochat.data import sources as chat_sources
from laplax.proj.nanochat.evaluators import gsm8k


def _write(tmp_path, answers):
  path = tmp_path / "test.jsonl"
  path.write_text(
    "".join(json.dumps({"question": f"q{i}", "answer": a}) + "\n" for i, a in enumerate(answers))
  )
  return str(path)


@pytest.mark.parametrize("reference", ["I don't know", "#### ", "#### ,", "ends with ####"])
def test_a_reference_without_an_answer_is_refused_when_read(tmp_path, reference):
  path = _write(tmp_path, ["#### 3", reference])
  with pytest.raises(DataError, match=r"test.jsonl:2: the answer has no '#### NUMBER' line"):
    chat_sources.gsm8k(path)


def test_a_missing_answer_is_never_right(tmp_path):
  conversations = chat_sources.gsm8k(_write(tmp_path, ["#### 3", "<<2*2=4>>4\n#### 4"]))
  result = gsm8k.score(conversations, ["I don't know", "#### ,"])
  assert result["answers"] == [None, None]
  assert result["correct"] == 0 and result["accuracy"] == 0.0
  assert gsm8k.score(conversations, ["#### 3", "so #### 4"])["accuracy"] == 1.0
  # A conversation built elsewhere without an answer is refused by the scorer too.
  broken = {
    "messages": [
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "text", "text": "no"}]},
    ]
  }
  with pytest.raises(DataError, match="no '#### NUMBER' answer"):
    gsm8k.score([broken], ["I don't know"])
