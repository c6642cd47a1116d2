"""bench/cache_blocking.py end to end at a tiny GPT: the table's rows and
their losses, the skipped micro-batch counts, and one-line errors."""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench import cache_blocking

TINY = [
  "--config",
  os.path.join(ROOT, "configs/gpt_shakespeare.py"),
  "--set",
  "model.width=32",
  "--set",
  "model.depth=1",
  "--set",
  "model.mlp_dim=64",
  "--set",
  "model.max_length=16",
  "--set",
  "batch_size=4",
  "--rounds",
  "2",
  "--steps",
  "1",
  "--warmup",
  "1",
]


@pytest.mark.slow
def test_rows_per_micro_batch_count_with_equal_losses(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["cache_blocking.py", "--accum", "1,2,3", "--sizes", "1"] + TINY)
  cache_blocking.main()
  out = capsys.readouterr().out
  assert re.search(r"^\s+1\s+[\d.]+\s+[\d.]+$", out, re.M), out  # 1 MiB: us, GB/s
  assert "skipped: 3 micro-batches do not divide batch_size=4" in out
  rows = re.findall(
    r"^(1 x 4|2 x 2|2 x 2 unrolled)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$", out, re.M
  )
  assert [r[0] for r in rows] == ["1 x 4", "2 x 2", "2 x 2 unrolled"], out
  assert float(rows[0][2]) == 1.0  # the speed-up of the reference row
  losses = [float(r[4]) for r in rows]  # the same two updates: the same loss
  assert max(losses) - min(losses) <= 1e-5 * abs(losses[0]), losses


@pytest.mark.parametrize(
  "extra,fragment",
  [
    (["--accum", "1,x"], "comma-separated integers"),
    (["--accum", "0"], ">= 1"),
    (["--config", "configs/nope.py"], "no config file"),
    (["--warmup", "0"], ">= 1"),
    (["--accum", "3"] + TINY, "no micro-batch count in --accum divides batch_size=4"),
  ],
)
def test_bad_arguments_are_one_line_exit_2(monkeypatch, capsys, extra, fragment):
  monkeypatch.setattr(sys, "argv", ["cache_blocking.py", "--sizes", ""] + extra)
  with pytest.raises(SystemExit) as e:
    cache_blocking.main()
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error:")
  assert fragment in err[0]


def test_step_time_refuses_a_batch_the_micro_batches_cannot_cut(monkeypatch, capsys):
  from bench import step_time

  monkeypatch.setattr(
    sys,
    "argv",
    [
      "step_time.py",
      "--config",
      os.path.join(ROOT, "configs/vit_fashion_mnist.py"),
      "--batch",
      "6",
      "--variants",
      "baseline",
    ],
  )
  with pytest.raises(SystemExit) as e:
    step_time.main()
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1
  assert "optim.grad_accum_steps=4" in err[0] and "--set optim.grad_accum_steps=1" in err[0]
