"""A request body's JSON, parsed within bounds (the chat server's ``POST``).

Python's ``json.loads`` takes any input to its limits: 40,000 nested ``[``
end in a ``RecursionError``, an integer of more than 4,300 digits in a
``ValueError``, and ``"\\ud800"`` (a lone surrogate) is a string that no
encoder takes. :func:`parse` bounds each before it matters: the nesting
depth (a scan of the text before parsing), the digits of an integer (the
parser's ``parse_int``) and the strings (no surrogate code points), and it
refuses ``NaN`` and ``Infinity`` (not JSON). Every refusal is a
:class:`BodyError` of one short line that does not repeat the input.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 16  # nanochat's request nests 3 deep
MAX_INT_DIGITS = 32  # the largest bound checked (a seed) has 10
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyError(ValueError):
  """A body that is not JSON or breaks a bound; the message is one short line."""


def _depth(text: str) -> int:
  """The deepest nesting of ``[`` and ``{`` outside strings (stops counting past the bound)."""
  depth = deepest = 0
  for m in _BRACKET.finditer(_STRING.sub("", text)):
    depth += 1 if m.group() in "[{" else -1
    if depth > deepest:
      deepest = depth
      if deepest > MAX_DEPTH:
        break
  return deepest


def _int(digits: str) -> int:
  if len(digits.lstrip("-")) > MAX_INT_DIGITS:
    raise BodyError(f"the body has an integer of more than {MAX_INT_DIGITS} digits")
  return int(digits)


def _constant(name: str):
  raise BodyError(f"the body is not JSON ({name} is not a JSON value)")


def _check_strings(value: Any) -> None:
  if isinstance(value, str):
    if _SURROGATE.search(value):
      raise BodyError(
        "the body has a string with a lone surrogate (\\ud800-\\udfff alone); send valid Unicode"
      )
  elif isinstance(value, dict):
    for k, v in value.items():
      _check_strings(k)
      _check_strings(v)
  elif isinstance(value, list):
    for v in value:
      _check_strings(v)


def parse(raw: bytes) -> Any:
  """The JSON value of ``raw`` (UTF-8).

  Raises:
    BodyError: not UTF-8, not JSON, nested deeper than :data:`MAX_DEPTH`, an
      integer of more than :data:`MAX_INT_DIGITS` digits, or a string with a
      lone surrogate; one line without the input.
  """
  try:
    text = bytes(raw).decode("utf-8")
  except UnicodeDecodeError as e:
    raise BodyError(f"the body is not UTF-8 (byte {e.start})") from None
  if _depth(text) > MAX_DEPTH:
    raise BodyError(f"the body is nested more than {MAX_DEPTH} deep")
  try:
    value = json.loads(text, parse_int=_int, parse_constant=_constant)
  except json.JSONDecodeError as e:
    raise BodyError(f"the body is not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
  _check_strings(value)
  return value
