"""A run's workdir: its files, the metrics writer, and the checks before a run uses it.

The layout is docs/workdir.md. A write that fails on an OS error (a full disk)
raises a one-line :class:`~laplax.workdir.saving.SaveError` naming the file; a
half-written ``metrics.jsonl`` record is cut off again. Every file goes through
:mod:`laplax.store`, so a workdir may be ``gs://BUCKET/PATH``: its
metrics are then one object per record (:mod:`laplax.records`)
and its TensorBoard events are uploaded at each flush
(:mod:`laplax.workdir.tb_upload`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable

import jax
import ml_collections

from laplax import records, store, tasks, utils
from laplax.config import run as run_lib
from laplax.config import validation as config_lib
from laplax.tasks import schema
from laplax.workdir import saving, tb_upload

CONFIG_FILE = "config.json"
METRICS_FILE = records.METRICS_FILE
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
WANDB_RUN_ID = "wandb_run_id"


def _summary_writer():
  """tensorboardX's ``SummaryWriter`` class, imported without PyTorch (seconds at every start)."""
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter

    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


#: A run spec, or a complete ``ConfigDict`` whose sections are built from it
#: (:func:`laplax.config.run.section`).
Run = run_lib.RunSpec | ml_collections.ConfigDict


def check_wandb(run: Run) -> None:
  """Checks that ``wandb`` imports when ``config.wandb.project`` is set (the
  run's observability section, ``run.observability``).

  Raises:
    ConfigError: a project is set and the package is missing (or broken).
  """
  _check_wandb(run_lib.section(run, "observability"))


def _check_wandb(seen: run_lib.Observability) -> None:
  """:func:`check_wandb` of an observability section."""
  project = seen.wandb_project
  if not project:
    return
  try:
    import wandb  # noqa: F401  (only whether it imports)
  except ImportError:
    raise config_lib.ConfigError(
      f"config.wandb.project={project!r} needs the wandb package, which is not "
      f"installed; pip install wandb, or leave config.wandb.project unset"
    ) from None


def _hparam(value):
  """A config value as TensorBoard's hparams take it: bool, int, float or str."""
  if isinstance(value, (bool, int, float, str)):
    return value
  return json.dumps(value)


def _code_block(text: str) -> str:
  """``text`` as a Markdown code block (TensorBoard renders text as Markdown)."""
  return "\n".join("    " + line for line in text.splitlines())


class MetricWriter:
  """Appends ``{"step": int, "split": str, ...}`` records to ``metrics.jsonl``,
  TensorBoard and, with ``config.wandb.project``, W&B (process 0 only).

  Args:
    workdir: the run's directory.
    config: the run spec or its config (its observability section's
      ``wandb.project``, ``wandb.entity``, ``wandb.name``, ``wandb.mode``; the
      run id kept in ``workdir/wandb_run_id``, console silenced; the config
      goes to W&B whole).
    use_wandb: ``False`` leaves W&B out.
    last_step: returns the newest complete checkpoint's step (for error messages).

  Raises:
    ConfigError: ``wandb.init`` failed (e.g. online without ``wandb login``).
    SaveError: the TensorBoard directory or event file cannot be written.
  """

  def __init__(
    self,
    workdir: str,
    config: Run | None = None,
    use_wandb: bool = True,
    last_step: Callable[[], int | None] | None = None,
  ):
    self.active = jax.process_index() == 0
    self.workdir = workdir
    self.remote = store.is_remote(workdir)
    self.path = os.path.join(workdir, METRICS_FILE)
    self.tb_dir = os.path.join(workdir, TENSORBOARD_DIR)
    self._next_record = None  # gs://: the number of the next record object
    self._upload = None
    self.last_step = last_step
    self.tb = None
    self.wandb = None
    self._thread_error = _ThreadOSError()
    if not self.active:
      return
    seen = run_lib.section(config, "observability") if use_wandb and config is not None else None
    if seen is not None and seen.wandb_project:
      self.wandb = _start_wandb(workdir, run_lib.config_of(config), seen)
    with self._tb_guard(check=False):
      # A large queue: a writer thread killed by a full disk cannot block a put
      # before the error is seen.
      if self.remote:
        self._upload = tb_upload.Uploader(self.tb_dir)
      local = self._upload.local if self._upload else self.tb_dir
      self.tb = _summary_writer()(local, max_queue=10000)
    self._thread_error.install()

  def _metrics_guard(self):
    return saving.guard(METRICS_FILE, os.path.dirname(self.path), self.last_step)

  @contextlib.contextmanager
  def _tb_guard(self, check: bool = True):
    """OS errors of TensorBoard's writes (also of its writer thread) as a SaveError."""
    with saving.guard("TensorBoard events", self.tb_dir, self.last_step):
      if check:
        self._thread_error.reraise()
      yield
      if check:
        self._thread_error.reraise()

  def _flush_tb(self) -> None:
    """Flushes TensorBoard's events (and, gs://, uploads them)."""
    self.tb.flush()
    if self._upload is not None:
      self._upload.sync()

  def drop_after(self, step: int) -> None:
    """Removes records newer than ``step`` (left by a run killed after it)."""
    if self.active and self.remote:
      records.drop_after(self.workdir, step)
      return
    if not self.active or not os.path.exists(self.path):
      return
    with open(self.path) as f:
      lines = [l for l in f if l.strip()]
    keep = [l for l in lines if _record_step(l) <= step]
    if len(keep) != len(lines):
      with self._metrics_guard():
        utils.atomic_write(self.path, "".join(l if l.endswith("\n") else l + "\n" for l in keep))

  def _append(self, record: dict) -> None:
    """Appends one line; a failed write cuts the file back to its previous length."""
    data = (json.dumps(record) + "\n").encode()
    if self.remote:
      if self._next_record is None:
        self._next_record = max(records.indices(self.workdir), default=-1) + 1
      records.append(self.workdir, self._next_record, data.decode())
      self._next_record += 1
      return
    with self._metrics_guard():
      fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
      try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
          while data:
            data = data[os.write(fd, data) :]
        except OSError:
          os.ftruncate(fd, end)
          raise
      finally:
        os.close(fd)

  def write(self, step: int, split: str, metrics: dict) -> None:
    """Writes one record of Python scalars; TensorBoard and W&B get ``SPLIT/KEY``."""
    if not self.active:
      return
    self._append({"step": int(step), "split": split, **metrics})
    numbers = {f"{split}/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}
    with self._tb_guard():
      for tag, v in numbers.items():
        self.tb.add_scalar(tag, v, step)
      self._flush_tb()
    if self.wandb is not None and numbers:
      self.wandb.log(numbers, step=int(step))

  def write_config(self, config: ml_collections.ConfigDict, step: int) -> None:
    """The config into TensorBoard as text (tag ``config``) and as hparams.

    Keys flattened with dots (``optim.lr``); lists and ``None`` as JSON text.
    """
    if not self.active:
      return
    from tensorboardX.summary import hparams

    flat = utils.flatten_dotted(json.loads(config.to_json()))
    _, session_start, _ = hparams({k: _hparam(v) for k, v in flat.items()}, {})
    with self._tb_guard():
      self.tb.add_text("config", _code_block(config.to_json(indent=2)), step)
      self.tb.file_writer.add_summary(session_start, step)
      self._flush_tb()

  def write_eval(self, step: int, summary: dict, samples: dict[str, str]) -> None:
    """Writes the ``eval`` record ``summary`` and the text ``samples`` (see
    :meth:`write_texts`) at ``step``."""
    self.write(step, "eval", summary)
    self.write_texts(step, samples)

  def write_texts(self, step: int, texts: dict[str, str]) -> None:
    """Texts ``{tag: text}``: a ``{"step", "split": tag, "text"}`` record each, TensorBoard, W&B."""
    if not self.active or not texts:
      return
    for tag, text in texts.items():
      self._append({"step": int(step), "split": tag, "text": text})
      with self._tb_guard():
        self.tb.add_text(tag, _code_block(text), step)
    with self._tb_guard():
      self._flush_tb()
    if self.wandb is not None:
      self.wandb.log(dict(texts), step=int(step))

  def write_images(self, step: int, paths: dict[str, str]) -> None:
    """PNG files ``{tag: path}`` as TensorBoard images (bytes as they are) and W&B images."""
    if not self.active or not paths:
      return
    from PIL import Image
    from tensorboardX.proto.summary_pb2 import Summary

    for tag, path in paths.items():
      with open(path, "rb") as f:
        data = f.read()
      with Image.open(path) as im:
        width, height = im.size
        channels = len(im.getbands())
      image = Summary.Image(
        height=height, width=width, colorspace=channels, encoded_image_string=data
      )
      with self._tb_guard():
        self.tb.file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
    with self._tb_guard():
      self._flush_tb()
    if self.wandb is not None:
      import wandb

      self.wandb.log({tag: wandb.Image(path) for tag, path in paths.items()}, step=int(step))

  def close(self, failed: bool = False) -> None:
    """Closes TensorBoard and finishes W&B (exit code 1 if ``failed``; close errors then ignored).

    Raises:
      SaveError: the last TensorBoard events cannot be written (not ``failed``).
    """
    if self.tb is not None:
      tb, self.tb = self.tb, None
      try:
        with self._tb_guard(check=not failed):
          try:
            tb.close()
            if self._upload is not None:
              self._upload.sync()
          except Exception:
            _abandon(tb)
            if not failed:
              raise
      finally:
        self._thread_error.uninstall()
        if self._upload is not None:
          self._upload.cleanup()
    if self.wandb is not None:
      self.wandb.finish(exit_code=1 if failed else 0)
      self.wandb = None


def _abandon(tb) -> None:
  """Stops a tensorboardX writer whose last flush failed, skipping its ``atexit`` close.

  Uses tensorboardX 2.6's ``EventFileWriter`` attributes.
  """
  for file_writer in (tb.all_writers or {}).values():
    events = file_writer.event_writer
    events._closed = True
    worker = getattr(events, "_worker", None)
    if worker is not None and worker.is_alive():
      with contextlib.suppress(Exception):
        worker.stop()


def _record_step(line: str) -> int:
  """The ``step`` of a metrics.jsonl line; a line that is not JSON (cut off
  by a killed writer) counts as newer than any step, so it is dropped."""
  try:
    return int(json.loads(line).get("step", 0))
  except (ValueError, AttributeError, TypeError):
    return sys.maxsize


class _ThreadOSError:
  """Keeps the OS error that killed tensorboardX's writer thread for the main thread to raise."""

  def __init__(self):
    self.error = None
    self._previous = None

  def install(self) -> None:
    self._previous = threading.excepthook
    threading.excepthook = self._hook

  def uninstall(self) -> None:
    if self._previous is not None and threading.excepthook == self._hook:
      threading.excepthook = self._previous
    self._previous = None

  def _hook(self, args) -> None:
    if (
      type(args.thread).__name__ == "_EventLoggerThread"
      and saving.os_error(args.exc_value) is not None
    ):
      self.error = self.error or args.exc_value
      return
    (self._previous or threading.__excepthook__)(args)

  def reraise(self) -> None:
    if self.error is not None:
      raise self.error


def _start_wandb(workdir: str, config: ml_collections.ConfigDict, seen: run_lib.Observability):
  """Starts (or resumes, by the id in ``workdir/wandb_run_id``) the W&B run of
  the observability section ``seen``, with ``config`` as its config.

  Raises:
    ConfigError: wandb is missing or ``wandb.init`` failed.
  """
  _check_wandb(seen)
  import wandb

  id_path = os.path.join(workdir, WANDB_RUN_ID)
  run_id = None
  if store.exists(id_path):
    run_id = store.read_text(id_path).strip() or None
  try:
    run = wandb.init(
      project=seen.wandb_project,
      entity=seen.wandb_entity,
      name=seen.wandb_name or store.name(store.absolute(workdir)),
      mode=seen.wandb_mode,
      dir=tempfile.mkdtemp(prefix="laplax-wandb-") if store.is_remote(workdir) else workdir,
      id=run_id,
      resume="allow",
      config=json.loads(config.to_json()),
      settings=wandb.Settings(silent=True, console="off"),
    )
  except Exception as e:
    raise config_lib.ConfigError(
      f"wandb.init failed ({type(e).__name__}: {utils.first_line(e)}); check "
      f"config.wandb.* and `wandb login`, or use --config.wandb.mode=offline"
    ) from None
  if run_id is None:
    store.write(id_path, run.id + "\n")
  return run


def log_figures(workdir: str, config: Run, step: int, paths: list[str]) -> None:
  """Adds ``eval.py``'s PNG figures to TensorBoard (tag: file name, at ``step``) and W&B
  (``config``: the run spec, or its config).

  Without a working ``wandb`` one warning line; the figures go to TensorBoard only.
  """
  if not paths:
    return
  try:
    writer = MetricWriter(workdir, config)
  except config_lib.ConfigError as e:  # no wandb, or wandb.init failed
    print(f"warning: {e}; the figures go to TensorBoard only", file=sys.stderr)
    writer = MetricWriter(workdir, config, use_wandb=False)
  try:
    writer.write_images(step, {os.path.splitext(os.path.basename(p))[0]: p for p in paths})
  finally:
    writer.close()


def load_saved_config(workdir: str) -> ml_collections.ConfigDict | None:
  """``workdir/config.json`` completed by :func:`laplax.tasks.schema.complete`, or ``None``.

  Missing keys get their default or :data:`~laplax.tasks.schema.OLD_RUN_VALUES`.

  Raises:
    ConfigError: the file is unreadable or not a laplax run's config.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not store.exists(path):
    return None
  try:
    saved = json.loads(store.read_bytes(path))
  except store.StoreError:
    raise
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(
      f"{path} is unreadable ({type(e).__name__}); it is not a laplax run's "
      f"config, use another --workdir"
    ) from None
  if not (
    isinstance(saved, dict)
    and isinstance(saved.get("model"), dict)
    and saved.get("task") in tasks.task_names()
  ):
    raise config_lib.ConfigError(
      f"{path} is not a laplax run's config (no task and model); use another --workdir"
    )
  return schema.complete(ml_collections.ConfigDict(saved))


def write_config(
  config: ml_collections.ConfigDict, workdir: str, last_step: int | None = None
) -> None:
  """Writes ``workdir/config.json`` atomically (a temporary file, then a rename).

  Raises:
    SaveError: it cannot be written (naming ``last_step``, the newest checkpoint).
  """
  with saving.guard(CONFIG_FILE, workdir, lambda: last_step):
    store.write(os.path.join(workdir, CONFIG_FILE), config.to_json(indent=2))


def check_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a workdir that belongs to a run of another architecture.

  Raises:
    ConfigError: the saved config differs in a key that decides the parameters.
  """
  if store.is_remote(workdir):
    store.check_bucket(workdir)
  else:
    _check_local_parent(workdir)
  for name, want_dir in (
    (CHECKPOINT_DIR, True),
    (TENSORBOARD_DIR, True),
    (CONFIG_FILE, False),
    (METRICS_FILE, False),
  ):
    path = os.path.join(workdir, name)
    if store.exists(path) and store.isdir(path) != want_dir:
      raise config_lib.ConfigError(
        f"{path} should be a {'directory' if want_dir else 'file'}; this workdir "
        f"is not a laplax run's, use another --workdir"
      )
  saved = load_saved_config(workdir)
  ckpt = os.path.join(workdir, CHECKPOINT_DIR)
  if saved is None and any(n.isdigit() for n in store.listdir(ckpt)):
    raise config_lib.ConfigError(
      f"workdir {workdir} has checkpoints but no {CONFIG_FILE}, so its "
      f"architecture is unknown; restore {CONFIG_FILE} or use another --workdir"
    )
  if saved is None:
    return
  diff = config_lib.architecture_diff(saved.to_dict(), config)
  if diff:
    was = utils.flatten_dotted(saved.to_dict())
    shown = ", ".join(f"{k} (saved {was.get(k)!r})" for k in diff[:6])
    raise config_lib.ConfigError(
      f"workdir {workdir} holds a run with a different architecture "
      f"({shown}{' ...' if len(diff) > 6 else ''} differ); use "
      f"another --workdir or the same config"
    )


def _check_local_parent(workdir: str) -> None:
  """Refuses a local workdir that is a file, or below a file, or not writable.

  Raises:
    ConfigError: one line naming the path.
  """
  parent = existing_ancestor(workdir)
  if not os.path.isdir(parent):
    raise config_lib.ConfigError(
      f"--workdir {workdir} is a file; give a directory"
      if parent == os.path.abspath(workdir)
      else f"--workdir {workdir} cannot be created: {parent} is a file; give a directory"
    )
  if not os.access(parent, os.W_OK):
    raise config_lib.ConfigError(
      f"--workdir {workdir} is not writable ({parent}); choose a directory you can write to"
    )


def read_metric_lines(workdir: str) -> list[str]:
  """The records of ``workdir``'s metrics as JSON lines, in the order written:
  :func:`laplax.records.metric_lines`."""
  return records.metric_lines(workdir)


def existing_ancestor(path: str) -> str:
  """``path`` (absolute) or its nearest parent that exists (file or directory)."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return path


def eval_line(step: int, summary: dict) -> str:
  """``step N: key=value, ...`` (floats to 4 decimals), as ``train.py`` prints an evaluation."""
  return f"step {step}: " + ", ".join(
    f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()
  )
