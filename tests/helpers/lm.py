"""The tiny language-model run shared by the CLI and evaluator tests."""

import os

from helpers.runs import ROOT

GPT_CONFIG = os.path.join(ROOT, "configs", "gpt_shakespeare.py")


TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=64",
  "--config.model.max_length=32",
  "--config.batch_size=16",
  "--config.eval_batch_size=16",
  "--config.log_every=50",
  "--config.optim.warmup_steps=10",
]


SENTENCE = "the cat sat on the mat. "


def one_line_error(r):
  assert r.returncode == 2, (r.stdout[-1500:], r.stderr[-1500:])
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
  return lines[0]
