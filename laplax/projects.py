"""The projects built on the library (``laplax.proj.*``), found rather than named.

A project is a package of :mod:`laplax.proj` (the nanochat reproduction,
:mod:`laplax.proj.nanochat`) that adds entries to the library's registries:
evaluators chosen by ``config.evals``, optimisers chosen by
``optim.optimizer``, language-model inputs chosen by ``data.name``. The
library never imports a project by name. A registry that needs the projects'
entries (:mod:`laplax.evaluators.registry` to list every evaluator;
:func:`laplax.optim.make_optimizer` and :mod:`laplax.data.lm_input` when a
name is not their own) calls :func:`discover` with its kind, which imports
``laplax.proj.<project>.<kind>`` of every project that has such a module; that
module registers the project's entries when imported (as Django's
``autodiscover`` imports each application's ``admin``). A project without
the module adds nothing of that kind, and a machine without the ``proj``
folder runs the library alone.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from types import ModuleType

ROOT = "laplax.proj"


def names() -> tuple[str, ...]:
  """The projects: the packages of :data:`ROOT`, sorted (empty without it)."""
  if importlib.util.find_spec(ROOT) is None:
    return ()
  root = importlib.import_module(ROOT)
  return tuple(sorted(m.name for m in pkgutil.iter_modules(root.__path__) if m.ispkg))


@functools.cache
def discover(kind: str) -> tuple[ModuleType, ...]:
  """Imports ``laplax.proj.<project>.<kind>`` of every project that has one
  (once per kind; the modules register their entries as they are imported)
  and returns them, in the order of :func:`names`."""
  found = []
  for project in names():
    name = f"{ROOT}.{project}.{kind}"
    if importlib.util.find_spec(name) is not None:
      found.append(importlib.import_module(name))
  return tuple(found)
