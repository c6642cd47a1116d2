"""What the sandbox costs per program: wall-clock milliseconds of one run,
one at a time, of

* ``python -I -S -c pass`` started bare (the interpreter alone, the floor);
* :func:`laplax.sandbox.run_program` on ``pass`` unsandboxed
  (``unsafe=True``: the runner, its limits and the guard, no isolation);
* the same under bubblewrap (the user namespace, the other namespaces,
  the read-only root, the seccomp filter, the kill and wait at the end);
* :func:`~laplax.sandbox.run_test` of a right answer to
  ``add(a, b)`` (two sandboxes, the checker's calls relayed), as HumanEval
  runs each completion.

    python bench/sandbox_cost.py [--runs 20]

Prints the median and the overhead over the bare interpreter for each. The
kinds alternate round by round so that a busy machine slows all alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from laplax import sandbox  # noqa: E402

PROMPT = 'def add(a, b):\n    """a + b"""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
RIGHT = "def add(a, b):\n    return a + b\n"


def _bare() -> None:
  subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)


def _unsafe() -> None:
  assert sandbox.run_program("pass\n", unsafe=True).passed


def _bwrap() -> None:
  assert sandbox.run_program("pass\n").passed


def _test() -> None:
  assert sandbox.run_test(RIGHT, PROMPT, TEST, "add").passed


def main() -> int:
  """Times each kind ``--runs`` times and prints one line per kind."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--runs", type=int, default=20)
  args = parser.parse_args()
  if args.runs < 1:
    print("error: --runs must be at least 1", file=sys.stderr)
    return 2
  try:
    isolation = sandbox.check_available()
  except sandbox.SandboxUnavailable as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  kinds = {
    "python -I -S -c pass": _bare,
    "run_program, unsafe": _unsafe,
    "run_program, bubblewrap": _bwrap,
    "run_test, bubblewrap (HumanEval)": _test,
  }
  times = {name: [] for name in kinds}
  for _ in range(args.runs):
    for name, run in kinds.items():
      start = time.perf_counter()
      run()
      times[name].append((time.perf_counter() - start) * 1000)
  floor = statistics.median(times["python -I -S -c pass"])
  print(f"sandbox: {isolation['user']}; python {isolation['python']}; {args.runs} runs each")
  for name, values in times.items():
    median = statistics.median(values)
    print(f"{name:36s} median {median:7.1f} ms   overhead {median - floor:+7.1f} ms")
  return 0


if __name__ == "__main__":
  sys.exit(main())
