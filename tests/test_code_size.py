"""Size limits of the library's code: no file over 600 lines, no function over
80 lines of code (its docstring, blank lines and comment lines not counted)."""

import ast
import pathlib

LIBRARY = pathlib.Path(__file__).resolve().parent.parent / "laplax"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def code_lines(lines: list[str], node: ast.AST) -> int:
  """Lines of ``node`` that hold code: not blank, not a comment, not its docstring."""
  skip = set()
  body = getattr(node, "body", [])
  if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
      and isinstance(body[0].value.value, str)):
    skip = set(range(body[0].lineno, body[0].end_lineno + 1))
  count = 0
  for i in range(node.lineno, node.end_lineno + 1):
    text = lines[i - 1].strip()
    if i not in skip and text and not text.startswith("#"):
      count += 1
  return count


def test_code_lines_counts_code_only():
  src = 'def f(x):\n  """Doc.\n\n  More doc.\n  """\n  # a comment\n\n  y = x\n  return y\n'
  node = ast.parse(src).body[0]
  assert code_lines(src.splitlines(), node) == 3  # def, y = x, return y


def test_no_file_over_600_lines_and_no_function_over_80_lines_of_code():
  files = sorted(LIBRARY.rglob("*.py"))
  assert len(files) > 20
  too_long = []
  for path in files:
    text = path.read_text()
    lines = text.splitlines()
    name = path.relative_to(LIBRARY.parent)
    if len(lines) > MAX_FILE_LINES:
      too_long.append(f"{name}: {len(lines)} lines")
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = code_lines(lines, node)
        if n > MAX_FUNCTION_LINES:
          too_long.append(f"{name}:{node.lineno} {node.name}: {n} lines of code")
  assert not too_long, too_long
