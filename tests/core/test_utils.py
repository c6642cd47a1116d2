"""laplax.utils.json_lines: the one JSON-lines reader (chat sources, HumanEval, choices)."""

import gzip

import pytest

from laplax import utils


class _Error(ValueError):
  pass


def test_json_lines_rows_and_one_line_errors(tmp_path):
  plain = tmp_path / "a.jsonl"
  plain.write_text('{"x": 1}\n\n  \n[2, 3]\n"s"\n')
  packed = tmp_path / "a.jsonl.gz"
  packed.write_bytes(gzip.compress(plain.read_bytes()))
  for path in (str(plain), str(packed)):
    rows = list(utils.json_lines(path, _Error))
    assert rows == [(f"{path}:1", {"x": 1}), (f"{path}:4", [2, 3]), (f"{path}:5", "s")]
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"x": 1}\n{"x": \n')
  with pytest.raises(_Error) as e:
    list(utils.json_lines(str(bad), _Error))
  assert str(e.value).startswith(f"{bad}:2: not valid JSON (Expecting value)")
  assert "\n" not in str(e.value)
  (tmp_path / "latin.jsonl").write_bytes(b'{"x": "\xe9"}\n')
  for name, reason in (("missing.jsonl", "No such file"), ("latin.jsonl", "utf-8")):
    with pytest.raises(_Error, match=rf"^cannot read {tmp_path / name} \(.*{reason}"):
      list(utils.json_lines(str(tmp_path / name), _Error))
