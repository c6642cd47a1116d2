"""Compare the analyses of several runs: one PNG and markdown tables.

    python -m laplax.analysis.compare runs/vit0 runs/vit4 --out compare.png

Bad input (no ``analysis.json``, an unreadable file, no run) prints one line and
exits with code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from laplax.analysis import report, summary

USAGE_EXIT = 2


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit 2 (argparse prints usage too)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_EXIT)


def _fmt(v) -> str:
  if v is None:
    return "-"
  if isinstance(v, int):
    return str(v)
  return f"{v:.4g}"


def names_for(workdirs: Sequence[str]) -> list[str]:
  """Short unique run names: the workdirs' base names (the full path if they clash)."""
  base = [os.path.basename(os.path.normpath(w)) or w for w in workdirs]
  return base if len(set(base)) == len(base) else [os.path.normpath(w) for w in workdirs]


def markdown_tables(analyses: dict) -> str:
  """Markdown: per quantity a ``### label`` table of layers by runs (absent ones left out)."""
  summaries = {n: summary.summary(a) for n, a in analyses.items()}
  names = list(summaries)
  layers = sorted({l for s in summaries.values() for l in s["layer"]})
  parts = []
  for key, label, _ in summary.QUANTITIES:
    if not any(any(v is not None for v in s[key]) for s in summaries.values()):
      continue
    lines = [
      f"### {label}",
      "",
      "| layer | " + " | ".join(names) + " |",
      "|---|" + "---|" * len(names),
    ]
    for layer in layers:
      cells = []
      for n in names:
        s = summaries[n]
        v = s[key][s["layer"].index(layer)] if layer in s["layer"] else None
        cells.append(_fmt(v))
      lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    parts.append("\n".join(lines))
  return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
  """CLI entry point; returns the exit code (2 for bad input)."""
  parser = _Parser(
    prog="python -m laplax.analysis.compare",
    description="Compare the analysis.json of several runs.",
  )
  parser.add_argument("workdirs", nargs="+", help="run directories with analysis.json")
  parser.add_argument("--out", default="compare.png", help="PNG to write (default compare.png)")
  args = parser.parse_args(argv)
  if not args.out.lower().endswith(".png"):
    parser.error(f"--out {args.out} must be a .png file")
  analyses = {}
  for name, workdir in zip(names_for(args.workdirs), args.workdirs):
    path = os.path.join(workdir, report.ANALYSIS_FILE)
    if not os.path.isfile(path):
      parser.error(
        f"{workdir} has no {report.ANALYSIS_FILE}; run eval.py --workdir {workdir} --analysis first"
      )
    try:
      analyses[name] = report.read(workdir)
    except (OSError, ValueError) as e:
      parser.error(
        f"{path} is unreadable ({type(e).__name__}); rerun eval.py --workdir {workdir} --analysis"
      )
    if not isinstance(analyses[name], dict) or "layers" not in analyses[name]:
      parser.error(f"{path} is not a laplax analysis; rerun eval.py --workdir {workdir} --analysis")
  from laplax.analysis import plots

  try:
    plots.plot_compare(analyses, args.out)
  except OSError as e:
    parser.error(f"cannot write {args.out}: {e.strerror or e}")
  print(markdown_tables(analyses))
  print(f"\nplot: {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
