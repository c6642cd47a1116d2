"""Workdir paths on the local disk or in Google Cloud Storage (``gs://BUCKET/PATH``).

Every small file of a workdir (``config.json``, metrics, ``eval.json``,
TensorBoard events, figures, the lock) is read and written through this one
layer; checkpoints go through orbax and tensorstore, which read ``gs://``
themselves. A local path goes through :mod:`os` exactly as before; a ``gs://``
path goes through `gcsfs <https://gcsfs.readthedocs.io>`_ (fsspec's GCS file
system: the GCS JSON API with its retries of 408, 429 and 5xx answers), never
through the local file system, so no local folder named ``gs:`` is made.

Object stores have no rename and no append: :func:`write` of a ``gs://`` object
is one upload (readers see the old object or the new one), :func:`create`
uploads only if the object does not exist (``ifGenerationMatch=0``) and
:func:`replace` only if it is still the given generation. The emulators of the
tests are reached with ``STORAGE_EMULATOR_HOST`` (gcsfs) and
``TENSORSTORE_GCS_HTTP_URL`` (tensorstore); docs/workdir.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
from collections.abc import Iterator

from laplax import utils
from laplax.errors import UserError

GS = "gs://"


class StoreError(UserError, OSError):
  """A request to the object store failed for good (no bucket, no permission); one line."""


def is_remote(path) -> bool:
  """Whether ``path`` is an object-store URL (``gs://...``)."""
  return str(path).startswith(GS)


def check_scheme(path: str, flag: str = "--workdir") -> None:
  """Refuses a URL of a store laplax cannot write (``s3://``, ``http://``, ...).

  Raises:
    StoreError: ``path`` has a scheme other than ``gs://``.
  """
  scheme, sep, _ = str(path).partition("://")
  if sep and scheme != "gs" and "/" not in scheme:
    raise StoreError(
      f"{flag} {path}: {scheme}:// is not supported; give a local path or gs://BUCKET/PATH"
    )


def local_only(path: str, flag: str, command: str) -> str | None:
  """Why ``command`` cannot take the URL ``path`` (one line with the fix), or ``None``
  for a local path: for the commands that read and write workdirs on local disk only."""
  if "://" not in str(path):
    return None
  return (
    f"{flag} {path}: {command} works on local folders; copy the run "
    f"(gcloud storage cp -r {str(path).rstrip('/')} DIR) and give DIR"
  )


def absolute(path: str) -> str:
  """``path`` made absolute (local, ``~`` expanded) or as given without a trailing ``/`` (gs://)."""
  if is_remote(path):
    return str(path).rstrip("/")
  return os.path.abspath(os.path.expanduser(path))


def join(path: str, *names: str) -> str:
  """``path/name/...``, for local paths and URLs alike."""
  return os.path.join(str(path), *names)


def name(path: str) -> str:
  """The last component of ``path`` (``runs/vit`` of ``gs://b/runs/vit/`` is ``vit``)."""
  return os.path.basename(str(path).rstrip("/"))


def bucket(path: str) -> str:
  """The bucket of a ``gs://BUCKET/...`` URL."""
  return str(path)[len(GS) :].split("/", 1)[0]


def _gcs():
  """The gcsfs file system (listings never cached), one per ``STORAGE_EMULATOR_HOST``."""
  # gcsfs >= 2026 first probes a bucket over gRPC for zonal buckets (60 s
  # against an emulator); laplax's buckets are standard ones.
  os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
  return _gcs_at(os.environ.get("STORAGE_EMULATOR_HOST"))


@functools.cache
def _gcs_at(endpoint: str | None):
  try:
    from gcsfs.core import GCSFileSystem  # the standard one, whatever the switch said at import
  except ImportError:
    raise StoreError("gs:// paths need the gcsfs package; pip install gcsfs") from None
  gcsfs_log = logging.getLogger("gcsfs")  # laplax words a failed request itself, in one line
  if gcsfs_log.level == logging.NOTSET:  # unless the user set gcsfs's level
    gcsfs_log.setLevel(logging.CRITICAL)
  token = "anon" if endpoint else None
  return GCSFileSystem(use_listings_cache=False, skip_instance_cache=True, token=token)


def _key(path: str) -> str:
  return str(path)[len(GS) :].rstrip("/")


@contextlib.contextmanager
def errors(path: str) -> Iterator[None]:
  """A failed request on ``path`` (no bucket, 403, retries spent) as one-line :class:`StoreError`.

  ``FileNotFoundError`` of an object and ``FileExistsError`` (a failed
  precondition) pass unchanged when the bucket exists.
  """
  try:
    yield
  except (StoreError, FileExistsError):
    raise
  except FileNotFoundError:
    if not bucket_exists(path):
      raise _no_bucket(path) from None
    raise
  except Exception as e:
    text = utils.first_line(e)
    if _unreachable(e):
      host = os.environ.get("STORAGE_EMULATOR_HOST") or "storage.googleapis.com"
      raise StoreError(
        f"cannot reach the object store {host} for {path} ({type(e).__name__}: {text}); "
        f"check this machine's network and DNS (or STORAGE_EMULATOR_HOST for an emulator), "
        f"then run the same command again"
      ) from None
    if "Forbidden" in str(e) or "403" in text:
      raise StoreError(
        f"permission denied on {path} (HTTP 403); give this machine's account write "
        f"access to gs://{bucket(path)} (gcloud auth application-default login, or "
        f"the VM's service account), then run the same command again"
      ) from None
    raise StoreError(
      f"the request on {path} failed ({type(e).__name__}: {text}); run the same command again"
    ) from None


def _unreachable(e: BaseException) -> bool:
  """Whether ``e`` is a failed connection (DNS, refused, reset) rather than an answer."""
  try:
    from aiohttp import ClientConnectionError
  except ImportError:  # gcsfs always brings aiohttp; without either nothing was reached
    return False
  return isinstance(e, ClientConnectionError | ConnectionError)


def _no_bucket(path: str) -> StoreError:
  return StoreError(
    f"bucket gs://{bucket(path)} does not exist (for {path}); create it "
    f"(gcloud storage buckets create gs://{bucket(path)}) or fix the path"
  )


def bucket_exists(path: str) -> bool:
  """Whether the bucket of ``path`` exists (a 403 raises :class:`StoreError`)."""
  try:
    _gcs().call("GET", "b/{}", bucket(path), json_out=True)
  except FileNotFoundError:
    return False
  except Exception as e:
    if "Forbidden" in str(e):
      raise StoreError(
        f"permission denied on gs://{bucket(path)} (HTTP 403); give this machine's account "
        f"access to the bucket (gcloud auth application-default login), then run again"
      ) from None
    raise
  return True


def check_bucket(path: str) -> None:
  """Checks that the bucket of a ``gs://`` ``path`` exists and answers; nothing for local paths.

  Raises:
    StoreError: no such bucket, no permission, or the store does not answer.
  """
  if not is_remote(path):
    return
  with errors(path):
    if not bucket_exists(path):
      raise _no_bucket(path)


def exists(path: str) -> bool:
  """Whether ``path`` is a file or a directory (gs://: an object or a prefix)."""
  if not is_remote(path):
    return os.path.exists(path)
  with errors(path):
    return _gcs().exists(_key(path))


def isdir(path: str) -> bool:
  """Whether ``path`` is a directory (gs://: a prefix with objects under it, or the bucket)."""
  if not is_remote(path):
    return os.path.isdir(path)
  with errors(path):
    return _gcs().isdir(_key(path))


def isfile(path: str) -> bool:
  """Whether ``path`` is a file (gs://: an object)."""
  if not is_remote(path):
    return os.path.isfile(path)
  with errors(path):
    return _gcs().isfile(_key(path))


def listdir(path: str) -> list[str]:
  """The names directly under ``path`` (``[]`` if there is nothing; gs:// sorted)."""
  if not is_remote(path):
    return os.listdir(path) if os.path.isdir(path) else []
  with errors(path):
    try:
      entries = _gcs().ls(_key(path), detail=False)
    except FileNotFoundError:
      return []
  names = sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})
  return [n for n in names if n and n != name(path)] if names else []


def read_bytes(path: str) -> bytes:
  """The contents of the file ``path``.

  Raises:
    FileNotFoundError: no such file.
  """
  if not is_remote(path):
    with open(path, "rb") as f:
      return f.read()
  with errors(path):
    return _gcs().cat_file(_key(path))


def read_text(path: str) -> str:
  """The contents of the file ``path`` as UTF-8 text."""
  return read_bytes(path).decode()


def write(path: str, data: str | bytes) -> None:
  """Writes ``path`` atomically (local: a temporary file and a rename; gs://: one upload).

  Raises:
    OSError: the write failed (:class:`StoreError` for gs://).
  """
  if not is_remote(path):
    utils.atomic_write(path, data)
    return
  data = data.encode() if isinstance(data, str) else data
  with errors(path):
    _gcs().pipe_file(_key(path), data)


def create(path: str, data: str | bytes) -> int | None:
  """Uploads the object ``path`` only if none exists (``ifGenerationMatch=0``).

  Returns its generation, or ``None`` if an object was there (nothing written).
  """
  return replace(path, data, 0)


def generation(path: str) -> int | None:
  """The generation of the object ``path``, or ``None`` if there is none."""
  with errors(path):
    try:
      info = _gcs().info(_key(path))
    except FileNotFoundError:
      return None
  return int(info["generation"]) if info.get("generation") else None


def replace(path: str, data: str | bytes, if_generation: int) -> int | None:
  """Uploads the object ``path`` only if its generation is ``if_generation`` (0: absent).

  Returns the new generation, or ``None`` when the precondition failed
  (HTTP 412: another writer was first; nothing written).
  """
  data = data.encode() if isinstance(data, str) else data
  fs = _gcs()
  # One multipart upload, as gcsfs's own, with the precondition.
  meta = json.dumps({"name": _key(path).split("/", 1)[1]})
  body = (
    (
      f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
      f"Content-Type: application/octet-stream\n\n"
    ).encode()
    + data
    + b"\n--==0==--"
  )
  with errors(path):
    try:
      out = fs.call(
        "POST",
        f"{fs._location}/upload/storage/v1/b/{{}}/o",
        bucket(path),
        uploadType="multipart",
        ifGenerationMatch=str(if_generation),
        headers={"Content-Type": 'multipart/related; boundary="==0=="'},
        data=body,
        json_out=True,
      )
    except FileExistsError:  # gcsfs's name for 412 Precondition Failed
      return None
  return int(out["generation"])


def _forget(path: str) -> None:
  """Drops what etils.epath's gcsfs instance (orbax's view of gs://) has cached of
  listings, after this layer changed ``path``: orbax must not see a deleted step."""
  with contextlib.suppress(Exception):
    from etils.epath import backend

    backend.fsspec_backend._get_filesystem("gs").invalidate_cache()


def remove(path: str) -> None:
  """Removes the file ``path``; a missing one is no error."""
  if not is_remote(path):
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
    return
  with errors(path), contextlib.suppress(FileNotFoundError):
    _gcs().rm_file(_key(path))
  _forget(path)


def rmtree(path: str) -> None:
  """Removes ``path`` and everything under it; a missing one is no error."""
  if not is_remote(path):
    shutil.rmtree(path, ignore_errors=True)
    return
  with errors(path), contextlib.suppress(FileNotFoundError):
    _gcs().rm(_key(path), recursive=True)
  _forget(path)


def files_under(path: str) -> dict[str, int]:
  """``{relative path: size}`` of every file under ``path``, ``/``-separated."""
  if not is_remote(path):
    out = {}
    for root, _, files in os.walk(path):
      for f in files:
        full = os.path.join(root, f)
        out[os.path.relpath(full, path).replace(os.sep, "/")] = os.path.getsize(full)
    return out
  prefix = _key(path) + "/"
  with errors(path):
    found = _gcs().find(_key(path), detail=True)
  return {
    k[len(prefix) :]: int(v.get("size") or 0) for k, v in found.items() if k.startswith(prefix)
  }


def local_copy(path: str) -> str:
  """``path`` itself when local; a gs:// object downloaded into a new temporary
  folder under its own name (for readers that take only a local file name)."""
  if not is_remote(path):
    return path
  import tempfile

  local = os.path.join(tempfile.mkdtemp(prefix="laplax-"), name(path))
  with open(local, "wb") as f:
    f.write(read_bytes(path))
  return local


def upload(local: str, path: str) -> None:
  """Copies the local file ``local`` to ``path`` (one upload; local: an atomic copy)."""
  with open(local, "rb") as f:
    write(path, f.read())
