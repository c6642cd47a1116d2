"""The chat evaluators (laplax.evaluators.{generation, multiple_choice, gsm8k,
chat}) and batched generation (laplax.models.sampling.generate_batch), each
checked against a hand computation of nanochat's rule on a tiny random GPT
whose vocabulary is a byte-level nanochat tokenizer (every text token one
byte): letters restricted at <|assistant_start|> from unpadded forward passes,
greedy decoding token by token with the full forward pass, answer extraction,
the centring of ChatCORE."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.data.errors import DataError
from laplax.models import sampling
from laplax.proj.nanochat.data import render as chat
from laplax.proj.nanochat.data import sources as chat_sources
from laplax.proj.nanochat.evaluators import chat as chat_eval
from laplax.proj.nanochat.evaluators import generation, gsm8k, multiple_choice

from helpers.chat import TOK
from helpers.models import make_gpt

BOS, US, UE, AS, AE, PS, PE, OS, OE = range(256, 265)
MAX_LENGTH = 160


@pytest.fixture(scope="module")
def gpt():
  model = make_gpt(
    TOK.vocab_size,
    width=32,
    depth=2,
    num_heads=2,
    num_laplacian_heads=1,
    mlp_dim=64,
    max_length=MAX_LENGTH,
    posemb="rope",
  )
  params = jax.jit(model.init)(jax.random.PRNGKey(3), jnp.zeros((1, 8), jnp.int32))["params"]
  return model, params


_FORWARD = {}


def full_logits(model, params, ids):
  """Logits of the unpadded sequence ``ids`` (one jitted forward pass at the
  full context, the rest zeros: causal attention, so they cannot matter)."""
  if model not in _FORWARD:
    _FORWARD[model] = jax.jit(lambda p, t: model.apply({"params": p}, t)[0][0])
  tokens = np.zeros((1, MAX_LENGTH), np.int32)
  tokens[0, : len(ids)] = ids
  return np.asarray(_FORWARD[model](params, tokens))[: len(ids)]


def reference_generation(model, params, prompt, max_new, stops=(), tool=None, row=0):
  """Greedy decoding by the definition: the full forward pass of the whole
  sequence at every step, forced tokens first."""
  seq, out, forced = list(prompt), [], []
  while len(out) < max_new and len(seq) < MAX_LENGTH:
    token = forced.pop(0) if forced else int(np.argmax(full_logits(model, params, seq)[-1]))
    seq.append(token)
    if token in stops:
      break
    out.append(token)
    if tool is not None:
      forced += list(tool(row, token))
  return out


class EveryThird:
  """A tool hook: after every third token of a row, force tokens 7 and 8."""

  def __init__(self):
    self.counts = {}

  def __call__(self, row, token):
    self.counts[row] = self.counts.get(row, 0) + 1
    return [7, 8] if self.counts[row] % 3 == 0 else []


@pytest.mark.slow
def test_generate_batch_equals_greedy_decoding_row_by_row(gpt):
  model, params = gpt
  rng = np.random.default_rng(0)
  # The last prompt leaves room for 3 tokens: its row ends with the context.
  prompts = [rng.integers(0, 256, n) for n in (5, 12, 9, MAX_LENGTH - 3)]
  stop = reference_generation(model, params, prompts[1], 1)[0]  # ends row 1 at once
  expected = [
    reference_generation(model, params, p, 10, stops=(stop,), tool=EveryThird(), row=i)
    for i, p in enumerate(prompts)
  ]
  got = sampling.generate_batch(
    model, params, prompts, max_new_tokens=10, stop_tokens=(stop,), tool=EveryThird(), rows=4
  )
  assert [g.tolist() for g in got] == expected
  assert expected[1] == [] and len(expected[3]) == 3 and any(7 in e for e in expected)


def test_calculator_forces_nanochats_output_block():
  calc = generation.Calculator(TOK)
  feed = lambda text: [calc(0, t) for t in [PS] + list(text.encode()) + [PE]][-1]
  assert feed("1,000*3") == [OS] + list(b"3000") + [OE]
  assert feed("7/2") == [OS] + list(b"3.5") + [OE]
  assert feed("2**10") == [] and feed("abs(1)") == [] and feed("1/0") == []
  assert calc(0, PE) == [] and calc(0, 50) == []  # outside a python block
  assert generation.use_calculator("(1 + 2) * 4") == 12


def mc_conversations():
  questions = [
    ("Which is hot?", ["sun", "ice", "snow", "rain"]),
    ("2+2?", ["3", "4"]),
    ("Sky colour?", ["red", "blue", "green"]),
    ("Pick one", ["x", "y", "z", "w"]),
    ("Last", ["a", "b"]),
  ]
  labels = [list("ABCD"), ["1", "2"], list("ABC"), list("ABCD"), list("AB")]
  return [
    {
      "messages": [
        {"role": "user", "content": chat_sources.render_mc(q, l, c)},
        {"role": "assistant", "content": l[0]},
      ],
      "letters": l,
    }
    for (q, c), l in zip(questions, labels)
  ]


def test_multiple_choice_is_the_restricted_argmax_at_assistant_start(gpt):
  model, params = gpt
  conversations = mc_conversations()
  predicted = []
  for c in conversations:  # by hand: unpadded prompt, logits at its last token
    prompt = chat.render_for_completion(TOK, c)
    assert prompt[-1] == AS
    row = full_logits(model, params, prompt)[-1]
    letters = c["letters"]
    predicted.append(letters[int(np.argmax([row[ord(l)] for l in letters]))])
  for i, c in enumerate(conversations):  # answers: right for 0, 2, 4; wrong for 1, 3
    right = predicted[i] if i % 2 == 0 else next(l for l in c["letters"] if l != predicted[i])
    c["messages"][1]["content"] = right
  result = multiple_choice.evaluate(model, params, TOK, conversations, batch_size=2, progress=False)
  assert result["predictions"] == predicted
  assert result["accuracy"] == pytest.approx(3 / 5) and result["total"] == 5


def test_multiple_choice_refuses_a_multi_token_letter(gpt):
  c = {
    "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "AB"}],
    "letters": ["AB", "C"],
  }
  with pytest.raises(DataError, match="'AB' is 2 tokens; .* one token per letter"):
    multiple_choice.evaluate(*gpt, TOK, [c], progress=False)


def test_gsm8k_answers_are_extracted_and_matched(tmp_path):
  path = tmp_path / "test.jsonl"
  refs = ["So <<1000+234=1234>>1,234\n#### 1,234", "#### 13", "#### 5", "#### -3.5"]
  path.write_text(
    "".join(json.dumps({"question": f"q{i}", "answer": a}) + "\n" for i, a in enumerate(refs))
  )
  conversations = chat_sources.gsm8k(str(path))
  completions = ["It is #### 1234", "#### 12", "no answer", "#### -3.5 then #### 4"]
  result = gsm8k.score(conversations, completions)
  assert result["answers"] == ["1234", "12", None, "-3.5"]
  assert result["correct"] == 2 and result["accuracy"] == 0.5


def test_exact_match_counts_a_missing_answer_only_where_nanochat_does():
  # GSM8K: a completion without an answer is wrong; SpellingBee compares the
  # two extractions as nanochat does, so None against None is right.
  conversations = [{"messages": [{"role": "assistant", "content": [{"text": t}]}]} for t in "ab"]
  words = {"a": "1", "b": None}
  kwargs = dict(
    extract=lambda c: words.get(c),
    reference=lambda c: words[c["messages"][-1]["content"][-1]["text"]],
  )
  strict = generation.exact_match(conversations, ["a", "x"], **kwargs)
  assert strict == {"accuracy": 0.5, "correct": 1, "total": 2, "answers": ["1", None]}
  loose = generation.exact_match(conversations, ["a", "x"], missing_matches_missing=True, **kwargs)
  assert loose["correct"] == 2 and loose["accuracy"] == 1.0
  assert generation.exact_match([], [], **kwargs)["accuracy"] == 0.0
  with pytest.raises(DataError, match="1 completions for 2 problems"):
    generation.exact_match(conversations, ["a"], **kwargs)


def test_generated_answers_decode_the_batched_greedy_rows(gpt):
  model, params = gpt
  conversations = mc_conversations()[:3]
  got = generation.generate_answers(
    model, params, TOK, conversations, max_new_tokens=6, batch_size=4, progress=False
  )
  for c, text in zip(conversations, got):
    out = reference_generation(
      model,
      params,
      chat.render_for_completion(TOK, c),
      6,
      stops=(AE, BOS),
      tool=generation.Calculator(TOK),
    )
    assert text == TOK.decode(out)


def test_humaneval_scores_the_generated_programs(monkeypatch):
  from laplax.proj.nanochat.evaluators import humaneval

  problems = humaneval.load_problems()[:2]
  conversations = [
    {
      "messages": [{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": ""}],
      "problem": p,
    }
    for p in problems
  ]
  right = "```python\n" + humaneval.canonical_completion(problems[0]) + "\n```"
  monkeypatch.setattr(
    generation, "generate_answers", lambda *a, **k: [right, "def nothing(): pass"]
  )
  result = chat_eval.humaneval_evaluate(None, None, TOK, conversations, progress=False)
  assert result["accuracy"] == 0.5 and result["correct"] == 1 and result["total"] == 2


def test_chatcore_is_the_centred_mean():
  scores = {"arc_easy": 0.5, "mmlu": 0.25, "gsm8k": 0.1}
  assert chat_eval.chatcore(scores) == pytest.approx(((0.5 - 0.25) / 0.75 + 0.0 + 0.1) / 3)
  assert chat_eval.chatcore({"arc_challenge": 1.0, "humaneval": 1.0}) == pytest.approx(1.0)
  assert chat_eval.chatcore({"arc_challenge": 0.25, "humaneval": 0.5}) == pytest.approx(0.25)


def test_task_names_and_missing_data_are_one_line_errors(tmp_path):
  assert chat_eval.parse_tasks("all") == list(chat_eval.TASKS)
  with pytest.raises(DataError, match="give distinct names"):
    chat_eval.parse_tasks("arc_easy,arc")
  with pytest.raises(DataError, match="needs --chat_data"):
    chat_eval.load_task("mmlu", None)
  with pytest.raises(DataError, match=r"No test split of all under .*mmlu/all/test-00000"):
    chat_eval.load_task("mmlu", str(tmp_path))
