"""A backstop on the size of the library's code, not the size guide.

A file holds one idea and a function one step a reader can hold; that is
judged by reading (CONTRIBUTING.md), and code is never split to meet a number
(a 150-line training loop read top to bottom in sections is fine). The limits
here only catch a file or function that has clearly grown several ideas: 800
lines of code per file, 150 per function (docstrings, blank lines and comment
lines not counted, so documenting code never pushes it over)."""

import ast
import pathlib

LIBRARY = pathlib.Path(__file__).resolve().parents[2] / "laplax"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 150


def _docstring_lines(node: ast.AST) -> set[int]:
  """The line numbers of ``node``'s own docstring (none if it has none)."""
  body = getattr(node, "body", [])
  if (
    body
    and isinstance(body[0], ast.Expr)
    and isinstance(body[0].value, ast.Constant)
    and isinstance(body[0].value.value, str)
  ):
    return set(range(body[0].lineno, body[0].end_lineno + 1))
  return set()


def code_lines(lines: list[str], node: ast.AST) -> int:
  """Lines of ``node`` that hold code: not blank, not a comment, not a docstring
  (its own, or for a module those of every class and function in it)."""
  skip = _docstring_lines(node)
  if isinstance(node, ast.Module):
    for inner in ast.walk(node):
      if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        skip |= _docstring_lines(inner)
  count = 0
  first, last = (1, len(lines)) if isinstance(node, ast.Module) else (node.lineno, node.end_lineno)
  for i in range(first, last + 1):
    text = lines[i - 1].strip()
    if i not in skip and text and not text.startswith("#"):
      count += 1
  return count


def test_code_lines_counts_code_only():
  src = 'def f(x):\n  """Doc.\n\n  More doc.\n  """\n  # a comment\n\n  y = x\n  return y\n'
  node = ast.parse(src).body[0]
  assert code_lines(src.splitlines(), node) == 3  # def, y = x, return y


def test_a_module_counts_code_without_any_docstring():
  src = (
    '"""Module doc."""\n\nimport os\n\n\nclass A:\n  """Class\n  doc."""\n  x = 1\n\n'
    '  def f(self):\n    """Method doc."""\n    return os.sep  # a comment\n'
  )
  assert code_lines(src.splitlines(), ast.parse(src)) == 5  # import, class, x, def, return


def test_no_file_over_800_lines_and_no_function_over_150_lines_of_code():
  """Counted in lines of code (:func:`code_lines`)."""
  files = sorted(LIBRARY.rglob("*.py"))
  assert len(files) > 20
  too_long = []
  for path in files:
    text = path.read_text()
    lines = text.splitlines()
    name = path.relative_to(LIBRARY.parent)
    tree = ast.parse(text)
    if code_lines(lines, tree) > MAX_FILE_LINES:
      too_long.append(f"{name}: {code_lines(lines, tree)} lines of code")
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = code_lines(lines, node)
        if n > MAX_FUNCTION_LINES:
          too_long.append(f"{name}:{node.lineno} {node.name}: {n} lines of code")
  assert not too_long, too_long
