"""TensorBoard events of an object-store workdir: written locally, uploaded at each flush.

tensorboardX writes ``gs://`` only through google-cloud-storage's own client
(outside the workdir's one path layer, :mod:`laplax.store`) and
appends by re-uploading anyway. So a ``gs://`` workdir's events are written by
tensorboardX into a local staging folder (``tempfile``) and every file whose
size changed is uploaded whole to ``WORKDIR/tensorboard/`` after each flush:
one upload per file, which readers (TensorBoard) see whole or not at all. A
run killed between flushes loses only the events since the last flush, as
locally. Event files are small (scalars, text, a few PNGs), so the repeated
uploads cost little.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from laplax import store


class Uploader:
  """Mirrors the local folder :attr:`local` into the object-store folder ``remote``."""

  def __init__(self, remote: str):
    self.remote = remote
    self.local = tempfile.mkdtemp(prefix="laplax-tensorboard-")
    self._sizes: dict[str, int] = {}

  def sync(self) -> None:
    """Uploads every file of :attr:`local` that is new or changed since the last sync.

    Raises:
      StoreError: an upload failed.
    """
    for root, _, files in os.walk(self.local):
      for f in files:
        full = os.path.join(root, f)
        rel = os.path.relpath(full, self.local).replace(os.sep, "/")
        size = os.path.getsize(full)
        if self._sizes.get(rel) != size:
          store.upload(full, store.join(self.remote, rel))
          self._sizes[rel] = size

  def cleanup(self) -> None:
    """Removes the local staging folder."""
    shutil.rmtree(self.local, ignore_errors=True)
