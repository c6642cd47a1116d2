"""``python -m laplax.plan``: :func:`laplax.plan.cli.run_cli`."""

from laplax.plan.cli import run_cli

if __name__ == "__main__":
  run_cli()
