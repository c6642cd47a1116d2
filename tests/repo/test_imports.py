"""No import cycle in ``laplax/`` or ``bench/``, and floors that stack.

:data:`FLOORS` is the layer order of ``docs/architecture.md``: every module of
``laplax/`` belongs to the folder (or top-level module) it sits in, and a
folder imports only from folders on lower floors, never from its own floor's
other folders or from above (:func:`upward_imports`).

The import graph is read from the source (``ast``), not from ``sys.modules``:
an edge ``a -> b`` for every ``import b`` / ``from b import name`` anywhere
in module ``a`` -- at the top of the file and inside functions alike (a
function-level import that closes a cycle only moves the cycle to run
time). ``from package import name`` is an edge to ``package.name`` when that
is a module of the tree, else to ``package``; relative imports are resolved
against the importing module. ``import a.b`` is an edge to ``a.b`` (not to
every parent package), and a module importing itself (``lm_harness`` does,
to register the importable module's class under ``python -m``) is not a
cycle. Imports of modules outside the tree (JAX, the standard library) are
left out.

A cycle is a strongly connected component of more than one module (Tarjan's
algorithm); the test prints one cycle through each, with the file and line
of every import on it.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_files(root: str, packages: tuple[str, ...]) -> dict[str, str]:
  """``{dotted module name: file}`` of every ``.py`` file under
  ``root/PACKAGE`` for each of ``packages`` (``pkg/__init__.py`` is ``pkg``)."""
  modules = {}
  for package in packages:
    for folder, dirs, files in os.walk(os.path.join(root, package)):
      dirs[:] = sorted(d for d in dirs if d != "__pycache__")
      for file in sorted(files):
        if file.endswith(".py"):
          path = os.path.join(folder, file)
          parts = os.path.relpath(path, root)[:-3].split(os.sep)
          if parts[-1] == "__init__":
            parts = parts[:-1]
          modules[".".join(parts)] = path
  return modules


def _imported(node: ast.AST, module: str, is_package: bool, modules) -> list[str]:
  """The modules of ``modules`` that the import statement ``node`` in
  ``module`` imports (empty for anything else)."""
  if isinstance(node, ast.Import):
    found = []
    for alias in node.names:
      parts = alias.name.split(".")
      deepest = next(
        (".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules),
        None,
      )
      found += [deepest] if deepest else []
    return found
  if not isinstance(node, ast.ImportFrom):
    return []
  base = node.module or ""
  if node.level:
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    base = ".".join(package + ([base] if base else []))
  found = []
  for alias in node.names:
    if f"{base}.{alias.name}" in modules:
      found.append(f"{base}.{alias.name}")
    elif base in modules:
      found.append(base)
  return found


def import_graph(root: str, packages: tuple[str, ...]) -> dict[str, dict[str, int]]:
  """``{module: {imported module: line of the first such import}}`` of the
  modules under ``root/PACKAGE`` (module- and function-level imports)."""
  modules = module_files(root, packages)
  graph = {}
  for module, path in modules.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    edges = {}
    is_package = path.endswith("__init__.py")
    for node in ast.walk(tree):
      for target in _imported(node, module, is_package, modules):
        if target != module:
          edges[target] = min(edges.get(target, node.lineno), node.lineno)
    graph[module] = edges
  return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
  """The strongly connected components of ``graph`` with more than one
  module, each sorted, in sorted order (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, components = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is None:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
          component = []
          while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
              break
          if len(component) > 1:
            components.append(sorted(component))
      elif child not in index:
        index[child] = low[child] = len(index)
        stack.append(child)
        on_stack.add(child)
        work.append((child, iter(sorted(graph[child]))))
      elif child in on_stack:
        low[node] = min(low[node], index[child])
  return sorted(components)


def a_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
  """A shortest cycle through ``component[0]`` inside ``component``
  (breadth-first), as ``[a, b, ..., a]``."""
  start, members = component[0], set(component)
  parent, frontier = {start: None}, [start]
  while frontier:
    following = []
    for node in frontier:
      for child in sorted(graph[node]):
        if child == start:
          path = [node]
          while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
          return path[::-1] + [start]  # start, ..., node, start
        if child in members and child not in parent:
          parent[child] = node
          following.append(child)
    frontier = following
  raise AssertionError(f"{component} is not strongly connected")


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
  """``a (line 12) -> b (line 40) -> a``: each import on ``cycle`` with its line."""
  steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
  return " -> ".join(steps + [cycle[-1]])


def cycles(root: str, packages: tuple[str, ...]) -> list[str]:
  """One described cycle per strongly connected component (empty: no cycle),
  followed by the component's other modules when it has more than the cycle."""
  graph = import_graph(root, packages)
  found = []
  for component in strongly_connected(graph):
    cycle = a_cycle(graph, component)
    rest = [m for m in component if m not in cycle]
    found.append(
      describe(graph, cycle) + (f" (and cycles through {', '.join(rest)})" if rest else "")
    )
  return found


def test_laplax_and_bench_have_no_import_cycle():
  found = cycles(ROOT, ("laplax", "bench"))
  assert not found, "import cycles (module-level and function-level imports):\n" + "\n".join(found)


def _write(root, files: dict[str, str]) -> None:
  for name, text in files.items():
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)


def test_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
  """``pkg.a -> pkg.sub.b`` (``from pkg.sub import b``: a submodule) and
  ``pkg.sub.b -> pkg.a`` inside a function (relative) make one cycle;
  ``pkg.c`` imports a name of ``pkg.sub`` (its ``__init__``), which imports
  nothing back, and ``pkg.a`` imports itself: neither is a cycle."""
  _write(
    tmp_path,
    {
      "pkg/__init__.py": "",
      "pkg/a.py": "import os\nfrom pkg.sub import b\nfrom pkg import a\n",
      "pkg/sub/__init__.py": "VALUE = 1\n",
      "pkg/sub/b.py": "def f():\n  from .. import a\n  return a\n",
      "pkg/c.py": "from pkg.sub import VALUE\nimport pkg.a\n",
    },
  )
  graph = import_graph(str(tmp_path), ("pkg",))
  assert graph == {
    "pkg": {},
    "pkg.a": {"pkg.sub.b": 2},
    "pkg.sub": {},
    "pkg.sub.b": {"pkg.a": 2},
    "pkg.c": {"pkg.sub": 1, "pkg.a": 2},
  }
  assert strongly_connected(graph) == [["pkg.a", "pkg.sub.b"]]
  assert cycles(str(tmp_path), ("pkg",)) == ["pkg.a (line 2) -> pkg.sub.b (line 2) -> pkg.a"]


def test_checker_finds_a_three_module_cycle_and_each_component_once(tmp_path):
  _write(
    tmp_path,
    {
      "p/__init__.py": "",
      "p/x.py": "from p import y\n",
      "p/y.py": "import p.z\n",
      "p/z.py": "def g():\n  import p.x\n",
      "p/u.py": "from p import v\n",
      "p/v.py": "from p.u import something\n",
      "p/w.py": "from p import x, u\n",
      "p/t.py": "import p.y\n",
      "p/s.py": "import p.t\nimport p.x\n",
    },
  )
  assert cycles(str(tmp_path), ("p",)) == [
    "p.u (line 1) -> p.v (line 1) -> p.u",
    "p.x (line 1) -> p.y (line 1) -> p.z (line 2) -> p.x",
  ]
  # p.z also imports p.s, which imports p.t (-> p.y) and p.x: one component of
  # five, a shortest cycle through its first module printed, the rest named.
  _write(tmp_path, {"p/z.py": "def g():\n  import p.x\n  import p.s\n"})
  assert cycles(str(tmp_path), ("p",)) == [
    "p.s (line 1) -> p.t (line 1) -> p.y (line 1) -> p.z (line 3) -> p.s (and cycles through p.x)",
    "p.u (line 1) -> p.v (line 1) -> p.u",
  ]


#: The floors of ``laplax/``, lowest first (``docs/architecture.md``); the
#: names are first-level folders or modules of the package.
FLOORS = (
  ("errors", "utils", "spectral", "rotary", "projects"),
  ("store", "sandbox"),
  ("signals", "records"),
  ("sharding",),
  ("kernels",),
  ("attention",),
  ("models",),
  ("data", "analysis", "optim"),
  ("config",),
  ("tasks",),
  ("state",),
  ("workdir",),
  ("evaluators",),
  ("train",),
  ("loading",),
  ("proj",),
  ("cli", "chat"),
  ("convert", "sweep", "plan"),
)


def floor_of(module: str, floors=FLOORS) -> tuple[str, int] | None:
  """``(folder, floor)`` of a module ``pkg.folder...``; ``None`` for the
  package itself (``laplax/__init__.py``, which imports lazily)."""
  parts = module.split(".")
  if len(parts) < 2:
    return None
  for level, names in enumerate(floors):
    if parts[1] in names:
      return parts[1], level
  raise AssertionError(
    f"{module}: folder {parts[1]!r} is on no floor; add it to FLOORS and to docs/architecture.md"
  )


def upward_imports(root: str, package: str, floors=FLOORS) -> list[str]:
  """``"a (floor i) imports b (floor j), file:line"`` for every import from a
  module of one folder of ``package`` to another folder on the same floor or a
  higher one (module- and function-level imports alike)."""
  graph = import_graph(root, (package,))
  files = module_files(root, (package,))
  found = []
  for module, edges in sorted(graph.items()):
    here = floor_of(module, floors)
    for target, line in sorted(edges.items()):
      there = floor_of(target, floors)
      if here is None or there is None or here[0] == there[0]:
        continue
      if there[1] >= here[1]:
        found.append(
          f"{module} (floor {here[1]}, {here[0]}) imports {target} "
          f"(floor {there[1]}, {there[0]}): {os.path.relpath(files[module], root)}"
          f":{line}"
        )
  return found


def test_laplax_folders_import_only_from_lower_floors():
  found = upward_imports(ROOT, "laplax")
  assert not found, "imports that do not run downward:\n" + "\n".join(found)


def test_floor_checker_finds_an_upward_and_a_sideways_import(tmp_path):
  _write(
    tmp_path,
    {
      "pkg/__init__.py": "",
      "pkg/low/__init__.py": "",
      "pkg/low/a.py": "def f():\n  from pkg.high import b\n  return b\n",
      "pkg/side.py": "import pkg.peer\n",
      "pkg/peer.py": "",
      "pkg/high/__init__.py": "",
      "pkg/high/b.py": "from pkg.low import a\n",
    },
  )
  floors = (("low",), ("side", "peer"), ("high",))
  found = upward_imports(str(tmp_path), "pkg", floors)
  assert len(found) == 2, found
  assert found[0].startswith("pkg.low.a (floor 0, low) imports pkg.high.b (floor 2, high)")
  assert "pkg/low/a.py:2" in found[0]
  assert found[1].startswith("pkg.side (floor 1, side) imports pkg.peer (floor 1, peer)")


#: The library's core: every folder below the projects but the sandbox. None of
#: them imports a project (``laplax.proj``, found by :mod:`laplax.projects`
#: instead) or the sandbox (``laplax.sandbox``, which only a project's
#: evaluators run), not even inside a function.
CORE = tuple(
  name for names in FLOORS[: FLOORS.index(("proj",))] for name in names if name != "sandbox"
)
OUTSIDE_CORE = ("proj", "sandbox")


def core_imports(root: str, package: str, core=CORE, outside=OUTSIDE_CORE) -> list[str]:
  """``"a imports b, file:line"`` for every import from a module of a ``core``
  folder of ``package`` to a module of an ``outside`` folder."""
  graph = import_graph(root, (package,))
  files = module_files(root, (package,))
  found = []
  for module, edges in sorted(graph.items()):
    if module.split(".")[1:2] and module.split(".")[1] in core:
      for target, line in sorted(edges.items()):
        if target.split(".")[1:2] and target.split(".")[1] in outside:
          found.append(f"{module} imports {target}: {os.path.relpath(files[module], root)}:{line}")
  return found


def test_core_imports_no_project_and_no_sandbox():
  assert "proj" not in CORE and "sandbox" not in CORE and "evaluators" in CORE
  found = core_imports(ROOT, "laplax")
  assert not found, "the core imports a project or the sandbox:\n" + "\n".join(found)


def test_core_checker_finds_a_function_level_import_of_a_project(tmp_path):
  _write(
    tmp_path,
    {
      "pkg/__init__.py": "",
      "pkg/low/__init__.py": "",
      "pkg/low/a.py": "def f():\n  from pkg.proj.x import b\n  return b\n",
      "pkg/low/c.py": "from pkg import sandbox\n",
      "pkg/sandbox/__init__.py": "",
      "pkg/proj/__init__.py": "",
      "pkg/proj/x/__init__.py": "",
      "pkg/proj/x/b.py": "from pkg.low import a\nfrom pkg import sandbox\n",
    },
  )
  found = core_imports(str(tmp_path), "pkg", core=("low",))
  assert found == [
    "pkg.low.a imports pkg.proj.x.b: pkg/low/a.py:2",
    "pkg.low.c imports pkg.sandbox: pkg/low/c.py:1",
  ]
