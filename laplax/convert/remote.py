"""A converted laplax workdir written into an object store (``gs://BUCKET/PATH``).

An object store has no rename, so the local way (a temporary directory renamed
into place, :func:`laplax.convert.common.write_workdir`) cannot work there, and
orbax marks a finished checkpoint on ``gs://`` by its ``commit_success.txt``,
which only orbax writing there itself adds. The workdir is therefore written in
place, under the lock ``train.py`` takes (:class:`laplax.workdir.lock.WorkdirLock`,
a create-if-absent upload with a lease):

1. a workdir with any object under it is refused (never overwritten);
2. the lock is taken; of two starts on the same new workdir only one gets it,
   and an object written meanwhile by anyone else refuses the conversion too;
3. the step-0 checkpoint (orbax, straight to ``gs://``), the extra files and
   last ``config.json`` are written, then the lock is released.

A failure, SIGINT or SIGTERM removes everything written under the workdir;
while the lock is held, ``train.py`` on the same workdir is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections


def write_workdir(
  workdir: str, config: ml_collections.ConfigDict, state, files: Mapping[str, str], error
) -> None:
  """Writes the new ``gs://`` workdir ``workdir``: the step-0 checkpoint of
  ``state`` (a :class:`laplax.state.TrainState`), ``files`` (``{name: local
  path}``) and ``config.json`` (``config``), in that order. ``error`` is the
  converters' error class (``laplax.convert.common.ConvertError``, passed in:
  common imports this module).

  Raises:
    ConvertError: ``workdir`` has objects under it, or another process took
      its lock or wrote there meanwhile (nothing of theirs is touched).
    StoreError: a failed request (no bucket, no permission); what was written is removed.
  """
  from laplax import signals, store
  from laplax.workdir import checkpoint as ckpt_lib
  from laplax.workdir import lock
  from laplax.workdir.files import CHECKPOINT_DIR, write_config

  exists = f"--workdir {workdir} exists; give a new directory (nothing was written)"
  store.check_bucket(workdir)
  if store.exists(workdir):
    raise error(exists)
  try:
    held = lock.WorkdirLock(workdir).__enter__()
  except lock.LockError:
    raise error(exists) from None
  try:
    if set(store.files_under(workdir)) != {lock.LOCK_FILE}:
      raise error(exists)
    undo = signals.at_exit(lambda: store.rmtree(workdir))
    try:
      checkpointer = ckpt_lib.Checkpointer(store.join(workdir, CHECKPOINT_DIR))
      checkpointer.save(state, None)
      checkpointer.close()
      for name, path in files.items():
        store.upload(path, store.join(workdir, name))
      write_config(config, workdir)
    except BaseException:
      store.rmtree(workdir)
      raise
    finally:
      undo()
  finally:
    held.release()


def write_output(out: str, convert, error):
  """Runs ``convert(local_dir)`` (a ``--to`` converter writing a new local
  directory) and uploads what it wrote to the ``gs://`` folder ``out``.

  An object store has no rename, so the output is made in a local temporary
  directory first and uploaded file by file; a failure, SIGINT or SIGTERM
  during the upload removes what was uploaded. Returns ``convert``'s result.

  Raises:
    ConvertError (``error``): ``out`` has objects under it (nothing is written).
    StoreError: a failed request (no bucket, no permission); what was uploaded is removed.
  """
  import os
  import shutil
  import tempfile

  from laplax import signals, store

  store.check_bucket(out)
  if store.exists(out):
    raise error(f"--out {out} exists; give a new folder (nothing was written)")
  scratch = tempfile.mkdtemp(prefix="laplax-convert-")
  try:
    local = os.path.join(scratch, store.name(out))
    result = convert(local)
    undo = signals.at_exit(lambda: store.rmtree(out))
    try:
      for name in sorted(store.files_under(local)):
        store.upload(os.path.join(local, name), store.join(out, name))
    except BaseException:
      store.rmtree(out)
      raise
    finally:
      undo()
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return result
