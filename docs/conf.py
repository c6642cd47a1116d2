"""Sphinx configuration of laplax's documentation site.

Build (the README's docs command; ``tests/repo/test_docs.py`` runs it in CI):

    .venv/bin/python -m sphinx -W -b html docs docs/_build/html

Pages are MyST Markdown; the demo notebook (``notebooks/laplax_demo.ipynb``,
linked as ``docs/demo.ipynb``) is rendered by myst-nb without executing it
(``tests/repo/test_notebook.py`` executes it); the API reference is generated from
the docstrings by autodoc/autosummary. With ``-W`` any warning fails the
build: a broken cross-reference or internal link, a docstring that is not
valid reStructuredText, or a public name without a docstring
(:func:`_require_docstring`).
"""

import os
import shutil
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

import laplax

# The CLIs define absl flags when imported, and two of them define --config:
# autosummary imports every module into this one process, so the train CLI
# goes first and python -m laplax.convert's entry point (laplax/convert/
# __main__.py) is left out of the reference (_templates/autosummary/module.rst).
import laplax.cli.train

project = "laplax"
author = "the laplax authors"
copyright = "2026, the laplax authors"
release = laplax.__version__

extensions = [
  "myst_nb",  # Markdown pages (myst-parser) and notebooks
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinx.ext.napoleon",  # the docstrings' Google-style Args/Returns/Raises
  "sphinx.ext.mathjax",
]
# .rst first: autosummary writes its generated pages with the first suffix.
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
templates_path = ["_templates"]
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links
myst_fence_as_directive = ["math"]  # ```math blocks (as GitHub renders them) are equations
nb_execution_mode = "off"  # CI executes the notebook in tests/repo/test_notebook.py

autosummary_generate = True
# autosummary writes a page per module but never deletes one: pages of modules
# another checkout had (a branch switched away from) would fail the -W build.
# They are generated files (.gitignore), so each build starts without them.
shutil.rmtree(
  os.path.join(os.path.dirname(os.path.abspath(__file__)), "_autosummary"), ignore_errors=True
)
autosummary_imported_members = False
# Members defined in each module (not those it imports or re-exports: each
# object is documented once, on its own module's page); constants too.
autodoc_default_options = {"members": True, "undoc-members": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings state shapes and dtypes
autodoc_mock_imports = ["torch", "timm", "transformers", "lm_eval"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" as fields: dataclass fields are documented once

# Broken references to laplax's own objects fail the build; references to
# other libraries' objects (jax.Array, flax.linen.Module, ...) are not checked
# (no intersphinx: the build runs offline).
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!laplax\b).*")]

html_theme = "sphinx_book_theme"
html_title = "laplax"
html_theme_options = {"show_toc_level": 2, "navigation_with_keys": False}
html_static_path = []


def _require_docstring(app, what, name, obj, options, lines):
  """Warns (an error under ``-W``) when a public documented object has no docstring."""
  short = name.rsplit(".", 1)[-1]
  if not getattr(obj, "__module__", "laplax").startswith("laplax"):
    return  # a value from another library (a Flax initializer as a field's default)
  if not lines and not short.startswith("_") and what in ("module", "class", "function", "method"):
    from sphinx.util import logging

    logging.getLogger(__name__).warning("public %s %s has no docstring", what, name)


def setup(app):
  """Registers :func:`_require_docstring`."""
  app.connect("autodoc-process-docstring", _require_docstring)
