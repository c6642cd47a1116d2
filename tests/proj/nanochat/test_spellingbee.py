"""SpellingBee (laplax.proj.nanochat.evaluators.spellingbee and its chat evaluator) against a
transcription of nanochat's tasks/spellingbee.py (karpathy/nanochat da32e1d):
the problems drawn from a word list the test writes, the answer parsing, the
calculator's string count, ChatCORE with chance 0, and one-line errors."""

import hashlib
import random

import pytest

from laplax.data.errors import DataError
from laplax.evaluators import registry
from laplax.proj.nanochat.data import render as chat
from laplax.proj.nanochat.evaluators import chat as chat_eval
from laplax.proj.nanochat.evaluators import generation, spellingbee

from helpers.chat import TOK

WORDS = ["strawberry", "banana", "a", "mississippi", "rhythm", "bookkeeper", "queue", "zzz"]


def nanochat_example(words, index, split):
  """tasks/spellingbee.py's SpellingBee.get_example, transcribed."""
  seed = index if split == "train" else 10_000_000 + index
  rng = random.Random(seed)
  word = rng.choice(words)
  letter = rng.choice(word) if rng.random() < 0.9 else rng.choice("abcdefghijklmnopqrstuvwxyz")
  count = word.count(letter)
  template = rng.choice(spellingbee.USER_MSG_TEMPLATES)
  if rng.random() < 0.3:
    template = template.lower()
  quote_options = ["", "'", '"']
  letter_quote = rng.choice(quote_options)
  word_quote = rng.choice(quote_options)
  user_msg = template.format(
    letter=f"{letter_quote}{letter}{letter_quote}", word=f"{word_quote}{word}{word_quote}"
  )
  if rng.random() < 0.5:
    user_msg += "?"
  word_letters = ",".join(list(word))
  manual_text = f"""We are asked to find the number '{letter}' in the word '{word}'. Let me try a manual approach first.

First spell the word out:
{word}:{word_letters}

Then count the occurrences of '{letter}':
"""
  running_count = 0
  for i, char in enumerate(word, 1):
    if char == letter:
      running_count += 1
      manual_text += f"{i}:{char} hit! count={running_count}\n"
    else:
      manual_text += f"{i}:{char}\n"
  manual_text += f"\nThis gives us {running_count}."
  parts = [
    {"type": "text", "text": manual_text},
    {"type": "text", "text": "\n\nLet me double check this using Python:\n\n"},
    {"type": "python", "text": f"'{word}'.count('{letter}')"},
    {"type": "python_output", "text": str(count)},
    {
      "type": "text",
      "text": f"\n\nPython gives us {count}.\n\nMy final answer is:\n\n#### {count}",
    },
  ]
  return {
    "messages": [{"role": "user", "content": user_msg}, {"role": "assistant", "content": parts}]
  }


def test_templates_are_nanochats():
  """The 51 templates of da32e1d, in order (their SHA-256 taken from that file)."""
  t = spellingbee.USER_MSG_TEMPLATES
  assert len(t) == 51 and t[0] == "How many {letter} are in the word {word}"
  assert t[-1] == "{word}に{letter}が何回出てくる"
  digest = hashlib.sha256("\n".join(t).encode()).hexdigest()
  assert digest == "7f735edb782c715922a68563652b58b0e59b4a458a2710fc6fb9f619bc537326"


@pytest.mark.parametrize("split", ["train", "test"])
def test_problems_equal_nanochats_get_example(split):
  got = spellingbee.problems(WORDS, 300, split)
  assert got == [nanochat_example(WORDS, i, split) for i in range(300)]
  # The calculator evaluates each reference's python part to its output.
  for conversation in got[:50]:
    parts = conversation["messages"][1]["content"]
    assert str(generation.use_calculator(parts[2]["text"])) == parts[3]["text"]
  # Both languages' templates and the 10% random letters occur.
  users = [c["messages"][0]["content"] for c in got]
  assert any(u.endswith("?") for u in users) and any(not u.endswith("?") for u in users)
  assert spellingbee.problem(WORDS, 5, "test") != spellingbee.problem(WORDS, 5, "train")


def test_answers_are_parsed_as_nanochat_does():
  extract = spellingbee.extract_answer
  assert extract("so #### 3") == "3" and extract("#### 1,234 and #### 5") == "1234"
  assert extract("####3") is None and extract("no answer") is None
  assert extract("#### -2.") == "-2." and extract("#### .") == "."  # nanochat's regex
  conversations = spellingbee.problems(WORDS, 3)
  refs = [c["messages"][1]["content"][-1]["text"].split("#### ")[1] for c in conversations]
  completions = [f"My final answer is:\n\n#### {refs[0]}", f"#### {int(refs[1]) + 1}", "three"]
  result = spellingbee.score(conversations, completions)
  assert result["correct"] == 1 and result["accuracy"] == pytest.approx(1 / 3)
  assert result["answers"] == [refs[0], str(int(refs[1]) + 1), None]


def test_the_calculator_counts_letters_and_refuses_other_code():
  calc = generation.use_calculator
  assert calc("'strawberry'.count('r')") == 3 and calc('"ab,b".count("b")') == 2
  assert calc("1,000*3") == 3000 and calc("2**10") is None
  for bad in ("open('x').count('a')", "'__'.count('_')", "'a'.upper()", "'a'.center(9).count('a')"):
    assert calc(bad) is None, bad


def test_conversations_render_in_nanochats_format():
  conversation = spellingbee.problem(WORDS, 0)
  ids, mask = chat.render_conversation(TOK, conversation)
  assert len(ids) == len(mask) and int(mask.astype(int).sum()) > 0
  prompt = chat.render_for_completion(TOK, conversation)
  assert TOK.decode(prompt[1:]).startswith("<|user_start|>")


def test_the_evaluator_scores_generated_answers_and_chatcore(tmp_path, monkeypatch):
  (tmp_path / "words_alpha.txt").write_text("\r\n".join(WORDS) + "\r\n")  # dwyl's line ends
  conversations = chat_eval.load_task("spellingbee", str(tmp_path), max_problems=4, size=10)
  assert conversations == [nanochat_example(WORDS, i, "test") for i in range(4)]
  # The answers as generate_answers (tests/proj/nanochat/test_chat_eval.py) gives them.
  answers = [c["messages"][1]["content"][-1]["text"] for c in conversations]
  monkeypatch.setattr(generation, "generate_answers", lambda *a, **k: answers[:3] + ["#### 99"])
  out = chat_eval.run(None, None, TOK, {"spellingbee": conversations}, progress=False)
  assert out["spellingbee"] == 0.75 and out["chatcore"] == 0.75  # chance 0
  assert out["num_problems"] == {"spellingbee": 4}
  assert chat_eval.chatcore({"arc_easy": 0.5, "spellingbee": 0.25}) == pytest.approx(
    ((0.5 - 0.25) / 0.75 + 0.25) / 2
  )
  assert "spellingbee" in registry.accepted("lm") and chat_eval.parse_tasks("all")[-1] == (
    "spellingbee"
  )


def test_a_missing_or_malformed_word_list_is_one_line(tmp_path):
  with pytest.raises(DataError, match="spellingbee needs its word list"):
    chat_eval.load_task("spellingbee", None)
  with pytest.raises(DataError, match="words_alpha.txt is not a file"):
    chat_eval.load_task("spellingbee", str(tmp_path))
  (tmp_path / "w.txt").write_text("cat\n\ndog\n")
  with pytest.raises(DataError, match=r"w\.txt:2 is blank"):
    chat_eval.load_task("spellingbee", None, words=str(tmp_path / "w.txt"))
  (tmp_path / "e.txt").write_text("")
  with pytest.raises(DataError, match="has no words"):
    spellingbee.read_words(str(tmp_path / "e.txt"))
