"""The language-model job end to end: train.py, eval.py, --sample, --choices, bad input."""

import json
import math

import pytest

from helpers.lm import GPT_CONFIG, SENTENCE, TINY, one_line_error
from helpers.runs import run_in_process


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
  root = tmp_path_factory.mktemp("lm")
  workdir, data_dir = root / "run", root / "tfds"
  r = run_in_process(
    [
      "train.py",
      "--config",
      GPT_CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.source_dir={corpus}",
      f"--config.data.data_dir={data_dir}",
      "--config.total_steps=150",
      "--config.eval_every=150",
      "--config.checkpoint_every=150",
    ]
    + TINY
  )
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir


@pytest.mark.slow
def test_eval_reports_loss_perplexity_bits_per_byte(trained, capfd):
  r = run_in_process(["eval.py", "--workdir", str(trained)], capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads((trained / "eval.json").read_text())
  assert result["step"] == 150
  # Byte level: one token per byte, so bits/byte is the loss in bits.
  assert result["bits_per_byte"] == pytest.approx(result["loss"] / math.log(2), rel=1e-6)
  assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-6)
  # The validation document repeats the training sentence: nearly deterministic.
  assert result["bits_per_byte"] < 1.0
  # The document is stored stripped and encoded with a "\n\n" separator;
  # every token but the first is a target.
  assert result["num_tokens"] == len((SENTENCE * 150).strip()) + 2 - 1
  records = [json.loads(l) for l in open(trained / "metrics.jsonl")]
  final = [x for x in records if x["split"] == "eval"][-1]
  assert final["bits_per_byte"] == pytest.approx(result["bits_per_byte"], rel=1e-6)


@pytest.mark.slow
def test_greedy_sample_continues_the_sentence(trained, capfd):
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(trained),
      "--sample",
      "the cat sat",
      "--temperature",
      "0",
      "--max_new_tokens",
      "20",
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.strip().startswith("the cat sat on the mat.")


def test_choices_accuracy_by_construction(trained, tmp_path, capfd):
  """Q1's answer is the sentence's continuation (a trained model gets it
  right), Q2 marks the nonsense choice as the answer (it must get it wrong):
  accuracy is exactly 1/2."""
  path = tmp_path / "q.jsonl"
  q = {"question": "the cat sat on the", "choices": ["mat.", "xqz."]}
  path.write_text(json.dumps(dict(q, answer=0)) + "\n" + json.dumps(dict(q, answer=1)) + "\n")
  r = run_in_process(["eval.py", "--workdir", str(trained), "--choices", str(path)], capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads((trained / "eval.json").read_text())
  assert result["choices_accuracy"] == 0.5 and result["num_questions"] == 2


def test_malformed_choices_names_the_line(trained, tmp_path, capfd):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"question": "q", "choices": ["a", "b"], "answer": 0}\n{"question": "q",\n')
  before = (trained / "eval.json").read_bytes() if (trained / "eval.json").exists() else None
  line = one_line_error(
    run_in_process(["eval.py", "--workdir", str(trained), "--choices", str(path)], capfd)
  )
  assert f"{path}:2: not valid JSON" in line
  path.write_text('{"question": "q", "choices": ["a", "b"], "answer": 5}\n')
  assert f"{path}:1: 'answer' must be an index" in one_line_error(
    run_in_process(["eval.py", "--workdir", str(trained), "--choices", str(path)], capfd)
  )
  # A choice that cannot fit the 32-token context (a ValueError and exit 1 before),
  # an empty question (its choices' first tokens were silently left unscored).
  path.write_text(json.dumps({"question": "q", "choices": ["a", "b" * 40], "answer": 0}) + "\n")
  assert "question 1, choice 1: 41 tokens, but the model's context is 32" in one_line_error(
    run_in_process(["eval.py", "--workdir", str(trained), "--choices", str(path)], capfd)
  )
  path.write_text(json.dumps({"question": "", "choices": ["a", "b"], "answer": 0}) + "\n")
  assert "question 1 is empty" in one_line_error(
    run_in_process(["eval.py", "--workdir", str(trained), "--choices", str(path)], capfd)
  )
  after = (trained / "eval.json").read_bytes() if (trained / "eval.json").exists() else None
  assert before == after


def test_prompt_longer_than_context(trained, capfd):
  line = one_line_error(
    run_in_process(["eval.py", "--workdir", str(trained), "--sample", "x" * 40], capfd)
  )
  assert "context" in line


@pytest.mark.parametrize(
  "flags,fragment",
  [
    (["--max_new_tokens", "-5"], "--max_new_tokens=-5"),
    (["--temperature", "-1"], "--temperature=-1.0"),
    (["--top_k", "-3"], "--top_k=-3"),
  ],
)
def test_bad_sampling_flags(trained, flags, fragment, capfd):
  line = one_line_error(
    run_in_process(["eval.py", "--workdir", str(trained), "--sample", "ab"] + flags, capfd)
  )
  assert fragment in line


@pytest.mark.parametrize("case", ["empty corpus", "short corpus", "unknown tokenizer"])
def test_bad_lm_input(case, tmp_path, corpus, capfd):
  source = corpus
  extra = []
  if case == "empty corpus":
    source = tmp_path / "empty"
    source.mkdir()
  elif case == "short corpus":
    source = tmp_path / "short"
    source.mkdir()
    (source / "a.txt").write_text("to be")
    (source / "b.txt").write_text("or not")
  else:
    extra = ["--config.data.tokenizer=wordpiece"]
  workdir = tmp_path / "run"
  r = run_in_process(
    [
      "train.py",
      "--config",
      GPT_CONFIG,
      "--workdir",
      str(workdir),
      f"--config.data.source_dir={source}",
      f"--config.data.data_dir={tmp_path / 'tfds'}",
      "--config.total_steps=5",
    ]
    + TINY
    + extra,
    capfd,
  )
  line = one_line_error(r)
  assert {"empty corpus": "no", "short corpus": "shorter", "unknown tokenizer": "wordpiece"}[
    case
  ] in line.lower()
  assert not workdir.exists()
