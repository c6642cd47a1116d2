"""``python -m laplax.evaluators.sandbox``, kept working: the sandbox moved to
:mod:`laplax.sandbox` (``python -m laplax.sandbox``)."""

import runpy

if __name__ == "__main__":
  runpy.run_module("laplax.sandbox", run_name="__main__", alter_sys=True)
