"""``python -m laplax.proj.nanochat.chat``: :func:`laplax.proj.nanochat.chat.cli.run_cli`."""

from laplax.proj.nanochat.chat.cli import run_cli

if __name__ == "__main__":
  run_cli()
