"""A run's workdir: its files, the metrics writer, and the checks before a run uses it.

The workdir holds ``config.json`` (written atomically), ``metrics.jsonl`` (one
JSON object per record, each with ``step``), TensorBoard events under
``tensorboard/`` and orbax checkpoints under ``checkpoints/``.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import ml_collections

from laplax import utils
from laplax.train import config as config_lib

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"



def _summary_writer():
  """tensorboardX's ``SummaryWriter`` class, imported without PyTorch.

  tensorboardX imports ``torch`` when it is installed (only to accept torch
  tensors), which costs seconds at every start of ``train.py`` on a machine
  with PyTorch (the test dependencies); the import is blocked while
  tensorboardX loads, unless torch is already imported.
  """
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricWriter:
  """Appends records to ``metrics.jsonl`` and TensorBoard event files.

  Only process 0 writes. Each record is ``{"step": int, "split": str, ...}``.
  """

  def __init__(self, workdir: str):
    self.active = jax.process_index() == 0
    self.path = os.path.join(workdir, METRICS_FILE)
    self.tb = None
    if self.active:
      self.tb = _summary_writer()(os.path.join(workdir, "tensorboard"))

  def drop_after(self, step: int) -> None:
    """Removes records newer than ``step`` (left by a run killed after it)."""
    if not self.active or not os.path.exists(self.path):
      return
    with open(self.path) as f:
      lines = [l for l in f if l.strip()]
    keep = [l for l in lines if json.loads(l).get("step", 0) <= step]
    if len(keep) != len(lines):
      utils.atomic_write(self.path, "".join(keep))

  def write(self, step: int, split: str, metrics: dict) -> None:
    """Writes one record; values must be Python scalars."""
    if not self.active:
      return
    record = {"step": int(step), "split": split, **metrics}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for k, v in metrics.items():
      if isinstance(v, (int, float)):
        self.tb.add_scalar(f"{split}/{k}", v, step)
    self.tb.flush()

  def close(self) -> None:
    """Closes the TensorBoard writer."""
    if self.tb is not None:
      self.tb.close()


def load_saved_config(workdir: str) -> ml_collections.ConfigDict | None:
  """The config saved in ``workdir/config.json``, or ``None`` if there is none."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(
        f"{path} is unreadable ({type(e).__name__}); it is not a laplax run's "
        f"config, use another --workdir") from None
  if not (isinstance(saved, dict) and isinstance(saved.get("model"), dict)
          and saved.get("task") in config_lib.task_names()):
    raise config_lib.ConfigError(
        f"{path} is not a laplax run's config (no task and model); use another "
        f"--workdir")
  return ml_collections.ConfigDict(saved)


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes ``workdir/config.json`` atomically (a temporary file, then a rename)."""
  utils.atomic_write(os.path.join(workdir, CONFIG_FILE), config.to_json(indent=2))


def check_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a workdir that belongs to a run of another architecture.

  Raises:
    ConfigError: the saved config differs in a key that decides the parameters.
  """
  parent = existing_ancestor(workdir)
  if not os.path.isdir(parent):
    raise config_lib.ConfigError(
        f"--workdir {workdir} is a file; give a directory" if parent == os.path.abspath(workdir)
        else f"--workdir {workdir} cannot be created: {parent} is a file; give a directory")
  if not os.access(parent, os.W_OK):
    raise config_lib.ConfigError(f"--workdir {workdir} is not writable ({parent}); "
                                 f"choose a directory you can write to")
  for name, want_dir in ((CHECKPOINT_DIR, True), ("tensorboard", True),
                         (CONFIG_FILE, False), (METRICS_FILE, False)):
    path = os.path.join(workdir, name)
    if os.path.exists(path) and os.path.isdir(path) != want_dir:
      raise config_lib.ConfigError(
          f"{path} should be a {'directory' if want_dir else 'file'}; this workdir "
          f"is not a laplax run's, use another --workdir")
  saved = load_saved_config(workdir)
  ckpt = os.path.join(workdir, CHECKPOINT_DIR)
  if saved is None and os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt)):
    raise config_lib.ConfigError(
        f"workdir {workdir} has checkpoints but no {CONFIG_FILE}, so its "
        f"architecture is unknown; restore {CONFIG_FILE} or use another --workdir")
  if saved is None:
    return
  diff = config_lib.architecture_diff(saved.to_dict(), config)
  if diff:
    was = utils.flatten_dotted(saved.to_dict())
    shown = ", ".join(f"{k} (saved {was.get(k)!r})" for k in diff[:6])
    raise config_lib.ConfigError(
        f"workdir {workdir} holds a run with a different architecture "
        f"({shown}{' ...' if len(diff) > 6 else ''} differ); use "
        f"another --workdir or the same config")


def existing_ancestor(path: str) -> str:
  """``path`` (absolute) or its nearest parent that exists (file or directory)."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return path
