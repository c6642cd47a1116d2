"""Checkpoints: an orbax CheckpointManager holding the whole state of a run.

Each step directory holds two items: ``state`` (step, parameters, optimizer
state, RNG key, task state such as DINO's teacher; :class:`~laplax.state.TrainState`) and ``data`` (the grain iterator state as
JSON), so a resumed run continues exactly where the saved one stood. Orbax
writes each step into a temporary directory and renames it when complete, so
a killed save never replaces the previous checkpoint. With ``verify`` each step
carries a checksum manifest of its files, committed by the same rename and
checked before the step is restored (:mod:`laplax.workdir.integrity`). A save
that fails on an operating-system error (a full disk) is cleaned up and
raised as one line (:class:`~laplax.workdir.saving.SaveError`).

In an object store (``gs://``) orbax writes each step in place and marks it
complete with ``commit_success.txt`` (no rename); a step directory without
that file is incomplete, and the directory listings here go through
:mod:`laplax.store`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp

from laplax import store
from laplax.errors import UserError
from laplax.state import TrainState
from laplax.workdir import integrity, saving

# Orbax writes step N into "N.orbax-checkpoint-tmp..." and renames it when complete;
# in gs:// it writes "N" in place and then "N/commit_success.txt".
_INCOMPLETE = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")
_COMMITTED = "commit_success.txt"


@contextlib.contextmanager
def _orbax_errors_silenced():
  """Orbax logs unreadable metadata at ERROR level; :class:`Checkpointer`
  reports those steps itself, once, in one line."""
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    absl_logger.setLevel(level)


class _DropOrbaxErrors(logging.Filter):
  """Drops orbax's ERROR logs (its background threads log a failed write with
  its traceback) and asyncio's "exception was never retrieved" of the OS
  errors of orbax's abandoned write tasks; :class:`Checkpointer` raises the
  failure itself, in one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
      return True
    if record.name == "asyncio":
      return not (record.exc_info and saving.os_error(record.exc_info[1]) is not None)
    return f"{os.sep}orbax{os.sep}" not in (record.pathname or "")


_DROP_ORBAX_ERRORS = _DropOrbaxErrors()


def _closed_loop_callback(exc: BaseException, tb) -> bool:
  """Whether ``exc`` is the ``RuntimeError: Event loop is closed`` that
  tensorstore's completion callbacks raise (and report as unraisable) when
  orbax has closed the event loop of a failed save."""
  if not (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"):
    return False
  tb = tb or exc.__traceback__
  names = []
  while tb is not None:
    names.append(tb.tb_frame.f_code.co_name)
    tb = tb.tb_next
  return "call_soon_threadsafe" in names


def _quiet_unraisablehook(previous):
  """``sys.unraisablehook`` without :func:`_closed_loop_callback`'s errors
  (the failed save is raised in one line by :class:`Checkpointer`)."""

  def hook(unraisable):
    if not _closed_loop_callback(unraisable.exc_value, unraisable.exc_traceback):
      previous(unraisable)

  hook.laplax_quiet = True
  return hook


def _retry_vanished(fn, attempts: int = 5):
  """``fn()``, again when it fails because a step directory vanished while
  orbax listed them (a running train.py deletes old steps)."""
  for attempt in range(attempts):
    try:
      return fn()
    except FileNotFoundError:
      if attempt == attempts - 1:
        raise
  return None


def _remove_tree(path: str) -> None:
  """Removes ``path`` and everything under it (nothing writes there any
  more); a file that vanished meanwhile is no error.

  Raises:
    OSError: the tree cannot be removed (permissions).
  """
  if store.is_remote(path):
    store.rmtree(path)
    return
  while os.path.lexists(path):
    try:
      shutil.rmtree(path)
    except OSError as e:
      if e.errno not in (errno.ENOENT, errno.ENOTEMPTY):
        raise


class CheckpointError(UserError, ValueError):
  """No checkpoint of a run can be read; the message is one line."""


def saved_shapes(state_dir: str) -> dict:
  """The tree a step's ``state`` item holds, as saved (``{"step", "params",
  "opt_state", "rng", "task_state"}`` with ``jax.ShapeDtypeStruct`` leaves,
  ``None`` where the saved value was ``None``), read from orbax's metadata
  without reading an array.

  Raises:
    Exception: orbax's, for a directory without readable metadata.
  """
  with _orbax_errors_silenced(), ocp.PyTreeCheckpointer() as reader:
    meta = reader.metadata(state_dir)
  tree = getattr(meta, "item_metadata", meta)
  tree = getattr(tree, "tree", tree)
  is_array = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
  return jax.tree_util.tree_map(
    lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype) if is_array(m) else m,
    dict(tree),
    is_leaf=is_array,
  )


def _restore_args(abstract_state: Any, state_dir: str, partial: bool):
  """orbax's restore arguments of the ``state`` item: ``abstract_state`` (or
  its value for ``state_dir`` when it is a function) with every leaf without
  a sharding placed on this process's first device; with ``partial`` only
  the fields it names are read."""
  if callable(abstract_state):
    abstract_state = abstract_state(state_dir)
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract_state = jax.tree_util.tree_map(
    lambda x: (
      x
      if getattr(x, "sharding", None) is not None
      else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    ),
    abstract_state,
  )
  if not partial:
    return ocp.args.StandardRestore(abstract_state)
  return ocp.args.PyTreeRestore(
    item=abstract_state,
    partial_restore=True,
    restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state),
  )


class Checkpointer:
  """Saves and restores :class:`~laplax.state.TrainState` plus the data iterator state.

  Args:
    directory: where step directories live (created if missing, unless
      ``read_only``).
    max_to_keep: how many recent checkpoints to keep.
    verify: write a checksum manifest into each saved step and check it
      before a step is restored (``config.checkpoint_verify``;
      :mod:`laplax.workdir.integrity`).
    read_only: a reader (``eval.py``, ``laplax.load``): creates, saves and
      deletes nothing, and may run while ``train.py`` writes the directory.
  """

  def __init__(
    self, directory: str, max_to_keep: int | None = 3, verify: bool = True, read_only: bool = False
  ):
    self.directory = (
      store.absolute(directory) if store.is_remote(directory) else os.path.abspath(directory)
    )
    self.verify = verify
    self.read_only = read_only
    self._saving = None  # the step of the newest save started
    self._sizes: dict[int, int] = {}
    self._space_warned = False
    self._failure = None  # the SaveError of a failed save, raised again by wait()
    if not read_only:  # failed writes are raised in one line instead
      for name in ("absl", "asyncio"):
        logging.getLogger(name).addFilter(_DROP_ORBAX_ERRORS)
      if not getattr(sys.unraisablehook, "laplax_quiet", False):
        sys.unraisablehook = _quiet_unraisablehook(sys.unraisablehook)
    callback = self._write_manifest if verify and not read_only else None
    options = ocp.CheckpointManagerOptions(
      max_to_keep=None if read_only else max_to_keep,
      create=not read_only,
      read_only=read_only,
      lightweight_initialize=read_only,
      async_options=ocp.AsyncOptions(post_finalization_callback=callback),
    )
    with _orbax_errors_silenced():
      self.manager = _retry_vanished(
        lambda: ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))
      )

  def all_steps(self) -> list[int]:
    """Steps of the complete checkpoints, ascending."""
    with _orbax_errors_silenced():
      return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest complete step, or ``None``."""
    with _orbax_errors_silenced():
      return self.manager.latest_step()

  def step_dir(self, step: int) -> str:
    """The directory of the complete checkpoint of ``step``."""
    return os.path.join(self.directory, str(step))

  def incomplete_steps(self) -> dict[int, str]:
    """Steps whose write was interrupted (left in orbax's temporary
    directories; gs://: step directories without ``commit_success.txt``), as
    ``{step: path}``; they are never restored."""
    if store.is_remote(self.directory):
      return {
        int(n): self.step_dir(int(n))
        for n in store.listdir(self.directory)
        if n.isdigit() and not store.exists(store.join(self.step_dir(int(n)), _COMMITTED))
      }
    if not os.path.isdir(self.directory):
      return {}
    found = {}
    for name in os.listdir(self.directory):
      m = _INCOMPLETE.match(name)
      if m:
        found[int(m.group(1))] = os.path.join(self.directory, name)
    return found

  def warn_incomplete(self, delete: bool) -> None:
    """Warns about each :meth:`incomplete_steps` entry; ``delete`` removes
    them (process 0), as the trainer does before it writes again."""
    for bad, path in sorted(self.incomplete_steps().items()):
      logging.warning(
        "checkpoint step %d in %s is incomplete (its write was interrupted); it is ignored",
        bad,
        self.directory,
      )
      if delete and jax.process_index() == 0:
        if store.is_remote(path):
          store.rmtree(path)
        else:
          shutil.rmtree(path, ignore_errors=True)

  def _write_manifest(self) -> None:
    """orbax's post-finalization callback (process 0, in its save thread):
    the manifest of the step being saved, written into its temporary
    directory just before orbax renames it."""
    step = self._saving
    integrity.write_manifest(self.incomplete_steps().get(step) or self.step_dir(step))

  def _size(self, step: int) -> int:
    if step not in self._sizes:
      self._sizes[step] = saving.tree_size(self.step_dir(step))
    return self._sizes[step]

  def _check_space(self) -> None:
    """Warns once when the free space is below the size of the newest checkpoint."""
    latest = self.latest_step()
    if self._space_warned or latest is None or jax.process_index() != 0:
      return
    need, free = self._size(latest), saving.free_bytes(self.directory)
    if free is not None and free < need:
      self._space_warned = True
      logging.warning(
        "only %s free in %s, and the last checkpoint (step %d) took %s: "
        "the next save may fail; free some space",
        saving.megabytes(free),
        self.directory,
        latest,
        saving.megabytes(need),
      )

  def complete_steps(self) -> list[int]:
    """The complete steps as the directory lists them now (not orbax's cache)."""
    if store.is_remote(self.directory):
      bad = self.incomplete_steps()
      return sorted(
        int(n) for n in store.listdir(self.directory) if n.isdigit() and int(n) not in bad
      )
    if not os.path.isdir(self.directory):
      return []
    return sorted(
      int(n)
      for n in os.listdir(self.directory)
      if n.isdigit() and os.path.isdir(self.step_dir(int(n)))
    )

  def last_complete(self) -> int | None:
    """The newest complete step on disk now, or ``None``."""
    steps = self.complete_steps()
    return steps[-1] if steps else None

  @contextlib.contextmanager
  def _failing(self, step: int | None) -> Iterator[None]:
    """An OS error raised inside (by orbax's save of ``step``) becomes a
    :class:`~laplax.workdir.saving.SaveError`, after the manager is closed and
    the incomplete step removed; other exceptions pass."""
    try:
      yield
    except Exception as e:
      err = saving.os_error(e)
      if err is None or step is None:
        raise
      with _orbax_errors_silenced(), contextlib.suppress(Exception):
        self.manager.close()
      self._drain()
      if jax.process_index() == 0:
        # Every writer of the failed save has ended (_drain): what is removed
        # now stays removed, however slow the machine.
        for path in self.incomplete_steps().values():
          _remove_tree(path)
      last = self.last_complete()
      self._failure = saving.SaveError(
        saving.message(
          err[1],
          f"checkpoint step {step}",
          self.directory,
          last,
          self._size(last) if last is not None else None,
        )
      )
      raise self._failure from None

  def _drain(self) -> None:
    """Waits for every write of the last save to end, failed or not.

    orbax's background thread stops waiting at the first failed commit
    future (a full disk) while the others (the other items, the directory
    creation) still write into ``N.orbax-checkpoint-tmp``; a clean-up done
    before they end can be undone by them (the space freed lets a pending
    write succeed). The futures are those of orbax's async manager
    (``AsyncCheckpointer._async_manager._commit_futures``, orbax 0.12).
    """
    checkpointer = getattr(self.manager, "_checkpointer", None)
    manager = getattr(checkpointer, "_async_manager", None)
    for f in list(getattr(manager, "_commit_futures", None) or ()):
      with contextlib.suppress(BaseException):
        f.result()

  def save(self, state: TrainState, data_state: dict | None) -> bool:
    """Starts an asynchronous save of ``state`` at ``state.step``, after the
    previous save has finished.

    Returns whether a save was started (orbax skips a step already saved).

    Raises:
      SaveError: this or the previous save failed on an OS error (a full disk).
    """
    step = int(jax.device_get(state.step))
    self.wait()
    if step in self.manager.all_steps():
      return False
    self._check_space()
    self._saving = step
    with self._failing(step):
      return self.manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {})
        ),
      )

  def _verified(self, step: int) -> bool | None:
    """Checks the manifest of ``step`` (``None`` without ``verify``; ``False``:
    the step has none).

    Raises:
      ChecksumError: a file of the step does not match.
    """
    return integrity.verify(self.step_dir(step)) if self.verify else None

  def _vanished(self, step: int) -> bool:
    """Whether ``step``'s directory is gone; a reader waits up to 0.5 s for
    a deletion in progress (orbax removes a step file by file)."""
    for _ in range(10 if self.read_only else 1):
      if not store.isdir(self.step_dir(step)):
        return True
      if self.read_only:
        time.sleep(0.05)
    return False

  def _next_steps(self, tried: set) -> list[int]:
    """The steps not yet tried, newest first, as the directory holds them now
    (a running train.py saves new steps and deletes old ones)."""
    with _orbax_errors_silenced():
      _retry_vanished(self.manager.reload)
    return [s for s in self.all_steps()[::-1] if s not in tried]

  def restore(
    self,
    abstract_state: TrainState | Callable[[str], Any],
    step: int | None = None,
    with_data: bool = True,
    discard_unreadable: bool = False,
    partial: bool = False,
  ):
    """Restores ``(state, data_state)`` at ``step`` (default: the newest usable).

    ``abstract_state`` gives the tree, shapes, dtypes and shardings
    (``jax.ShapeDtypeStruct`` leaves), or is a function of a step's
    ``state`` directory returning them (built per step, e.g. from the saved
    shapes, :func:`saved_shapes`; its errors make that step unreadable): a
    checkpoint saved on any mesh is restored onto these shardings, and
    leaves without one onto this process's first device (``eval.py``). With
    ``partial`` the tree is a dict naming some of :class:`TrainState`'s
    fields (``{"step", "params", "task_state"}``: ``laplax.load``) and only
    those are read (the returned state is that dict); the rest, the optimizer
    state, is not. When the newest checkpoint cannot be
    read, or (with ``verify``) a file of it does not match its checksum, it
    is skipped with a warning naming it and the previous one is used; a step
    whose write was interrupted (:meth:`incomplete_steps`) is named in a
    warning too (not by a reader: it may be a save in progress), and so is a
    restored step without a checksum manifest. A
    step deleted while it is read (by the ``train.py`` writing the
    directory) is not an error: the newest step then is used. With
    ``discard_unreadable`` (the trainer) the unreadable and incomplete newer
    steps are deleted so that the resumed run can save those steps again.

    Raises:
      CheckpointError: there is no readable checkpoint.
    """
    steps = [step] if step is not None else self.all_steps()[::-1]
    if not steps:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    unreadable, tried = [], set()
    while steps:
      s = steps.pop(0)
      tried.add(s)
      try:
        verified = self._verified(s)
        items = {
          "state": _restore_args(abstract_state, os.path.join(self.step_dir(s), "state"), partial)
        }
        if with_data:
          items["data"] = ocp.args.JsonRestore()
        with _orbax_errors_silenced():
          restored = self.manager.restore(s, args=ocp.args.Composite(**items))
      except Exception as e:
        if step is None and self._vanished(s):
          steps = self._next_steps(tried)  # deleted meanwhile by its writer
          continue
        unreadable.append(
          (s, str(e) if isinstance(e, integrity.ChecksumError) else type(e).__name__)
        )
        continue
      self._warn_restored(s, verified, unreadable, discard_unreadable)
      return restored["state"], (restored["data"] if with_data else None)
    if not unreadable:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    raise CheckpointError(
      f"no readable checkpoint in {self.directory} (steps "
      f"{', '.join(str(b) for b, _ in unreadable)} failed: {unreadable[0][1]}); "
      f"move the directory away to start again"
    )

  def _warn_restored(
    self, step: int, verified: bool | None, unreadable: list, discard: bool
  ) -> None:
    """The warnings once ``step`` is restored (else the error says it all; a
    reader does not warn of incomplete steps: they may be saves in progress)."""
    if not self.read_only:
      self.warn_incomplete(delete=discard)
    for bad, reason in unreadable:
      logging.warning(
        "checkpoint step %d in %s is unreadable (%s); using step %d",
        bad,
        self.directory,
        reason,
        step,
      )
      if discard:
        self.manager.delete(bad)
    if verified is False:
      logging.warning(
        "checkpoint step %d in %s has no checksum manifest (saved before "
        "laplax wrote one, or with checkpoint_verify=False); it is restored "
        "unverified",
        step,
        self.directory,
      )

  def restore_params(self) -> tuple[int, Any]:
    """``(step, params)`` of the newest readable checkpoint: the parameter
    tree as saved (NumPy leaves on the host), without a target tree, so the
    run that saved it may have another task or config (fine-tuning).

    Raises:
      CheckpointError: there is no readable checkpoint.
    """
    steps = self.all_steps()[::-1]
    for s in steps:
      try:
        self._verified(s)
        with _orbax_errors_silenced():
          restored = self.manager.restore(
            s, args=ocp.args.Composite(state=ocp.args.StandardRestore())
          )
      except Exception as e:
        reason = f" ({e})" if isinstance(e, integrity.ChecksumError) else ""
        logging.warning(
          "checkpoint step %d in %s is unreadable%s; trying the previous one",
          s,
          self.directory,
          reason,
        )
        continue
      return s, jax.device_get(restored["state"]["params"])
    raise CheckpointError(f"no readable checkpoint in {self.directory}")

  def wait(self) -> None:
    """Blocks until every started save is committed.

    Raises:
      SaveError: the save failed on an OS error (a full disk).
    """
    if self._failure is not None:
      raise self._failure
    with self._failing(self._saving):
      self.manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager.

    Raises:
      SaveError: the last save failed on an OS error (a full disk).
    """
    self.wait()
    with self._failing(self._saving):
      self.manager.close()
