"""Checksums of checkpoints: a manifest written with each step, checked on restore.

Orbax stores no checksums, so each step gets ``MANIFEST`` (``laplax_checksums.json``):
size and CRC-32 of every file of its items, written from orbax's
``post_finalization_callback`` so the step's rename commits it with the data.
Orbax's top-level bookkeeping files are not covered. CRC-32 (``zlib``, releases
the GIL) guards against corruption, not tampering; docs/survive.md and
``bench/checksum_cost.py`` give the reasons and costs.
"""

from __future__ import annotations

import json
import os
import zlib

from laplax import store, utils
from laplax.errors import UserError

MANIFEST = "laplax_checksums.json"
ALGORITHM = "crc32"
_CHUNK = 1 << 22  # 4 MiB reads


class ChecksumError(UserError, ValueError):
  """A file of a checkpoint does not match its manifest; the message names it."""


def file_checksum(path: str) -> tuple[int, int]:
  """``(size in bytes, CRC-32)`` of the file ``path``, read in 4 MiB chunks.

  Raises:
    OSError: the file cannot be read.
  """
  crc, size = 0, 0
  with open(path, "rb", buffering=0) as f:
    while True:
      chunk = f.read(_CHUNK)
      if not chunk:
        return size, crc
      crc = zlib.crc32(chunk, crc)
      size += len(chunk)


def _checksum(path: str) -> tuple[int, int]:
  """:func:`file_checksum` of a local file, or of an object (read whole) in gs://."""
  if not store.is_remote(path):
    return file_checksum(path)
  data = store.read_bytes(path)
  return len(data), zlib.crc32(data)


def _item_files(step_dir: str) -> list[str]:
  """Paths (relative, ``/``-separated) of the files in the item directories
  of ``step_dir``, sorted."""
  if store.is_remote(step_dir):
    return sorted(rel for rel in store.files_under(step_dir) if "/" in rel)
  out = []
  for entry in sorted(os.listdir(step_dir)):
    top = os.path.join(step_dir, entry)
    if not os.path.isdir(top):
      continue
    for root, _, files in os.walk(top):
      for name in files:
        rel = os.path.relpath(os.path.join(root, name), step_dir)
        out.append(rel.replace(os.sep, "/"))
  return sorted(out)


def write_manifest(step_dir: str) -> dict:
  """Writes ``step_dir/MANIFEST`` atomically and returns it.

  ``{"algorithm": "crc32", "files": {relative path: [size, crc32]}}``.

  Raises:
    OSError: a file cannot be read or the manifest cannot be written.
  """
  files = {rel: list(_checksum(os.path.join(step_dir, rel))) for rel in _item_files(step_dir)}
  manifest = {"algorithm": ALGORITHM, "files": files}
  text = json.dumps(manifest, separators=(",", ":"))
  if store.is_remote(step_dir):
    store.write(os.path.join(step_dir, MANIFEST), text)
  else:
    utils.atomic_write(os.path.join(step_dir, MANIFEST), text)
  return manifest


def verify(step_dir: str) -> bool:
  """Checks every file of ``step_dir``'s manifest (present, size, CRC-32).

  ``False`` without a manifest (``checkpoint_verify=False`` or none written), ``True``
  when every file matches.

  Raises:
    ChecksumError: a file missing or different, or an unreadable manifest (named).
  """
  path = os.path.join(step_dir, MANIFEST)
  try:
    manifest = json.loads(store.read_bytes(path))
    files = manifest["files"]
    if manifest.get("algorithm") != ALGORITHM or not isinstance(files, dict):
      raise ValueError(manifest.get("algorithm"))
  except FileNotFoundError:
    return False
  except (OSError, ValueError, KeyError, TypeError):
    raise ChecksumError(f"its checksum manifest {MANIFEST} is unreadable") from None
  for rel, (size, crc) in sorted(files.items()):
    full = os.path.join(step_dir, rel)
    try:
      got_size, got_crc = _checksum(full)
    except OSError as e:
      raise ChecksumError(f"{rel} cannot be read ({e.strerror})") from None
    if got_size != size:
      raise ChecksumError(f"checksum mismatch: {rel} has {got_size} bytes, {size} were saved")
    if got_crc != crc:
      raise ChecksumError(f"checksum mismatch in {rel}")
  return True
