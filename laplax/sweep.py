"""Seeded sweeps: every cell of a grid of config values, over seeds, one run after another.

    python -m laplax.sweep --config configs/vit_fashion_mnist.py \\
        --grid model.num_laplacian_heads=0,4 --grid :recipe=plain,deit3 \\
        --seeds 0,1,2 --workdir runs/sweep_vit --analysis

A grid key is a dotted config key (``model.num_laplacian_heads``,
``model.spectral.mode``, ``optim.lr``), whose values are parsed as
``--config.KEY=VALUE`` parses them, or ``:NAME``, an argument of the config
file (``:recipe=deit3`` runs ``configs/vit_fashion_mnist.py:recipe=deit3``).
Values are split at the commas outside brackets and quotes
(``--grid data.multicrop.local_scale=(0.05,0.4),(0.1,0.5)``). Further
``--config.KEY=VALUE`` flags apply to every run.

Each run of the cross product (grid cells x ``--seeds``, which set
``config.seed``) trains with ``train.py`` in ``WORKDIR/<name>/`` (``name``:
``key=value,...,seed=S`` with the last part of each key), then ``eval.py``
writes its ``eval.json`` (and, with ``--analysis``, ``eval.py --analysis``
its ``analysis.json``); both print into ``train.log`` / ``eval.log`` there.
A run whose ``eval.json`` (and ``analysis.json``) are of its last step is
finished and is not touched again; an interrupted one resumes from its newest
checkpoint, so re-running the same command finishes the sweep. After every run
the sweep writes ``WORKDIR/summary.json`` and ``WORKDIR/summary.md`` (per
cell, mean +- sample std over seeds of every final metric and of the
per-layer analysis quantities; :mod:`laplax.analysis.seeds`) and
``WORKDIR/curves.png`` (training curves, seeds as bands).

``eval.py`` evaluates what the run's saved config names, so
``--config.evals=bits_per_byte,core --config.eval.core_bundle=DIR`` (every
run) adds CORE (:mod:`laplax.proj.nanochat.evaluators.core`, ``eval.py`` only: once, at the
last step, as the fork's ``runs/laplacian_sweep.sh``). A language-model
sweep's ``summary.md`` starts with the fork's two columns, ``val_bpb``
(``bits_per_byte``) and ``core_score`` (``core_metric``), per cell, and
``WORKDIR/results.csv`` has a row per finished run with the columns of the
fork's ``results.csv`` (:data:`RESULT_COLUMNS`). A FLOPs budget per cell is a
grid of ``target_flops`` (``--grid :target_flops=1e18,4e18`` of
``configs/gpt_d20.py``, as the fork's ``FLOPS_BUDGETS``): each run then
trains ``round(F / (FLOPs per token x tokens per step))`` updates
(:func:`laplax.config.defaults.apply_target_flops`) instead of its
compute-optimal horizon, and ``results.csv``'s ``flops_budget`` says which.

Every run's config is checked before the first one starts: a bad flag, grid
key or value prints one line and exits with code 2, with nothing written. A
run that fails stops the sweep (exit 1, naming its log). SIGTERM or SIGINT
stops the running ``train.py`` after its step in flight with a checkpoint
(exit 0); if that step does not end within 5 s the child exits at once
and so does the sweep (exit 130 for SIGINT, 143 for SIGTERM, naming what
was saved); a second signal ends the child at once (it is killed if it is
still there 5 s later), and before the first run a signal ends the sweep
with nothing written. If the sweep itself is killed, so is its
``train.py`` (Linux), and the same command resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import signal
import site
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from laplax import utils
from laplax.analysis import seeds as seeds_lib
from laplax.errors import UserError

USAGE_EXIT = 2
# The directory holding the laplax package: the runs import this same laplax
# (put on their PYTHONPATH unless it is a site-packages directory).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What ``train.py`` / ``eval.py`` run (``python -m`` of these: the commands
# are in the package, so a sweep works from an installed laplax too).
COMMANDS = {"train.py": "laplax.cli.train", "eval.py": "laplax.cli.eval"}
SWEEP_FILE = "sweep.json"
SUMMARY_JSON, SUMMARY_MD, CURVES = "summary.json", "summary.md", "curves.png"
RESULTS_CSV = "results.csv"
#: eval.json's metrics under the names of the fork's ``runs/laplacian_sweep.sh``
#: (its ``results.csv``): validation bits per byte and the CORE score.
NANOCHAT_METRICS = (("bits_per_byte", "val_bpb"), ("core_metric", "core_score"))
#: The columns of the fork's ``results.csv``, in its order: the FLOPs budget
#: (``config.target_flops``, ``optimal`` without one: the compute-optimal
#: horizon), the grid cell and seed, the parameters by group
#: (:func:`param_groups`), the horizon and the results.
RESULT_COLUMNS = (
  "flops_budget",
  "depth",
  "laplacian_heads",
  "seed",
  "model_tag",
  "model_dim",
  "params_wte",
  "params_value_embeds",
  "params_lm_head",
  "params_transformer",
  "params_scalars",
  "params_total",
  "num_iterations",
  "tokens_trained",
  "val_bpb",
  "core_score",
  "train_time_sec",
)
#: The fork's parameter groups (nanochat/gpt.py ``num_scaling_params``) by
#: the first part of a laplax GPT's parameter names.
PARAM_GROUPS = {
  "wte": ("token_embedding",),
  "value_embeds": ("value_embed",),
  "lm_head": ("lm_head",),
  "transformer": ("block", "blocks"),
  "scalars": ("resid_lambdas", "x0_lambdas", "smear_gate", "smear_lambda", "backout_lambda"),
}
ANALYSIS_FILE = "analysis.json"  # eval.py --analysis's output in a run's workdir
# The flags a re-run must repeat: they decide what every run is.
_SAME_ON_RERUN = ("config", "overrides", "analysis", "analysis_examples")


class SweepError(UserError, ValueError):
  """A sweep the command line describes cannot run; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep: its grid cell, seed, workdir and ``train.py`` arguments."""

  name: str
  cell: tuple  # ((grid key, value), ...)
  seed: int
  workdir: str
  config: str  # FILE.py[:args]
  overrides: tuple  # --config.KEY=VALUE ...

  def train_args(self) -> list[str]:
    """The arguments of ``train.py`` for this run (after ``train.py``)."""
    return ["--config", self.config, "--workdir", self.workdir] + list(self.overrides)


def split_values(text: str) -> list[str]:
  """``text`` split at the commas outside ``()``, ``[]``, ``{}`` and quotes.

  Raises:
    SweepError: unbalanced brackets or quotes, or an empty value.
  """
  values, depth, quote, start = [], 0, None, 0
  for i, ch in enumerate(text):
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
      if depth < 0:
        break
    elif ch == "," and depth == 0:
      values.append(text[start:i])
      start = i + 1
  if depth or quote:
    raise SweepError(
      f"unbalanced brackets or quotes in {text!r}; e.g. --grid "
      f"data.multicrop.local_scale=(0.05,0.4),(0.1,0.5)"
    )
  values.append(text[start:])
  if any(not v.strip() for v in values):
    raise SweepError(f"empty value in {text!r}; give KEY=V1,V2 with no empty value")
  return [v.strip() for v in values]


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[str]]]:
  """``["KEY=V1,V2", ...]`` as ``[(KEY, [V1, V2]), ...]``.

  Raises:
    SweepError: no ``=``, a malformed key, a key given twice, ``seed``.
  """
  grid = []
  for item in items:
    key, eq, values = item.partition("=")
    key = key.strip()
    if not eq or not re.fullmatch(r":\w+|\w+(\.\w+)*", key):
      raise SweepError(
        f"--grid {item}: give KEY=V1,V2 with KEY a dotted config key "
        f"(model.num_laplacian_heads) or :NAME, an argument of the "
        f"config file (:recipe)"
      )
    if key in ("seed", ":seed"):
      raise SweepError(f"--grid {item}: the seeds come from --seeds, e.g. --seeds 0,1,2")
    if key in [k for k, _ in grid]:
      raise SweepError(f"--grid {key} is given twice; give its values once, comma-separated")
    grid.append((key, split_values(values)))
  return grid


def parse_seeds(text: str) -> list[int]:
  """``"0,1,2"`` as ``[0, 1, 2]``.

  Raises:
    SweepError: not comma-separated integers >= 0, or a seed given twice.
  """
  try:
    seeds = [int(s) for s in text.split(",")]
  except ValueError:
    seeds = []
  if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
    raise SweepError(
      f"--seeds {text}: give distinct integers >= 0, comma-separated, e.g. --seeds 0,1,2"
    )
  return seeds


def _with_file_args(config: str, args: Sequence[tuple[str, str]]) -> str:
  """``FILE.py[:a=1]`` with ``args`` (``[(name, value)]``) set in its argument."""
  path, _, given = config.partition(":")
  merged = dict(p.split("=", 1) if "=" in p else (p, "") for p in given.split(",") if p)
  merged.update(args)
  return path + (":" + ",".join(f"{k}={v}" for k, v in merged.items()) if merged else "")


def _short_names(keys: Sequence[str]) -> list[str]:
  """The last part of each key (``model.num_laplacian_heads`` ->
  ``num_laplacian_heads``, ``:recipe`` -> ``recipe``), or the whole key where
  two last parts clash."""
  last = [k.lstrip(":").rsplit(".", 1)[-1] for k in keys]
  return [s if last.count(s) == 1 else k.lstrip(":") for s, k in zip(last, keys)]


def plan(
  config: str,
  grid: Sequence[tuple[str, list[str]]],
  seeds: Sequence[int],
  overrides: Sequence[str],
  workdir: str,
) -> list[Run]:
  """The runs of the sweep, cells in grid order (the last key fastest), seeds
  innermost.

  Raises:
    SweepError: two runs would share a workdir name.
  """
  keys = [k for k, _ in grid]
  short = _short_names(keys)
  runs = []
  for values in itertools.product(*[v for _, v in grid]):
    cell = tuple(zip(keys, values))
    spec = _with_file_args(config, [(k[1:], v) for k, v in cell if k.startswith(":")])
    cell_flags = [f"--config.{k}={v}" for k, v in cell if not k.startswith(":")]
    for seed in seeds:
      parts = [f"{s}={re.sub(r'[^A-Za-z0-9._+-]', '-', v)}" for s, v in zip(short, values)]
      name = ",".join(parts + [f"seed={seed}"])
      runs.append(
        Run(
          name=name,
          cell=cell,
          seed=seed,
          workdir=os.path.join(workdir, name),
          config=spec,
          overrides=tuple(list(overrides) + cell_flags + [f"--config.seed={seed}"]),
        )
      )
  names = [r.name for r in runs]
  clash = next((n for n in names if names.count(n) > 1), None)
  if clash:
    raise SweepError(
      f"two runs would share the workdir {clash}: grid values differ only "
      f"in characters a directory name cannot keep; give distinct values"
    )
  return runs


def check_runs(runs: Sequence[Run]) -> dict:
  """Parses and validates every run's config as ``train.py`` would, before any
  runs; the configs by run name.

  Raises:
    SweepError: the first run whose flags, config or workdir is refused, as
      one line naming the run.
  """
  import jax
  from absl import flags
  from ml_collections import config_flags

  from laplax import tasks
  from laplax.cli import common as cli
  from laplax.config import validation as config_lib
  from laplax.evaluators import registry
  from laplax.workdir import files as workdir_lib

  configs = {}
  for run in runs:
    argv = ["train.py"] + run.train_args()
    values = flags.FlagValues()
    config_flags.DEFINE_config_file(
      "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
    )
    flags.DEFINE_string("workdir", None, "", flag_values=values)
    try:
      cli.parse_flags(argv, values, jax_config=False)
      config = cli.load_config_flag("config", values, argv)
      cli.model_from_init(config, argv)
      cli.apply_target_flops(config, argv)
      checked = tasks.validate(config, jax.device_count())
      registry.validate(config)
      workdir_lib.check_wandb(checked)
      workdir_lib.check_workdir(config, run.workdir)
    except (cli.UsageError, config_lib.ConfigError) as e:
      raise SweepError(f"run {run.name}: {utils.first_line(e)}") from None
    configs[run.name] = config
  seen = {}
  for run in runs:  # a grid axis that changes nothing (e.g. an override sets its key)
    key = (run.seed, configs[run.name].to_json())
    if key in seen and seen[key].cell != run.cell:
      raise SweepError(
        f"runs {seen[key].name} and {run.name} have the same config: the "
        f"grid values differ but the runs would not (does a --config. "
        f"override set the key a :NAME argument changes?)"
      )
    seen.setdefault(key, run)
  return configs


def _parse_args(argv: Sequence[str]):
  parser = argparse.ArgumentParser(
    prog="python -m laplax.sweep",
    description=__doc__.split("\n\n")[0],
    epilog="Any --config.KEY=VALUE applies to every run.",
  )
  parser.add_argument("--config", required=True, help="FILE.py[:args], as for train.py")
  parser.add_argument(
    "--grid",
    action="append",
    default=[],
    help="KEY=V1,V2 (repeatable); KEY a dotted config key or :NAME",
  )
  parser.add_argument("--seeds", default="0", help="comma-separated seeds (config.seed)")
  parser.add_argument("--workdir", required=True, help="the sweep's directory")
  parser.add_argument(
    "--analysis", action="store_true", help="also run eval.py --analysis on every run"
  )
  parser.add_argument(
    "--analysis_examples",
    type=int,
    default=0,
    help="--analysis: at most this many eval sequences (0 = all)",
  )

  def error(message):
    raise SweepError(message)

  parser.error = error
  args, rest = parser.parse_known_args(list(argv))
  for arg in rest:
    if not re.match(r"--config\.\w+(\.\w+)*=", arg):
      raise SweepError(
        f"unknown argument {arg}; the sweep takes --config, --grid, "
        f"--seeds, --workdir, --analysis and --config.KEY=VALUE"
      )
    if arg.startswith("--config.seed="):
      raise SweepError(f"{arg}: the seeds come from --seeds, e.g. --seeds 0,1,2")
  if not args.workdir.strip():
    raise SweepError("--workdir is empty; give the sweep's directory, e.g. --workdir runs/sweep")
  from laplax import store

  store.check_scheme(args.workdir)
  if store.is_remote(args.workdir):
    args.workdir = store.absolute(args.workdir)
  if args.analysis_examples < 0:
    raise SweepError(f"--analysis_examples={args.analysis_examples} must be >= 0")
  args.overrides = rest
  return args


def _check_sweep_file(args) -> None:
  """Refuses a workdir that holds a sweep of another command (its config,
  overrides or analysis flags differ; grid values and seeds may be added)."""
  from laplax import store

  store.check_bucket(args.workdir)
  path = os.path.join(args.workdir, SWEEP_FILE)
  if not store.exists(path):
    if store.isdir(args.workdir) and store.listdir(args.workdir):
      raise SweepError(
        f"--workdir {args.workdir} is not empty and holds no {SWEEP_FILE}; "
        f"give a new directory for the sweep"
      )
    return
  try:
    saved = json.loads(store.read_text(path))
  except (OSError, json.JSONDecodeError) as e:
    raise SweepError(
      f"{path} is unreadable ({type(e).__name__}); move it away or use another --workdir"
    ) from None
  for key in _SAME_ON_RERUN:
    now = getattr(args, key)
    if saved.get(key) != (list(now) if isinstance(now, (list, tuple)) else now):
      raise SweepError(
        f"--workdir {args.workdir} holds a sweep with {key}="
        f"{saved.get(key)!r}, not {now!r}; repeat its command or use "
        f"another --workdir"
      )


def _json_step(path: str) -> int | None:
  from laplax import store

  try:
    return int(json.loads(store.read_text(path))["step"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _steps_left(run: Run, config, analysis: bool) -> list[str]:
  """What ``run`` still needs: any of ``train``, ``eval``, ``analysis``. A run
  whose wall-time budget is spent (``optim.budget_hours``) is trained at its
  last checkpoint."""
  from laplax import loading as restore
  from laplax.train import budget
  from laplax.workdir.files import CHECKPOINT_DIR

  total = int(config.total_steps)
  saved = restore.saved_steps(run.workdir)
  if saved and budget.spent_at(
    os.path.join(run.workdir, CHECKPOINT_DIR, str(saved[-1])), config.optim.budget_hours
  ):
    total = saved[-1]
  need = []
  if total not in saved and not (total == 0 and saved):
    need.append("train")
  if "train" in need or _json_step(os.path.join(run.workdir, "eval.json")) != total:
    need.append("eval")
  if analysis and (
    "train" in need or _json_step(os.path.join(run.workdir, ANALYSIS_FILE)) != total
  ):
    need.append("analysis")
  return need


class _Child:
  """The running ``train.py``/``eval.py``: the sweep's first SIGTERM or SIGINT
  goes to it as SIGTERM (it saves after its step in flight and exits, or
  exits at once when that step does not end within 5 s), a second one as
  itself (it exits at once), and if it is still running
  :data:`STOP_BOUND_S` seconds after that it is killed. Before the first run
  a signal raises ``KeyboardInterrupt``. On Linux the child is killed if the
  sweep dies."""

  proc = None
  log = None  # the log of the command started last
  stopped = False
  planning = True
  signum = None
  count = 0

  @classmethod
  def forward(cls, signum, frame):
    cls.count += 1
    cls.stopped = True
    cls.signum = cls.signum or signum
    proc = cls.proc
    if proc is not None and proc.poll() is None:
      proc.send_signal(signal.SIGTERM if cls.count == 1 else signum)
      if cls.count > 1:
        threading.Timer(STOP_BOUND_S, lambda: proc.poll() is None and proc.kill()).start()
    elif cls.planning:
      raise KeyboardInterrupt


# Seconds a child may take to exit after a second signal before it is killed.
STOP_BOUND_S = 5.0


# Starts ``python ARGS`` so that it dies with the sweep (Linux: the parent-death
# signal SIGKILL), without a fork-time hook in the sweep, which has JAX's
# threads running: a separate small interpreter sets it and execs.
_LAUNCHER = (
  "import ctypes, os, sys\n"
  "if sys.platform.startswith('linux'):\n"
  "  ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL\n"
  "  if os.getppid() != int(sys.argv[1]): sys.exit(1)  # the sweep is gone\n"
  "os.execv(sys.executable, [sys.executable] + sys.argv[2:])\n"
)


def _call(script: str, args: Sequence[str], log_path: str) -> int:
  """``python SCRIPT ARGS`` (as ``python -m`` of its :data:`COMMANDS` module)
  with its output appended to ``log_path``; its exit code. A ``gs://`` log
  (an object store has no append) is written in a local temporary file that
  starts with the log's old text and is uploaded in whole when the command ends."""
  from laplax import store

  if not store.is_remote(log_path):
    return _call_logged(script, args, log_path)
  import tempfile

  with tempfile.TemporaryDirectory(prefix="laplax-sweep-") as tmp:
    local = os.path.join(tmp, store.name(log_path))
    with open(local, "wb") as f:
      if store.exists(log_path):
        f.write(store.read_bytes(log_path))
    try:
      return _call_logged(script, args, local)
    finally:
      store.upload(local, log_path)


def _call_logged(script: str, args: Sequence[str], log_path: str) -> int:
  """:func:`_call` with the local file ``log_path``."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  if PACKAGE_PARENT not in site.getsitepackages():  # a checkout, on sys.path by hand
    env["PYTHONPATH"] = os.pathsep.join(
      p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p
    )
  with open(log_path, "a") as log:
    log.write(f"\n$ {script} {' '.join(args)}\n")
    log.flush()
    _Child.proc = subprocess.Popen(
      [sys.executable, "-c", _LAUNCHER, str(os.getpid()), "-m", COMMANDS[script]] + list(args),
      stdout=log,
      stderr=subprocess.STDOUT,
      env=env,
    )
    code = _Child.proc.wait()
  _Child.proc = None
  return code


def _last_line_of(run: Run) -> str:
  """The last line of ``run``'s newest log (what its command said last)."""
  from laplax import store

  if store.is_remote(run.workdir):  # no mtime to compare: the log written last
    return _last_line(_Child.log) if _Child.log else ""
  logs = [os.path.join(run.workdir, n) for n in ("train.log", "eval.log")]
  logs = [p for p in logs if os.path.exists(p)]
  return _last_line(max(logs, key=os.path.getmtime)) if logs else ""


def _last_line(path: str) -> str:
  from laplax import store

  if store.is_remote(path):
    lines = [l.strip() for l in store.read_text(path).split("\n") if l.strip()]
  else:
    with open(path) as f:
      lines = [l.strip() for l in f if l.strip()]
  return lines[-1] if lines else ""


def run_one(run: Run, need: Sequence[str], args) -> int:
  """Trains and evaluates ``run`` as far as ``need`` says; the exit code of
  the last command (0, or 130/143 when a signal stopped it without a save).

  Raises:
    SweepError: ``train.py`` or ``eval.py`` failed (naming its log).
  """
  from laplax import store

  if not store.is_remote(run.workdir):  # an object store has no directories
    os.makedirs(run.workdir, exist_ok=True)
  steps = [
    ("train", "train.py", run.train_args(), "train.log"),
    ("eval", "eval.py", ["--workdir", run.workdir], "eval.log"),
    (
      "analysis",
      "eval.py",
      ["--workdir", run.workdir, "--analysis", f"--analysis_examples={args.analysis_examples}"],
      "eval.log",
    ),
  ]
  for what, script, script_args, log in steps:
    if what not in need:
      continue
    log_path = _Child.log = os.path.join(run.workdir, log)
    if what == "analysis" and store.is_remote(run.workdir):
      code = _remote_analysis(run.workdir, script_args, log_path)
    else:
      code = _call(script, script_args, log_path)
    if _Child.stopped:
      return code
    if code != 0:
      raise SweepError(
        f"run {run.name}: {script}{' --analysis' if what == 'analysis' else ''} "
        f"exited with {code}: {_last_line(log_path)} (log: {log_path})"
      )
  return 0


def _remote_analysis(workdir: str, script_args: Sequence[str], log_path: str) -> int:
  """``eval.py --analysis`` of a ``gs://`` run, whose figures eval.py writes
  only on local disk: into a temporary folder (``--out``), then uploaded into
  ``workdir`` after a success, ``analysis.json`` last (the sweep's sign of a
  finished analysis). Returns the exit code."""
  import shutil
  import tempfile

  from laplax import store

  staged = tempfile.mkdtemp(prefix="laplax-analysis-")
  try:
    out = os.path.join(staged, ANALYSIS_FILE)
    code = _call("eval.py", [*script_args, "--out", out], log_path)
    if code == 0 and not _Child.stopped:
      names = sorted(os.listdir(staged), key=lambda n: n == ANALYSIS_FILE)
      for name in names:
        store.upload(os.path.join(staged, name), store.join(workdir, name))
    return code
  finally:
    shutil.rmtree(staged, ignore_errors=True)


def _train_log(workdir: str) -> tuple[int | None, float | None]:
  """``(num_params, seconds)`` of a run's ``metrics.jsonl``: the ``info``
  record's parameter count and the training loop's wall time, the sum over
  its log intervals of steps / ``steps_per_sec`` (evaluations and saves in
  the interval included; a resumed run's repeated steps counted once)."""
  params, seconds, last = None, 0.0, 0
  for r in seeds_lib.read_metrics(workdir):
    if r.get("split") == "info" and isinstance(r.get("num_params"), int):
      params = r["num_params"]
    rate = r.get("steps_per_sec")
    if r.get("split") == "train" and isinstance(rate, (int, float)) and rate > 0:
      seconds += max(0, int(r["step"]) - last) / rate
      last = max(last, int(r["step"]))
  return params, (seconds if last else None)


def param_groups(params) -> dict:
  """The parameter count of each group of :data:`PARAM_GROUPS` (the fork's
  ``num_scaling_params``: ``wte``, ``value_embeds``, ``lm_head``, the blocks'
  parameters as ``transformer``, the scalars and gates of its trunk) in a tree
  of arrays or ``jax.ShapeDtypeStruct`` (``{name: {...}}``); a parameter of
  none (a final norm, learned positions) counts in no group."""
  import jax

  out = dict.fromkeys(PARAM_GROUPS, 0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    top = str(getattr(path[0], "key", path[0]))
    for group, names in PARAM_GROUPS.items():
      if any(top == n or (top.startswith(n) and top[len(n) :].isdigit()) for n in names):
        out[group] += math.prod(leaf.shape)
  return out


def _saved_groups(workdir: str) -> dict:
  """:func:`param_groups` of the newest checkpoint of ``workdir``, from its
  saved shapes (no array is read); ``{}`` if it has none readable."""
  from laplax import loading
  from laplax.workdir import checkpoint as ckpt_lib
  from laplax.workdir.files import CHECKPOINT_DIR

  steps = loading.saved_steps(workdir)
  if not steps:
    return {}
  state = os.path.join(workdir, CHECKPOINT_DIR, str(steps[-1]), "state")
  try:
    return param_groups(ckpt_lib.saved_shapes(state)["params"])
  except Exception:  # an unreadable checkpoint leaves the columns blank
    return {}


def result_rows(runs: Sequence[Run], configs: dict, results: dict) -> list[dict]:
  """A row of :data:`RESULT_COLUMNS` per finished run (``results``: run name ->
  :func:`laplax.analysis.seeds.run_results`), as the fork's ``results.csv``
  has them: ``flops_budget`` the run's ``config.target_flops`` (``optimal``
  without one), the run's name as ``model_tag``, the parameters by group from
  its newest checkpoint's shapes (:func:`param_groups`; blank without one),
  ``tokens_trained`` = steps x batch x context, a per-layer Laplacian count as
  ``1x2x0`` (the fork's tag), ``None`` where eval.json has no CORE."""
  rows = []
  for r in runs:
    if r.name not in results:
      continue
    c, metrics = configs[r.name], results[r.name]["metrics"]
    heads = c.model.num_laplacian_heads
    params, seconds = _train_log(r.workdir)
    groups = _saved_groups(r.workdir)
    budget = c.target_flops if "target_flops" in c else None
    values = (
      "optimal" if budget is None else f"{budget:g}",
      c.model.depth,
      "x".join(map(str, heads)) if isinstance(heads, (list, tuple)) else heads,
      r.seed,
      r.name,
      c.model.width,
      *(groups.get(g) for g in PARAM_GROUPS),
      params,
      c.total_steps,
      c.total_steps * c.batch_size * c.model.max_length,
      metrics.get("bits_per_byte"),
      metrics.get("core_metric"),
      seconds,
    )
    rows.append(dict(zip(RESULT_COLUMNS, values)))
  return rows


def _csv(rows: Sequence[dict]) -> str:
  import csv
  import io

  out = io.StringIO()
  writer = csv.DictWriter(out, RESULT_COLUMNS, lineterminator="\n")
  writer.writeheader()
  writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
  return out.getvalue()


def write_summary(runs: Sequence[Run], configs: dict, args) -> list[str]:
  """``summary.json``, ``summary.md`` and ``curves.png`` of the finished runs
  (and, for language models, ``results.csv``: :func:`result_rows`); the
  paths written. A language-model sweep's ``summary.md`` starts with
  :data:`NANOCHAT_METRICS` per cell."""
  from laplax import store, tasks

  finished = [r for r in runs if not _steps_left(r, configs[r.name], args.analysis)]
  cells = {}
  for r in runs:
    cells.setdefault(r.cell, {"grid": dict(r.cell), "runs": {}, "workdirs": []})
  results = {r.name: seeds_lib.run_results(r.workdir) for r in finished}
  for r in finished:
    cells[r.cell]["runs"][r.seed] = results[r.name]
    cells[r.cell]["workdirs"].append(r.workdir)
  done_cells = [c for c in cells.values() if c["runs"]]
  aggregated = seeds_lib.aggregate(done_cells)
  result = {
    "command": "python -m laplax.sweep " + " ".join(args.argv),
    "runs": {r.name: {"grid": dict(r.cell), "seed": r.seed, **results[r.name]} for r in finished},
    "cells": aggregated,
    "unfinished": [r.name for r in runs if r not in finished],
  }
  paths = [os.path.join(args.workdir, SUMMARY_JSON), os.path.join(args.workdir, SUMMARY_MD)]
  store.write(paths[0], json.dumps(result, indent=2))
  header = (
    f"# Sweep {args.workdir}\n\n`{result['command']}`\n\n{len(finished)} of "
    f"{len(runs)} runs finished; mean ± sample std over seeds.\n\n"
  )
  language_models = all(tasks.is_language_model(c) for c in configs.values())
  lead = [(k, h) for k, h in NANOCHAT_METRICS if any(k in c["metrics"] for c in aggregated)]
  if language_models and lead:
    names = ", ".join(f"`{h}` = `{k}`" for k, h in lead)
    header += (
      f"The fork's columns ({names} of eval.json; per run: {RESULTS_CSV}):\n\n"
      + "\n".join(seeds_lib.metrics_table(aggregated, lead))
      + "\n\nEvery metric:\n\n"
    )
  store.write(paths[1], header + seeds_lib.markdown(aggregated))
  if language_models:
    paths.append(os.path.join(args.workdir, RESULTS_CSV))
    rows = result_rows(runs, configs, {r.name: results[r.name] for r in finished})
    store.write(paths[-1], _csv(rows))
  curves = _plot_curves(done_cells, args.workdir)
  return paths + ([curves] if curves else [])


def _plot_curves(cells: list[dict], workdir: str) -> str | None:
  """:func:`laplax.analysis.seeds.plot_curves` into ``workdir/curves.png``
  (for ``gs://``: drawn in a local temporary folder, then uploaded)."""
  from laplax import store

  title = os.path.basename(os.path.normpath(workdir))
  if not store.is_remote(workdir):
    return seeds_lib.plot_curves(cells, os.path.join(workdir, CURVES), title=title)
  import tempfile

  with tempfile.TemporaryDirectory(prefix="laplax-sweep-") as tmp:
    local = seeds_lib.plot_curves(cells, os.path.join(tmp, CURVES), title=title)
    if local is None:
      return None
    store.upload(local, store.join(workdir, CURVES))
  return store.join(workdir, CURVES)


def main(argv: Sequence[str] | None = None) -> int:
  """The CLI (see the module docstring); returns the exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  signal.signal(signal.SIGTERM, _Child.forward)
  signal.signal(signal.SIGINT, _Child.forward)
  from laplax.cli import common as cli

  try:
    args = _parse_args(argv)
    args.argv = argv
    grid, seeds = parse_grid(args.grid), parse_seeds(args.seeds)
    runs = plan(args.config, grid, seeds, args.overrides, args.workdir)
    _check_sweep_file(args)
    cli.quiet()
    configs = check_runs(runs)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return USAGE_EXIT
  except KeyboardInterrupt:
    print(
      f"stopped by signal {_Child.signum} before any run started; nothing was written",
      file=sys.stderr,
    )
    return 128 + int(_Child.signum or signal.SIGINT)
  _Child.planning = False
  from laplax import store

  if not store.is_remote(args.workdir):  # an object store has no directories
    os.makedirs(args.workdir, exist_ok=True)
  record = {
    key: (
      list(getattr(args, key))
      if isinstance(getattr(args, key), (list, tuple))
      else getattr(args, key)
    )
    for key in _SAME_ON_RERUN
  }
  store.write(
    os.path.join(args.workdir, SWEEP_FILE),
    json.dumps(dict(record, grid=grid, seeds=seeds), indent=2),
  )
  for i, run in enumerate(runs, 1):
    need = _steps_left(run, configs[run.name], args.analysis)
    tag = f"[{i}/{len(runs)}] {run.name}"
    if _Child.stopped and need:  # a signal between two runs
      print(f"{tag}: not started, stopped by a signal; run the same command to go on", flush=True)
      write_summary(runs, configs, args)
      return 0
    if not need:
      print(f"{tag}: finished before, skipped", flush=True)
      continue
    print(f"{tag}: {' + '.join(need)} ...", flush=True)
    start = time.time()
    try:
      code = run_one(run, need, args)
    except OSError as e:
      print(
        f"error: run {run.name}: {e.strerror or e}: {e.filename or run.workdir}", file=sys.stderr
      )
      return 1
    except SweepError as e:
      write_summary(runs, configs, args)
      print(f"error: {e}", file=sys.stderr)
      return 1
    if _Child.stopped:
      saved = "" if code == 0 else f" before it could save ({_last_line_of(run)})"
      print(f"{tag}: stopped by a signal{saved}; run the same command to go on", flush=True)
      write_summary(runs, configs, args)
      return 0 if code == 0 else 128 + int(_Child.signum)
    shown = {
      k: v
      for k, v in json.loads(store.read_text(os.path.join(run.workdir, "eval.json"))).items()
      if k not in seeds_lib.NOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    print(
      f"{tag}: done in {time.time() - start:.0f} s: "
      + ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(shown.items())[:4]
      ),
      flush=True,
    )
    write_summary(runs, configs, args)
  paths = write_summary(runs, configs, args)
  print("summary: " + ", ".join(paths))
  return 0


if __name__ == "__main__":
  sys.exit(main())
