"""``python -m laplax.data.chat.fixtures``, kept working: the chat fixtures moved to
:mod:`laplax.proj.nanochat.data.fixtures` (``python -m laplax.proj.nanochat.data.fixtures``)."""

import runpy

if __name__ == "__main__":
  runpy.run_module("laplax.proj.nanochat.data.fixtures", run_name="__main__", alter_sys=True)
