"""Small helpers every laplax package uses (it imports nothing of laplax).

One-line error text, atomic file writes, JSON-lines files, pytree paths as
strings and dotted keys of nested dicts: each was written several times across the packages
before; this is the one copy.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any


def first_line(error: BaseException) -> str:
  """The first useful line of ``str(error)`` (stripped), or the exception's type name.

  Lines that only introduce what follows (ending with ``":"``) are skipped when
  another line exists, so that a library's "Errors found:" header does not
  hide the error itself.
  """
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  useful = [l for l in lines if not l.endswith(":")] or lines
  return useful[0] if useful else type(error).__name__


def atomic_write(path: str, data: str | bytes | Callable[[Any], None]) -> None:
  """Writes ``path`` atomically: a temporary file in the same folder, then a rename.

  Readers see the old file or the new one, never a half-written one. ``data``
  is text, bytes, or a function that writes to the open binary file object.

  Raises:
    OSError: the folder is not writable, the disk is full, ... (the temporary
      file is removed).
  """
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      if callable(data):
        data(f)
      else:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def json_lines(path: str, error_cls: type[Exception]) -> Iterator[tuple[str, Any]]:
  """``(where, row)`` for each non-blank line of the JSON-lines file ``path``
  (``.gz``: gzip-compressed), ``where`` being ``"FILE:LINE"`` (1-based) for the
  caller's own messages about the row, ``row`` the parsed JSON value (any
  type: the caller checks it).

  Raises:
    error_cls: one line, ``"FILE:LINE: not valid JSON (reason); each line must
      be one JSON object"``, or ``"cannot read FILE (reason)"`` (no such file,
      not UTF-8, a truncated gzip stream).
  """
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise error_cls(
            f"{path}:{number}: not valid JSON ({e.msg}); each line must be one JSON object"
          ) from None
        yield f"{path}:{number}", row
  except (OSError, UnicodeDecodeError, EOFError) as e:
    raise error_cls(f"cannot read {path} ({getattr(e, 'strerror', None) or e})") from None


def path_keys(path: tuple) -> tuple[str, ...]:
  """A ``jax.tree_util`` key path as strings, e.g. ``("head", "kernel")``."""
  return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def path_str(path: tuple) -> str:
  """A ``jax.tree_util`` key path joined by ``/``, e.g. ``"head/last_layer"``."""
  return "/".join(path_keys(path))


def flatten_dotted(tree: Mapping, prefix: str = "", *, keep_empty: bool = False) -> dict:
  """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (tuples become lists, as in JSON).

  ``keep_empty``: an empty mapping stays a key of its own (``{"a": {}}`` ->
  ``{"a": {}}``) instead of vanishing.
  """
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping) and (len(v) or not keep_empty):
      out.update(flatten_dotted(v, f"{prefix}{k}.", keep_empty=keep_empty))
    else:
      out[prefix + k] = list(v) if isinstance(v, tuple) else v
  return out


def config_from_file(path: str, arg: str | None = None):
  """``get_config(arg)`` of the config file at ``path`` (a ``configs/*.py``),
  imported under a name of its own.

  Raises:
    OSError: no such file; whatever the file's ``get_config`` raises.
  """
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"laplax_config_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def matmul_kernels(params) -> Iterator[tuple[str, str, int]]:
  """``(top-level name, full name "a/b/kernel", size)`` of every leaf of the
  parameter tree ``params`` with 2 or more dimensions (the weights a model
  multiplies by; arrays or ``jax.ShapeDtypeStruct``), in tree order: what the
  analytic FLOP counts (:mod:`laplax.plan.flops`) sum."""
  import jax

  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if leaf.ndim >= 2:
      yield name.split("/")[0], name, leaf.size
