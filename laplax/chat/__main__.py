"""``python -m laplax.chat``: :func:`laplax.chat.cli.run_cli`."""

from laplax.chat.cli import run_cli

if __name__ == "__main__":
  run_cli()
