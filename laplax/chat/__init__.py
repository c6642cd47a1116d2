"""Talking to a trained GPT: ``python -m laplax.chat`` (``laplax-chat``).

:mod:`laplax.chat.engine` turns a workdir into a conversation (nanochat's
chat format, the calculator tool, tokens streamed as the KV cache decodes
them); :mod:`laplax.chat.cli` is the terminal conversation and
:mod:`laplax.chat.web` the local web page and its JSON API (nanochat's
``scripts/chat_cli.py`` and ``scripts/chat_web.py``). The user guide is
``docs/chat.md``.
"""
