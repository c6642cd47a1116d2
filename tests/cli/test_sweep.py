"""``python -m laplax.sweep``: the grid, the one-line errors, the summary over
seeds, and a sweep killed with SIGKILL in its third run that the same command
finishes (the finished runs untouched, the killed one resumed, the summary that
of an uninterrupted sweep). The killed sweep and its runs are subprocesses; the
sweeps that no signal reaches run in this process, their runs too
(:class:`InProcessSweep`).

The killed sweep is 2 cells x 2 seeds by default (4 runs, to keep the suite
short); ``LAPLAX_SWEEP_FULL=1`` makes it the 2 x 2 grid x 2 seeds of issue
16's acceptance (8 runs, about 2 minutes more).
"""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from laplax import sweep
from laplax.analysis import seeds

from helpers.runs import CONFIG, ROOT, TINY, run_in_process

SWEEP_TINY = [
  a for a in TINY if not a.startswith(("--config.model.num_laplacian_heads", "--config.log_every"))
] + [
  "--config.total_steps=4",
  "--config.log_every=1",
  "--config.checkpoint_every=2",
  "--config.eval_every=1000",
  "--config.eval_batch_size=250",
  "--config.data.eval_split=test[:500]",
]
GRID = ["--grid", "model.num_laplacian_heads=0,1"] + (
  ["--grid", ":spectral=False,True"] if os.environ.get("LAPLAX_SWEEP_FULL") else []
)


def test_split_values_keeps_brackets_and_quotes():
  assert sweep.split_values("0,4") == ["0", "4"]
  assert sweep.split_values("(0.05,0.4),(0.1,0.5)") == ["(0.05,0.4)", "(0.1,0.5)"]
  assert sweep.split_values("'a,b',c") == ["'a,b'", "c"]
  for bad in ("(0,1", "1,,2", "'a"):
    with pytest.raises(sweep.SweepError):
      sweep.split_values(bad)


def test_plan_names_order_and_file_arguments():
  runs = sweep.plan(
    "configs/vit_fashion_mnist.py:laplacian=2",
    sweep.parse_grid(["optim.lr=1e-3,2e-3", ":recipe=plain,deit3"]),
    [0, 1],
    ["--config.total_steps=5"],
    "out",
  )
  assert [r.name for r in runs[:3]] == [
    "lr=1e-3,recipe=plain,seed=0",
    "lr=1e-3,recipe=plain,seed=1",
    "lr=1e-3,recipe=deit3,seed=0",
  ]
  assert len(runs) == 8 and runs[-1].name == "lr=2e-3,recipe=deit3,seed=1"
  assert runs[2].config == "configs/vit_fashion_mnist.py:laplacian=2,recipe=deit3"
  assert runs[2].overrides == (
    "--config.total_steps=5",
    "--config.optim.lr=1e-3",
    "--config.seed=0",
  )
  assert runs[2].workdir == os.path.join("out", runs[2].name)
  # Keys whose last parts clash keep their whole name.
  clash = sweep.plan(
    CONFIG, sweep.parse_grid(["model.dropout=0,0.1", "data.dropout=0"]), [0], [], "o"
  )
  assert clash[0].name == "model.dropout=0,data.dropout=0,seed=0"


@pytest.mark.parametrize(
  "extra,fragment",
  [
    (["--grid", "model.nope=1,2"], "unknown config key 'model.nope'"),
    (["--grid", "model.num_laplacian_heads=x"], "model.num_laplacian_heads"),
    (["--grid", "model.num_laplacian_heads=1,9"], "num_laplacian_heads=9"),
    (["--grid", "model.num_laplacian_heads"], "give KEY=V1,V2"),
    (["--grid", "seed=1,2"], "the seeds come from --seeds"),
    (["--grid", "optim.lr=1e-3", "--grid", "optim.lr=2e-3"], "given twice"),
    (["--seeds", "0,x"], "--seeds 0,x"),
    (["--seeds", "1,1"], "--seeds 1,1"),
    (["--config.model.nope=1"], "unknown config key 'model.nope'"),
    (["--frobnicate"], "unknown argument --frobnicate"),
    (["--grid", ":recipe=plain,bogus"], "recipe"),
    # The override sets the key the :laplacian axis changes: both cells equal.
    (["--grid", ":laplacian=0,2", "--config.model.num_laplacian_heads=1"], "have the same config"),
    (["--workdir", " "], "--workdir is empty"),
  ],
)
@pytest.mark.slow
def test_bad_sweep_is_one_line_exit_2_nothing_written(
  extra, fragment, tmp_path, capsys, fmnist_data_dir
):
  out = tmp_path / "sweep"
  code = sweep.main(
    ["--config", CONFIG, "--workdir", str(out), f"--config.data.data_dir={fmnist_data_dir}"] + extra
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
  assert fragment in err[0], err
  assert not out.exists()


def test_read_jsonl_keeps_what_a_killed_writer_left(tmp_path):
  assert seeds.read_jsonl(str(tmp_path / "none.jsonl")) == []
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "lo')
  assert seeds.read_jsonl(str(path)) == [{"step": 1}, {"step": 2}]


def test_mean_std_and_markdown_against_numpy(tmp_path):
  values = [0.81, 0.83, 0.86]
  stat = seeds.mean_std(values + [None])
  assert stat["n"] == 3 and stat["mean"] == pytest.approx(np.mean(values))
  assert stat["std"] == pytest.approx(np.std(values, ddof=1))
  assert seeds.mean_std([0.5]) == {"mean": 0.5, "std": None, "n": 1}
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no overflow in the squares
    huge = seeds.mean_std([1e200, 3e200])
  np.testing.assert_allclose([huge["mean"], huge["std"]], [2e200, np.sqrt(2) * 1e200], rtol=1e-12)
  for seed, acc in enumerate(values):
    w = tmp_path / f"r{seed}"
    w.mkdir()
    (w / "eval.json").write_text(
      json.dumps({"accuracy": acc, "loss": 1 - acc, "num_examples": 100, "step": 4})
    )
    (w / "metrics.jsonl").write_text(
      json.dumps({"step": 4, "split": "train", "loss": 2.0 + seed, "steps_per_sec": 9.0})
      + "\n"
      + '{"step": 5, "spl'
    )  # a killed writer's last line
  cells = [
    {
      "grid": {"model.num_laplacian_heads": "4"},
      "runs": {s: seeds.run_results(str(tmp_path / f"r{s}")) for s in range(3)},
    }
  ]
  agg = seeds.aggregate(cells)[0]
  assert set(agg["metrics"]) == {"accuracy", "loss", "train_loss"}
  assert agg["metrics"]["train_loss"]["mean"] == pytest.approx(3.0)
  table = seeds.markdown([agg])
  assert f"{np.mean(values):.4g} ± {np.std(values, ddof=1):.2g}" in table
  assert "| model.num_laplacian_heads=4 | 3 |" in table


def _snapshot(path):
  return {
    os.path.join(d, f): (
      os.stat(os.path.join(d, f)).st_mtime_ns,
      open(os.path.join(d, f), "rb").read(),
    )
    for d, _, files in os.walk(path)
    for f in files
  }


def _sweep_argv(workdir, data_dir):
  return (
    [
      "-m",
      "laplax.sweep",
      "--config",
      CONFIG,
      "--workdir",
      str(workdir),
      "--seeds",
      "0,1",
      f"--config.data.data_dir={data_dir}",
    ]
    + GRID
    + SWEEP_TINY
  )


class InProcessSweep:
  """``python -m laplax.sweep ARGV`` in this process, its runs' ``train.py``
  and ``eval.py`` too (a stand-in for ``sweep._call`` that calls
  :func:`helpers.runs.run_in_process` and appends their output to the run's
  log as the subprocess would): no interpreter and JAX import per run. The
  subprocesses themselves, their signals and their death with the sweep are
  the SIGKILL test's first, killed sweep.

  ``__call__(argv)`` returns ``(exit code, the sweep's own stdout, its stderr)``."""

  def __init__(self, capfd, monkeypatch):
    self.capfd, self.stdout = capfd, []
    monkeypatch.setattr(sweep, "_call", self.call)
    monkeypatch.setattr(sweep._Child, "planning", True)  # what main() changes

  def call(self, script, args, log_path):
    self.stdout.append(self.capfd.readouterr().out)  # before run_in_process drops it
    with open(log_path, "a") as log:
      log.write(f"\n$ {script} {' '.join(args)}\n")
    r = run_in_process([script, *args], self.capfd)
    with open(log_path, "a") as log:
      log.write(r.stdout + r.stderr)
    return r.returncode or 0

  def __call__(self, argv):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    self.capfd.readouterr()
    try:
      code = sweep.main(argv)
    finally:
      for s, handler in handlers.items():
        signal.signal(s, handler)
    out, err = self.capfd.readouterr()
    self.stdout.append(out)
    return code, "".join(self.stdout), err


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigkill_in_the_third_run_then_the_same_command_finishes(
  tmp_path, fmnist_data_dir, capfd, monkeypatch
):
  """The sweep killed with SIGKILL is a subprocess with its runs'; the same
  command that finishes it runs in this process (:class:`InProcessSweep`)."""
  out = tmp_path / "sweep"
  argv = _sweep_argv(out, fmnist_data_dir)
  log = open(tmp_path / "first.log", "w")
  proc = subprocess.Popen(
    [sys.executable] + argv,
    cwd=ROOT,
    stdout=log,
    stderr=subprocess.STDOUT,
    env=dict(os.environ, PYTHONUNBUFFERED="1"),
  )
  names = [r.name for r in sweep.plan(CONFIG, sweep.parse_grid(GRID[1::2]), [0, 1], [], str(out))]
  third = out / names[2]
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if (third / "metrics.jsonl").exists() and '"step": 1,' in (third / "metrics.jsonl").read_text():
      break
    time.sleep(0.005)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  log.close()
  assert not (third / "eval.json").exists(), "the kill came too late"
  assert not (out / names[3]).exists()
  time.sleep(1.0)  # the killed train.py dies with the sweep (PR_SET_PDEATHSIG)
  before = {n: _snapshot(out / n) for n in names[:2]}
  code, stdout, stderr = InProcessSweep(capfd, monkeypatch)(argv[2:])
  assert code == 0, stdout[-2000:] + stderr[-2000:]
  lines = stdout.splitlines()
  n = len(names)
  assert lines[0] == f"[1/{n}] {names[0]}: finished before, skipped"
  assert lines[1] == f"[2/{n}] {names[1]}: finished before, skipped"
  assert lines[2] == f"[3/{n}] {names[2]}: train + eval ..."
  assert {n: _snapshot(out / n) for n in names[:2]} == before
  assert (third / "train.log").read_text().count("$ train.py") == 2
  assert [
    m["step"] for m in seeds.read_jsonl(str(third / "metrics.jsonl")) if m["split"] == "train"
  ] == [1, 2, 3, 4]
  # The killed run equals the same run uninterrupted, so the summary is the
  # uninterrupted sweep's (the other runs ran once, untouched).
  ref = tmp_path / "reference"
  cfg = sweep.plan(
    CONFIG,
    sweep.parse_grid(GRID[1::2]),
    [0, 1],
    [f"--config.data.data_dir={fmnist_data_dir}"] + SWEEP_TINY,
    str(ref),
  )[2]
  assert run_in_process(["train.py"] + cfg.train_args(), capfd).returncode == 0
  assert run_in_process(["eval.py", "--workdir", cfg.workdir], capfd).returncode == 0
  results = {n: seeds.run_results(str(out / n)) for n in names}
  assert results[names[2]] == seeds.run_results(cfg.workdir)
  summary = json.loads((out / "summary.json").read_text())
  assert summary["unfinished"] == [] and set(summary["runs"]) == set(names)
  expected = seeds.aggregate(
    [
      {"grid": dict(r.cell), "runs": {s.seed: results[s.name] for s in runs_of_cell}}
      for r, runs_of_cell in _cells(out)
    ]
  )
  assert summary["cells"] == json.loads(json.dumps(expected))
  assert (out / "curves.png").stat().st_size > 0
  assert "± " in (out / "summary.md").read_text()


def _cells(out):
  runs = sweep.plan(CONFIG, sweep.parse_grid(GRID[1::2]), [0, 1], [], str(out))
  cells = {}
  for r in runs:
    cells.setdefault(r.cell, []).append(r)
  return [(rs[0], rs) for rs in cells.values()]


def test_results_csv_rows_have_the_fork_s_columns(tmp_path):
  """result_rows: the fork's results.csv columns from each run's config,
  eval.json and metrics.jsonl (CORE blank where eval.json has none)."""
  import ml_collections

  runs = sweep.plan(
    "configs/gpt_shakespeare.py",
    sweep.parse_grid(["model.num_laplacian_heads=0,2"]),
    [1],
    [],
    str(tmp_path),
  )
  configs, results = {}, {}
  for run_, core in zip(runs, (0.25, None)):
    os.makedirs(run_.workdir)
    c = ml_collections.ConfigDict(
      {
        "task": "lm",
        "total_steps": 40,
        "batch_size": 8,
        "model": {
          "depth": 2,
          "width": 64,
          "max_length": 32,
          "num_laplacian_heads": [0, 1] if core is None else 2,
        },
      }
    )
    configs[run_.name] = c
    evaluated = {"bits_per_byte": 2.5, "step": 40, **({"core_metric": core} if core else {})}
    (tmp_path / run_.name / "eval.json").write_text(json.dumps(evaluated))
    (tmp_path / run_.name / "metrics.jsonl").write_text(
      "".join(
        json.dumps(r) + "\n"
        for r in (
          {"step": 0, "split": "info", "num_params": 1234},
          {"step": 20, "split": "train", "loss": 3.0, "steps_per_sec": 10.0},
          {"step": 40, "split": "train", "loss": 2.0, "steps_per_sec": 4.0},
        )
      )
    )
    results[run_.name] = seeds.run_results(run_.workdir)
  rows = sweep.result_rows(runs, configs, results)
  assert list(rows[0]) == list(sweep.RESULT_COLUMNS)
  assert rows[0] == {
    "flops_budget": "optimal",
    "depth": 2,
    "laplacian_heads": 2,
    "seed": 1,
    "model_tag": runs[0].name,
    "model_dim": 64,
    "params_wte": None,  # no checkpoint: the groups are blank
    "params_value_embeds": None,
    "params_lm_head": None,
    "params_transformer": None,
    "params_scalars": None,
    "params_total": 1234,
    "num_iterations": 40,
    "tokens_trained": 40 * 8 * 32,
    "val_bpb": 2.5,
    "core_score": 0.25,
    "train_time_sec": pytest.approx(20 / 10 + 20 / 4),
  }
  assert rows[1]["laplacian_heads"] == "0x1" and rows[1]["core_score"] is None
  text = list(csv.reader(io.StringIO(sweep._csv(rows))))
  assert text[0] == list(sweep.RESULT_COLUMNS) and text[1][4] == runs[0].name
  assert text[1][15] == "0.25" and text[2][15] == ""
  agg = seeds.aggregate([{"grid": {"h": "0"}, "runs": {1: results[runs[0].name]}}])
  table = seeds.metrics_table(agg, sweep.NANOCHAT_METRICS)
  assert (
    table[0] == "| cell | seeds | val_bpb | core_score |" and table[2] == "| h=0 | 1 | 2.5 | 0.25 |"
  )


@pytest.mark.slow
def test_a_language_model_sweep_with_core_writes_the_fork_s_table(
  tmp_path, corpus, capfd, monkeypatch
):
  """--config.evals=bits_per_byte,core goes into every run's saved config, so
  eval.py scores CORE; summary.md leads with val_bpb and core_score,
  results.csv has a row per run. The sweep runs in this process, and so do
  its runs (:class:`InProcessSweep`)."""
  from helpers.core_bundle import write_bundle
  from helpers.lm import GPT_CONFIG
  from helpers.lm import TINY as LM_TINY

  bundle = write_bundle(
    tmp_path / "bundle",
    [
      ("lm", "language_modeling", 0, " ", 0.0, [{"context": "the cat", "continuation": "sat"}]),
      (
        "mc",
        "multiple_choice",
        0,
        " ",
        50.0,
        [{"query": "the cat sat on the", "choices": ["mat.", "dog."], "gold": 0}],
      ),
    ],
  )
  out = tmp_path / "sweep"
  code, stdout, stderr = InProcessSweep(capfd, monkeypatch)(
    [
      "--config",
      GPT_CONFIG,
      "--workdir",
      str(out),
      "--grid",
      "model.num_laplacian_heads=0,1",
      "--seeds",
      "3",
      f"--config.data.source_dir={corpus}",
      f"--config.data.data_dir={tmp_path / 'tfds'}",
      "--config.total_steps=20",
      "--config.eval_every=20",
      "--config.checkpoint_every=20",
      "--config.eval.sample_tokens=0",
      "--config.evals=bits_per_byte,core",
      f"--config.eval.core_bundle={bundle}",
    ]
    + [a for a in LM_TINY if not a.startswith("--config.log_every")]
    + ["--config.log_every=10"]
  )
  logs = [l.read_text()[-2000:] for l in sorted(out.glob("*/*.log"))]
  assert code == 0, (stdout[-2000:], stderr[-2000:], *logs)
  rows = list(csv.reader(io.StringIO((out / "results.csv").read_text())))
  assert rows[0] == list(sweep.RESULT_COLUMNS) and len(rows) == 3
  for row, heads in zip(rows[1:], ("0", "1")):
    evaluated = json.loads((out / row[4] / "eval.json").read_text())
    assert row[0] == "optimal" and row[2] == heads and row[3] == "3"
    assert row[12] == "20"
    # The groups from the checkpoint's shapes: the tied byte table (256 x 32)
    # and the blocks; no lm_head, value embeddings or scalars.
    assert (int(row[6]), row[7:9], row[10]) == (256 * 32, ["0", "0"], "0")
    assert 0 < int(row[9]) < int(row[11]) - 256 * 32
    assert float(row[14]) == evaluated["bits_per_byte"]
    assert float(row[15]) == evaluated["core_metric"] and set(evaluated["core_centered"]) == {
      "lm",
      "mc",
    }
  md = (out / "summary.md").read_text()
  assert "| cell | seeds | val_bpb | core_score |" in md
  assert "| model.num_laplacian_heads=1 | 1 |" in md
