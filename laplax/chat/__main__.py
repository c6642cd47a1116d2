"""``python -m laplax.chat``, kept working: the chat program moved to
:mod:`laplax.proj.nanochat.chat` (``python -m laplax.proj.nanochat.chat``)."""

import runpy

if __name__ == "__main__":
  runpy.run_module("laplax.proj.nanochat.chat", run_name="__main__", alter_sys=True)
