"""Soak test: memory, step time and checkpoint time of one long training run.

    python bench/soak.py --minutes 32                                   # the default ViT
    python bench/soak.py --config configs/gpt_shakespeare.py --minutes 32
    python bench/soak.py --minutes 32 --data_dir ~/tensorflow_datasets -- --config.batch_size=128

Runs ``train.py`` (the real command, in a subprocess, on a new workdir under
``--out``) with ``total_steps`` large enough not to end, ``log_every`` =
``--log_every`` and ``checkpoint_every`` = ``--checkpoint_every`` (in-loop
evaluations off), samples the child's resident memory (``VmRSS`` of
``/proc/PID/status``) every ``--sample_s`` seconds, and after ``--minutes``
stops it with one SIGINT (the graceful stop: a checkpoint and exit 0).
Arguments after ``--`` go to ``train.py`` as they are.

From the run's ``metrics.jsonl`` (one ``train`` record every ``log_every``
steps, with ``steps_per_sec`` over the interval) it takes the time per step of
each interval: the intervals that contain no checkpoint save give the step
time; an interval right after a save step (the save's synchronous part and any
wait for the previous asynchronous write fall into it) gives the checkpoint
stall, its time minus the median step time times its steps.

Also samples the child's CPU time (user + system, ``/proc/PID/stat``) with the
last logged step, so that the CPU time per step, which other jobs on the machine
do not move as they move the wall clock, is compared between the first window
after warm-up and the last.

Prints, per window of ``--window_s`` seconds, the RSS and median step time,
then the growth ratios the soak checks: RSS at the end over RSS at
``--warmup_s`` seconds (5 minutes), and the median step time of the last
window over that of the first window after warm-up (both should be 1.00 to
within 5%), and the median checkpoint stall against the median step time.
Exits 1 if the run did not stop with exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_bytes(pid: int) -> int | None:
  """Resident set size of ``pid`` in bytes (Linux), ``None`` once it is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def _cpu_seconds(pid: int) -> float | None:
  """User + system CPU time of ``pid`` in seconds (``/proc/PID/stat``), ``None`` once gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _last_step(workdir: str) -> int | None:
  """The step of the last ``train`` record of ``metrics.jsonl`` (``None``: none yet)."""
  records = _train_records(workdir)
  return records[-1]["step"] if records else None


def _train_records(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [r for r in rows if r.get("split") == "train" and "steps_per_sec" in r]


def _median(values):
  return statistics.median(values) if values else float("nan")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/vit_fashion_mnist.py")
  parser.add_argument("--minutes", type=float, default=32.0)
  parser.add_argument("--out", default="runs/soak")
  parser.add_argument("--data_dir", default=None)
  parser.add_argument("--log_every", type=int, default=25)
  parser.add_argument("--checkpoint_every", type=int, default=200)
  parser.add_argument("--sample_s", type=float, default=5.0)
  parser.add_argument("--warmup_s", type=float, default=300.0)
  parser.add_argument("--window_s", type=float, default=300.0)
  parser.add_argument(
    "--analyze", default=None, help="a soak's WORKDIR.soak.json: print its figures again"
  )
  args, extra = parser.parse_known_args(argv)
  if args.analyze:
    with open(args.analyze) as f:
      saved = json.load(f)
    return _analyze(args, saved["workdir"], saved["samples"], saved["wall"], saved["code"])
  extra = [a for a in extra if a != "--"]
  if args.checkpoint_every % args.log_every:
    print("error: --checkpoint_every must be a multiple of --log_every", file=sys.stderr)
    return 2
  name = os.path.splitext(os.path.basename(args.config.partition(":")[0]))[0]
  workdir = os.path.join(args.out, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
  os.makedirs(args.out, exist_ok=True)
  cmd = [
    sys.executable,
    "train.py",
    "--config",
    args.config,
    "--workdir",
    workdir,
    "--config.total_steps=10000000",
    f"--config.log_every={args.log_every}",
    f"--config.checkpoint_every={args.checkpoint_every}",
    "--config.eval_every=100000000",
  ]
  if args.data_dir:
    cmd.append(f"--config.data.data_dir={args.data_dir}")
  cmd += extra
  print("command:", " ".join(cmd[1:]), flush=True)
  log_path = workdir + ".log"
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log)
    t0 = time.monotonic()
    samples: list[tuple] = []  # (seconds, RSS bytes, CPU seconds, last logged step)
    while proc.poll() is None and time.monotonic() - t0 < 60 * args.minutes:
      rss, cpu = _rss_bytes(proc.pid), _cpu_seconds(proc.pid)
      if rss is not None and cpu is not None:
        step = _last_step(os.path.join(ROOT, workdir))
        samples.append((time.monotonic() - t0, rss, cpu, step))
      time.sleep(args.sample_s)
    if proc.poll() is None:
      proc.send_signal(signal.SIGINT)
    code = proc.wait()
  wall = time.monotonic() - t0
  with open(log_path) as f:
    tail = [line for line in f.read().replace("\r", "\n").splitlines() if line.strip()][-1:]
  print(f"train.py exit {code} after {wall:.0f} s: {tail[0] if tail else ''}", flush=True)
  with open(workdir + ".soak.json", "w") as f:
    json.dump({"workdir": workdir, "samples": samples, "wall": wall, "code": code}, f)
  return _analyze(args, workdir, samples, wall, code)


def _analyze(args, workdir: str, samples: list, wall: float, code: int) -> int:
  """Prints the soak's windows and ratios (see the module docstring)."""
  log_path = workdir + ".log"

  # Step time per log interval, placed on the soak's clock by the record's
  # arrival (the interval ends write it; metrics.jsonl has no wall clock).
  records = _train_records(os.path.join(ROOT, workdir))
  if not records or not samples:
    print("error: no train records or RSS samples: see " + log_path, file=sys.stderr)
    return 1
  # Each record's end time on the soak's clock: the intervals' wall times
  # (log_every / steps_per_sec) summed backwards from the end of training.
  seconds = [args.log_every / r["steps_per_sec"] for r in records]
  ends, t = [], wall
  for s in reversed(seconds):
    ends.append(t)
    t -= s
  ends.reverse()
  start_steps = {r["step"] for r in records if r["step"] % args.checkpoint_every == 0}
  after_save = [r["step"] - args.log_every in start_steps for r in records]
  step_s = [(e, s / args.log_every) for e, s, a in zip(ends, seconds, after_save) if not a]
  first_train = ends[0] - seconds[0]
  # Warm-up: the first --warmup_s seconds of training (compilation included).
  warm = first_train + args.warmup_s
  window = args.window_s
  print(f"{'window (s)':>14} {'RSS (MiB)':>10} {'median step (ms)':>17}")
  edges = list(range(0, int(wall) + int(window), int(window)))
  for lo, hi in zip(edges, edges[1:]):
    rss = [r for t_, r, *_ in samples if lo <= t_ < hi]
    st = [s for e, s in step_s if lo <= e < hi]
    print(
      f"{lo:>6}-{hi:<7} {(max(rss) / 2**20 if rss else float('nan')):>10.1f} "
      f"{_median(st) * 1e3:>17.1f}"
    )
  rss_warm = [r for t_, r, *_ in samples if t_ >= warm]
  steps_warm = [s for e, s in step_s if e >= warm]
  if len(rss_warm) < 2 or len(steps_warm) < 4:
    print(f"error: the run was too short for a warm-up of {args.warmup_s:g} s", file=sys.stderr)
    return 1
  first_window = [s for e, s in step_s if warm <= e < warm + window]
  last_window = [s for e, s in step_s if e >= ends[-1] - window]
  median_step = _median(steps_warm)
  stalls = [
    s - median_step * args.log_every
    for e, s, a in zip(ends, seconds, after_save)
    if a and e >= warm
  ]
  print(
    f"RSS: {rss_warm[0] / 2**20:.1f} MiB at {warm:.0f} s -> {samples[-1][1] / 2**20:.1f} MiB "
    f"at {samples[-1][0]:.0f} s: growth {samples[-1][1] / rss_warm[0]:.3f}x "
    f"(max after warm-up {max(r for r in rss_warm) / rss_warm[0]:.3f}x)"
  )
  print(
    f"median step time: {_median(first_window) * 1e3:.1f} ms (first {window:g} s after "
    f"warm-up) -> {_median(last_window) * 1e3:.1f} ms (last {window:g} s): drift "
    f"{_median(last_window) / _median(first_window):.3f}x; "
    f"{records[-1]['step']} steps in all"
  )
  print(
    f"checkpoint stall (extra time of the interval after a save, {len(stalls)} saves): "
    f"median {_median(stalls) * 1e3:.0f} ms = {_median(stalls) / median_step:.2f} steps"
  )
  _cpu_drift(samples, warm, window)
  return 0 if code == 0 else 1


def _cpu_drift(samples: list, warm: float, window: float) -> None:
  """CPU seconds per step (the process's user + system time over the steps
  logged) in the first window after warm-up and in the last window: a
  slowdown of the run itself shows here even when other jobs share the
  machine, which moves the wall-clock step time."""
  rows = [r for r in samples if len(r) == 4 and r[3] is not None and r[0] >= warm]
  if len(rows) < 4:
    return

  def per_step(part):
    (_, _, c0, s0), (_, _, c1, s1) = part[0], part[-1]
    return (c1 - c0) / (s1 - s0) if s1 > s0 else float("nan")

  first = [r for r in rows if r[0] < warm + window]
  last = [r for r in rows if r[0] >= rows[-1][0] - window]
  a, b = per_step(first), per_step(last)
  print(
    f"CPU time per step: {a * 1e3:.1f} ms (first {window:g} s after warm-up) -> "
    f"{b * 1e3:.1f} ms (last {window:g} s): drift {b / a:.3f}x"
  )


if __name__ == "__main__":
  sys.exit(main())
