"""``python -m laplax.data.chat.mixture``, kept working: the chat mixtures moved to
:mod:`laplax.proj.nanochat.data.mixture` (``python -m laplax.proj.nanochat.data.mixture``)."""

import runpy

if __name__ == "__main__":
  runpy.run_module("laplax.proj.nanochat.data.mixture", run_name="__main__", alter_sys=True)
