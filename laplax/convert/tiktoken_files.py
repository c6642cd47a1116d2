"""nanochat's tokenizer files, read without running them: ``tokenizer.pkl``
(a pickled ``tiktoken.Encoding``) and laplax's JSON copy of it.

nanochat saves its tokenizer with ``pickle.dump(enc)`` (nanochat/tokenizer.py,
``RustBPETokenizer.save``); tiktoken's ``Encoding.__getstate__`` makes that
the class ``tiktoken.core.Encoding``, ``__new__`` and a state dict ``{"name",
"pat_str", "mergeable_ranks": {bytes: rank}, "special_tokens": {str: id}}``,
the arguments of ``tiktoken.Encoding``. A pickle can name any callable, so
:func:`read_tokenizer_pkl` uses an unpickler whose only global is that class,
mapped to an inert record (Python's "Restricting Globals" recipe): a pickle
asking for anything else is refused in one line and nothing of it runs.
:data:`TOKENIZER_FILE` is the JSON form laplax keeps in a workdir
(:func:`write_tokenizer_json`), and :func:`tokenizer_pickle_bytes` writes the
pickle back for nanochat without importing tiktoken.
"""

from __future__ import annotations

import base64
import json
import pickle
from typing import Any, Mapping

from laplax.convert.common import ConvertError

# The laplax workdir's copy of a nanochat tokenizer (JSON, not a pickle).
TOKENIZER_FILE = "nanochat_tokenizer.json"
PICKLE_FILE = "tokenizer.pkl"
_EXPORT_HINT = (f"save it from nanochat's environment as laplax's {TOKENIZER_FILE} (the "
                f"tiktoken.Encoding arguments, README \"nanochat's d20\") and pass that file "
                f"with --tokenizer")


class _EncodingRecord:
  """Inert stand-in for ``tiktoken.core.Encoding`` while unpickling: keeps
  the state ``Encoding.__getstate__`` wrote and runs nothing else."""

  def __init__(self, *args, **kwargs):
    raise pickle.UnpicklingError("tiktoken.core.Encoding may only be rebuilt from its state")

  def __setstate__(self, state):
    self.state = state


class _TiktokenUnpickler(pickle.Unpickler):
  """An unpickler whose only global is ``tiktoken.core.Encoding`` (as
  :class:`_EncodingRecord`); strings, bytes, ints, dicts, lists and tuples
  need no global. Persistent ids are refused by ``pickle.Unpickler`` itself."""

  def find_class(self, module, name):
    if (module, name) == ("tiktoken.core", "Encoding"):
      return _EncodingRecord
    raise pickle.UnpicklingError(f"it asks for {module}.{name}, which a tiktoken "
                                 f"Encoding is not made of")


def _check_encoding(state: Any, path: str) -> dict:
  """The ``tiktoken.Encoding`` arguments of an unpickled state, checked."""
  if isinstance(state, str):
    raise ConvertError(f"{path} names the registered tiktoken encoding {state!r} instead "
                       f"of holding its merges; {_EXPORT_HINT}")
  keys = ("name", "pat_str", "mergeable_ranks", "special_tokens")
  ok = isinstance(state, dict) and set(state) >= set(keys[1:])
  ok = ok and isinstance(state.get("name", ""), str) and isinstance(state["pat_str"], str)
  ranks, specials = (state.get("mergeable_ranks"), state.get("special_tokens")) if ok else ({}, {})
  ok = ok and isinstance(ranks, dict) and isinstance(specials, dict) and all(
      isinstance(k, bytes) and type(v) is int for k, v in ranks.items()) and all(
          isinstance(k, str) and type(v) is int for k, v in specials.items())
  if not ok:
    raise ConvertError(f"{path} is a tiktoken Encoding pickle without the usual state "
                       f"(pat_str, mergeable_ranks bytes -> int, special_tokens str -> int); "
                       f"{_EXPORT_HINT}")
  return {"name": state.get("name", "nanochat"), "pat_str": state["pat_str"],
          "mergeable_ranks": dict(ranks), "special_tokens": dict(specials)}


def read_tokenizer_pkl(path: str) -> dict:
  """The ``tiktoken.Encoding`` arguments ``{"name", "pat_str",
  "mergeable_ranks" (bytes -> rank), "special_tokens" (str -> id)}`` of
  nanochat's ``tokenizer.pkl``, read by :class:`_TiktokenUnpickler`
  (tiktoken itself is not needed).

  Raises:
    ConvertError: an unreadable file, a pickle that asks for any other global
      (nothing of it runs), or one that is not such an Encoding.
  """
  try:
    with open(path, "rb") as f:
      obj = _TiktokenUnpickler(f).load()
  except OSError as e:
    raise ConvertError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
  except Exception as e:  # pylint: disable=broad-except  # any malformed pickle
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ConvertError(f"{path} was refused, nothing in it was run ({why}); "
                       f"{_EXPORT_HINT}") from None
  if not isinstance(obj, _EncodingRecord) or not hasattr(obj, "state"):
    raise ConvertError(f"{path} holds a {type(obj).__name__}, not a tiktoken Encoding; "
                       f"{_EXPORT_HINT}")
  return _check_encoding(obj.state, path)


def write_tokenizer_json(encoding: Mapping, path: str) -> None:
  """Writes the ``tiktoken.Encoding`` arguments as JSON: ``{"name",
  "pat_str", "mergeable_ranks": {base64 of the token's bytes: rank},
  "special_tokens": {str: id}}`` (rebuild: ``tiktoken.Encoding(name,
  pat_str=..., mergeable_ranks={b64decode(k): v}, special_tokens=...)``)."""
  ranks = sorted(encoding["mergeable_ranks"].items(), key=lambda kv: kv[1])
  out = {"name": encoding["name"], "pat_str": encoding["pat_str"],
         "mergeable_ranks": {base64.b64encode(k).decode("ascii"): v for k, v in ranks},
         "special_tokens": dict(encoding["special_tokens"])}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(out, f)


def read_tokenizer_json(path: str) -> dict:
  """The inverse of :func:`write_tokenizer_json` (``mergeable_ranks`` keys bytes).

  Raises:
    ConvertError: not such a JSON file.
  """
  try:
    with open(path, encoding="utf-8") as f:
      d = json.load(f)
    d["mergeable_ranks"] = {base64.b64decode(k, validate=True): v
                            for k, v in d["mergeable_ranks"].items()}
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise ConvertError(f"cannot read {path} as a {TOKENIZER_FILE}: {type(e).__name__}") from None
  return _check_encoding(d, path)


def tokenizer_pickle_bytes(encoding: Mapping) -> bytes:
  """A pickle of ``tiktoken.Encoding(**encoding)`` as nanochat writes it
  (``pickle.dump(enc)``: the class, ``__new__``, then ``__setstate__`` with
  these arguments), made without importing tiktoken: protocol 3 opcodes
  ``GLOBAL tiktoken.core Encoding``, ``EMPTY_TUPLE``, ``NEWOBJ``, the state
  dict (bytes as ``BINBYTES``), ``BUILD``, ``STOP``."""
  state = pickle.dumps({"name": encoding["name"], "pat_str": encoding["pat_str"],
                        "mergeable_ranks": dict(encoding["mergeable_ranks"]),
                        "special_tokens": dict(encoding["special_tokens"])}, protocol=3)
  assert state[:2] == b"\x80\x03" and state[-1:] == pickle.STOP
  return (b"\x80\x03" + pickle.GLOBAL + b"tiktoken.core\nEncoding\n" + pickle.EMPTY_TUPLE
          + pickle.NEWOBJ + state[2:-1] + pickle.BUILD + pickle.STOP)
