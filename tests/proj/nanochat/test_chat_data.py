"""nanochat's chat format (laplax.proj.nanochat.data.render) token by token, and the readers of
the published data formats (laplax.proj.nanochat.data.sources) on files written here.

The rendering tests use a tokenizer without merges: every text token is one
byte, so the expected ids are written by hand from the bytes."""

import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from laplax.data.errors import DataError  # noqa: E402
from laplax.data.text import nanochat_tokenizer as nt  # noqa: E402
from laplax.data.text.tokenizers import ByteTokenizer  # noqa: E402
from laplax.proj.nanochat.data import render as chat  # noqa: E402
from laplax.proj.nanochat.data import sources as chat_sources

# Byte tokenizer with nanochat's special tokens at 256..264.
TOK = nt.NanochatTokenizer.from_ranks({bytes([b]): b for b in range(256)})
BOS, US, UE, AS, AE, PS, PE, OS, OE = range(256, 265)

CONVERSATION = {
  "messages": [
    {"role": "system", "content": "Be"},
    {"role": "user", "content": "2+3?"},
    {
      "role": "assistant",
      "content": [
        {"type": "text", "text": "So "},
        {"type": "python", "text": "2+3"},
        {"type": "python_output", "text": "5"},
        {"type": "text", "text": "#### 5"},
      ],
    },
    {"role": "user", "content": "ok"},
    {"role": "assistant", "content": "Hi"},
  ]
}


def b(text):
  return list(text.encode())


# (ids, mask) by hand: system merged into the user text with "\n\n".
EXPECTED = (
  [(BOS, 0), (US, 0)]
  + [(t, 0) for t in b("Be\n\n2+3?")]
  + [(UE, 0), (AS, 0)]
  + [(t, 1) for t in b("So ")]
  + [(PS, 1)]
  + [(t, 1) for t in b("2+3")]
  + [(PE, 1)]
  + [(OS, 0)]
  + [(t, 0) for t in b("5")]
  + [(OE, 0)]
  + [(t, 1) for t in b("#### 5")]
  + [(AE, 1)]
  + [(US, 0)]
  + [(t, 0) for t in b("ok")]
  + [(UE, 0), (AS, 0)]
  + [(t, 1) for t in b("Hi")]
  + [(AE, 1)]
)


def test_special_ids_are_the_last_nine():
  assert chat.chat_tokens(TOK) == dict(zip(nt.SPECIAL_TOKENS, range(256, 265)))


def test_render_conversation_token_by_token():
  ids, mask = chat.render_conversation(TOK, CONVERSATION)
  assert ids.dtype == np.int32 and mask.dtype == np.int8
  assert list(zip(ids.tolist(), mask.tolist())) == EXPECTED
  assert CONVERSATION["messages"][0]["content"] == "Be"  # the input is not changed


def test_truncation_keeps_the_first_tokens():
  ids, mask = chat.render_conversation(TOK, CONVERSATION, max_tokens=13)
  assert list(zip(ids.tolist(), mask.tolist())) == EXPECTED[:13]


def test_prompt_for_completion_drops_the_last_answer():
  prompt = chat.render_for_completion(TOK, CONVERSATION)
  last_start = len(EXPECTED) - 4  # <|assistant_start|> H i <|assistant_end|>
  assert prompt.tolist() == [t for t, _ in EXPECTED[: last_start + 1]]
  assert prompt[-1] == AS
  short = chat.render_for_completion(TOK, CONVERSATION, max_tokens=5)
  assert short.tolist() == [t for t, _ in EXPECTED[:5]] + [AS]


def test_special_strings_in_text_are_plain_text():
  ids, _ = chat.render_conversation(
    TOK,
    {"messages": [{"role": "user", "content": "<|bos|>"}, {"role": "assistant", "content": "x"}]},
  )
  assert ids.tolist() == [BOS, US] + b("<|bos|>") + [UE, AS] + b("x") + [AE]


@pytest.mark.parametrize(
  "messages, message",
  [
    ([], "at least one message"),
    ([{"role": "assistant", "content": "x"}], "should be from 'user'"),
    (
      [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
      "should be from 'assistant'",
    ),
    ([{"role": "system", "content": "s"}], "followed by a user"),
    ([{"role": "user", "content": ["x"]}], "user content must be a string"),
    (
      [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "code", "text": "x"}]},
      ],
      "list of",
    ),
  ],
)
def test_malformed_conversations_are_one_line_errors(messages, message):
  with pytest.raises(DataError, match=message) as e:
    chat.render_conversation(TOK, {"messages": messages})
  assert "\n" not in str(e.value)


def test_a_tokenizer_without_chat_tokens_is_refused():
  with pytest.raises(DataError, match=r"no chat special tokens.*tokenizer=nanochat"):
    chat.render_conversation(ByteTokenizer(), CONVERSATION)


# --------------------------------------------------------------------------
# Readers.


def test_render_mc_is_nanochats_prompt():
  assert chat_sources.render_mc("Why?", ["A", "B"], ["yes", "no"]) == (
    "Multiple Choice question: Why?\n- yes=A\n- no=B\n\n"
    "Respond only with the letter of the correct answer."
  )


def test_gsm8k_calculator_marks_become_parts(tmp_path):
  answer = "He has 2*3 = <<2*3=6>>6 and <<6+1>> so\n#### 7"
  path = tmp_path / "test.jsonl"
  path.write_text(json.dumps({"question": "How many?", "answer": answer}) + "\n")
  [conv] = chat_sources.gsm8k(str(path))
  assert conv["messages"][0] == {"role": "user", "content": "How many?"}
  assert conv["messages"][1]["content"] == [
    {"type": "text", "text": "He has 2*3 = "},
    {"type": "python", "text": "2*3"},
    {"type": "python_output", "text": "6"},
    {"type": "text", "text": "6 and "},
    {"type": "python", "text": "6+1"},
    {"type": "python_output", "text": ""},
    {"type": "text", "text": " so\n#### 7"},
  ]
  # The result is what follows the last "=".
  assert chat_sources.gsm8k_parts("<<x=2*3=6>>")[1:3] == [
    {"type": "python", "text": "x=2*3"},
    {"type": "python_output", "text": "6"},
  ]


def test_arc_mmlu_smoltalk_from_parquet(tmp_path):
  arc = tmp_path / "ARC-Easy" / "test-00000-of-00001.parquet"
  arc.parent.mkdir()
  pq.write_table(
    pa.table(
      {
        "id": ["q1"],
        "question": ["Hot?"],
        "choices": [{"text": ["sun", "ice", "snow"], "label": ["1", "2", "3"]}],
        "answerKey": ["1"],
      }
    ),
    arc,
  )
  assert chat_sources.find_split(str(tmp_path), "ARC-Easy", "test", "x") == [str(arc)]
  [q] = chat_sources.arc(str(arc))
  assert q["letters"] == ["1", "2", "3"] and q["messages"][1]["content"] == "1"
  assert q["messages"][0]["content"] == chat_sources.render_mc(
    "Hot?", "123", ["sun", "ice", "snow"]
  )
  # MMLU's auxiliary_train nests every row under "train".
  aux = tmp_path / "aux.parquet"
  row = {"question": "2+2?", "subject": "", "choices": ["1", "2", "3", "4"], "answer": 3}
  pq.write_table(pa.table({"train": [row]}), aux)
  [m] = chat_sources.mmlu(str(aux))
  assert m["letters"] == ["A", "B", "C", "D"] and m["messages"][1]["content"] == "D"
  talk = tmp_path / "smol.parquet"
  messages = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
  ]
  pq.write_table(pa.table({"messages": [messages]}), talk)
  assert chat_sources.smoltalk(str(talk)) == [{"messages": messages}]


def test_bad_files_are_one_line_errors(tmp_path):
  bad = tmp_path / "test.jsonl"
  bad.write_text('{"question": "a", "answer": "#### 1"}\n{"question": \n')
  with pytest.raises(DataError, match=r"test.jsonl:2: not valid JSON") as e:
    chat_sources.gsm8k(str(bad))
  assert "\n" not in str(e.value)
  table = tmp_path / "t.parquet"
  pq.write_table(pa.table({"text": ["x"]}), table)
  with pytest.raises(DataError, match=r"t.parquet has no column 'messages' \(its columns: text\)"):
    chat_sources.smoltalk(str(table))
  with pytest.raises(DataError, match="No test split of ARC-Easy"):
    chat_sources.find_split(str(tmp_path), "ARC-Easy", "test", "ai2_arc/ARC-Easy/test.parquet")
  wrong = tmp_path / "arc.jsonl"
  wrong.write_text(
    json.dumps(
      {"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}
    )
    + "\n"
  )
  with pytest.raises(DataError, match="answerKey among the labels"):
    chat_sources.arc(str(wrong))


def test_shuffle_is_hugging_faces_seed_42_order():
  # list(datasets.Dataset.from_dict({"i": range(10)}).shuffle(seed=42)["i"]), datasets 5.2.0
  assert chat_sources.shuffled(list(range(10))) == [5, 6, 0, 7, 3, 2, 4, 9, 1, 8]
