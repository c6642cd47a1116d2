"""Talking to a trained GPT: ``python -m laplax.proj.nanochat.chat`` (``laplax-chat``).

:mod:`laplax.proj.nanochat.chat.engine` turns a workdir into a conversation (nanochat's
chat format, the calculator tool, tokens streamed as the KV cache decodes
them); :mod:`laplax.proj.nanochat.chat.cli` is the terminal conversation and
:mod:`laplax.proj.nanochat.chat.web` the local web page and its JSON API (nanochat's
``scripts/chat_cli.py`` and ``scripts/chat_web.py``). The user guide is
``docs/chat.md``.
"""
