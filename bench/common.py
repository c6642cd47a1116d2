"""What the benchmark scripts share: a config file and its ``--set``
overrides, the task built from shapes alone, the analytic FLOPs count, and
the one-line error exit.

``bench/step_time.py``, ``bench/compile_report.py`` (and its
``segmentation_compile.py``), ``bench/peer_torch.py`` and the smaller
scripts import these from here, so no benchmark script imports another one
for them. This module imports neither JAX nor laplax when it is loaded:
``bench/compile_report.py`` sets ``XLA_FLAGS`` (its fake CPU devices) before
JAX starts, and imports this module first.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys

#: Bytes in a GiB (2**30), the unit of :func:`size`.
GIB = 2.0**30


def fail(message: str) -> None:
  """Prints ``error: MESSAGE`` (one line) on stderr and exits with code 2."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def size(num_bytes: float) -> str:
  """``num_bytes`` in GiB, or in MiB below 1 GiB (``"1.50 GiB"``, ``"12.0 MiB"``)."""
  return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB else f"{num_bytes / 2.0**20:.1f} MiB"


def load_config(spec: str):
  """The ``ml_collections.ConfigDict`` of ``spec``, ``FILE.py`` or
  ``FILE.py:ARG`` (``get_config(ARG)``, as ``train.py --config`` reads it).

  A missing file or one whose ``get_config`` raises is one ``error:`` line
  and exit 2 (:func:`fail`).
  """
  path, _, arg = spec.partition(":")
  if not os.path.exists(path):
    fail(f"config file {path} does not exist")
  module_spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception as e:
    fail(f"config {spec}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
  return None


def apply_override(config, item: str) -> None:
  """Sets one ``--set KEY=VALUE`` in ``config``: ``KEY`` a dotted key the
  config has, ``VALUE`` a Python literal (else the string as written).

  An item without ``=``, an unknown key or a value of the wrong type is one
  ``error:`` line and exit 2 (:func:`fail`).
  """
  key, sep, raw = item.partition("=")
  if not sep:
    fail(f"--set {item!r} must be KEY=VALUE, e.g. model.remat=full")
  node = config
  parts = key.split(".")
  for part in parts[:-1]:
    if part not in node:
      fail(f"--set {key}: unknown key {part!r}")
    node = node[part]
  if parts[-1] not in node:
    fail(f"--set {key}: unknown key {parts[-1]!r}")
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    value = raw
  try:
    node[parts[-1]] = value
  except (TypeError, ValueError) as e:
    fail(f"--set {item}: {str(e).splitlines()[0]}")


def make_task(config, image_shape, num_classes):
  """``config``'s task built from shapes alone, no dataset opened
  (:meth:`laplax.tasks.base.TaskBase.from_shapes`): a language model gets the
  byte vocabulary or ``data.vocab_size`` for BPE (``image_shape`` and
  ``num_classes`` unused), an image task images of ``image_shape`` (H, W, C)
  and ``num_classes`` classes."""
  from laplax import tasks

  return tasks.TASKS[config.task].from_shapes(
    config, image_shape=image_shape, num_classes=num_classes
  )


def analytic_flops(config, task, params, remat: bool) -> tuple[float, float]:
  """(matmul-parameter count, analytic train FLOPs per step) of the config:
  :func:`laplax.plan.flops.analytic_flops` (moved into the library for
  ``python -m laplax.plan``; imported here on first call, so that loading this
  module still imports neither JAX nor laplax)."""
  from laplax.plan import flops

  return flops.analytic_flops(config, task, params, remat)


def start_chat_server(args: list[str], root: str):
  """Starts ``python -m laplax.proj.nanochat.chat ARGS --web --port 0`` in ``root`` and
  waits (at most 600 s) for its ``laplax-chat: open URL`` line.

  Returns ``(process, url)``; the caller stops the process (SIGINT).
  Raises ``SystemExit`` with the server's output if it ends or never opens.
  """
  import re
  import subprocess
  import threading
  import time

  env = dict(os.environ, PYTHONUNBUFFERED="1")
  server = subprocess.Popen(
    [sys.executable, "-m", "laplax.proj.nanochat.chat", *args, "--web", "--port", "0"],
    cwd=root,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  lines: list[str] = []
  threading.Thread(target=lambda: lines.extend(server.stderr), daemon=True).start()
  deadline = time.monotonic() + 600
  while not any("laplax-chat: open" in line for line in lines):
    if server.poll() is not None or time.monotonic() > deadline:
      server.kill()
      raise SystemExit(f"the server did not start: {''.join(lines)}")
    time.sleep(0.1)
  url = re.search(r"(http://\S+)", next(x for x in lines if "laplax-chat: open" in x)).group(1)
  return server, url
