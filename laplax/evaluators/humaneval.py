"""``python -m laplax.evaluators.humaneval``, kept working: HumanEval moved to
:mod:`laplax.proj.nanochat.evaluators.humaneval` (``python -m laplax.proj.nanochat.evaluators.humaneval``)."""

import runpy

if __name__ == "__main__":
  runpy.run_module("laplax.proj.nanochat.evaluators.humaneval", run_name="__main__", alter_sys=True)
