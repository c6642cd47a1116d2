"""docs/methods.md against the code, so that the document cannot drift from it.

Every config key the document names in backticks (``model.spectral.mode``,
``optim.optimizer``, ``--config.model.laplacian_mix=learned``, ...) must be a
key of the default config of at least one ``configs/*.py``; every ``key=value``
it shows must be accepted by the model spec (model keys) or the config check
(the others) of such a config; every ``configs/FILE.py:args`` must build. And
no file of the repository may name a methods document other than
docs/methods.md. Config building and validation only: nothing is compiled.
"""

import ast
import copy
import functools
import importlib.util
import os
import re

import ml_collections
import pytest

from laplax import tasks
from laplax.config import validation as config_lib
from laplax.models import spec as spec_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs/methods.md")
# A backticked span whose first word ends so is a file name (``eval.py``), not a key.
FILE_SUFFIXES = (".py", ".json", ".jsonl", ".md", ".png", ".sh", ".txt")
KEY_RE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\.\*)?(?:=(\S+))?")
CONFIG_ARG_RE = re.compile(r"configs/(\w+)\.py:(\S+)")
# Directories that are not the repository's own files (see .gitignore).
SKIP_DIRS = {
  ".git",
  ".venv",
  "runs",
  "data",
  "tensorflow_datasets",
  ".whl",
  ".gl",
  "__pycache__",
  ".pytest_cache",
  ".hypothesis",
  "_build",
  "_autosummary",
}
# A reference to a methods document (any case), with the path written before it.
METHODS_DOC_RE = re.compile(r"[\w./-]*methods\.md", re.IGNORECASE)
MISSING = object()


def load_config(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """``configs/NAME.py``'s ``get_config(arg)``."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@functools.lru_cache(maxsize=1)
def default_configs() -> dict:
  """``{name: default config}`` of every ``configs/*.py``."""
  names = sorted(
    f[:-3]
    for f in os.listdir(os.path.join(ROOT, "configs"))
    if f.endswith(".py") and not f.startswith("_")
  )
  return {name: load_config(name) for name in names}


def sections(configs: dict) -> set:
  """Top-level keys that are sections (``model``, ``optim``, ``data``, ...)."""
  return {
    k for c in configs.values() for k, v in c.items() if isinstance(v, ml_collections.ConfigDict)
  }


def code_spans(text: str) -> list[str]:
  """The inline code spans of a Markdown text (fenced blocks left out)."""
  text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
  return re.findall(r"`([^`\n]+)`", text)


def parse_value(text: str):
  """A ``key=value`` value as ``--config.key=value`` reads it: a literal or a string."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def accepts(config: ml_collections.ConfigDict, key: str, value) -> bool:
  """Whether ``config`` with ``key`` set to ``value`` passes the spec / config check."""
  c = copy.deepcopy(config)
  parent, _, leaf = key.rpartition(".")
  try:
    config_lib.get(c, parent)[leaf] = value
    if key.startswith("model."):
      spec_lib.from_config(c.model)  # not validate: it refuses cuDNN without a GPU
    else:
      tasks.validate(c)
  except (TypeError, ValueError):  # ConfigError and SpecError are ValueErrors
    return False
  return True


def problems(text: str, configs: dict) -> tuple[list[str], int]:
  """The config references of ``text`` that the configs contradict, and how many
  references were checked."""
  names = sections(configs)
  bad, checked = [], 0
  for span in code_spans(text):
    s = span.strip()
    m = CONFIG_ARG_RE.fullmatch(s)
    if m:
      checked += 1
      try:
        load_config(m.group(1), m.group(2))
      except (ValueError, KeyError, FileNotFoundError) as e:
        bad.append(f"`{span}`: does not build ({e})")
      continue
    if s.split()[0].endswith(FILE_SUFFIXES):
      continue
    for prefix in ("--config.", "config."):
      s = s[len(prefix) :] if s.startswith(prefix) else s
    if s.split(".", 1)[0] not in names or "." not in s:
      continue
    checked += 1
    m = KEY_RE.fullmatch(s)
    if not m:
      bad.append(f"`{span}`: not a dotted config key")
      continue
    key, wildcard, value = m.groups()
    having = [c for c in configs.values() if config_lib.get(c, key, MISSING) is not MISSING]
    if not having:
      bad.append(f"`{span}`: no configs/*.py has the key {key}")
    elif wildcard and not any(
      isinstance(config_lib.get(c, key), ml_collections.ConfigDict) for c in having
    ):
      bad.append(f"`{span}`: {key} is not a section")
    elif value is not None and not any(accepts(c, key, parse_value(value)) for c in having):
      bad.append(f"`{span}`: no config accepts {key}={value}")
  return bad, checked


def read_doc() -> str:
  with open(DOC, encoding="utf-8") as f:
    return f.read()


def test_every_config_key_in_methods_doc_exists_and_every_value_is_accepted():
  bad, checked = problems(read_doc(), default_configs())
  assert not bad, "\n".join(bad)
  # The document names the keys of both methods and their switches; a parser
  # that found none of them would pass vacuously.
  assert checked >= 40, checked


def test_the_check_flags_a_wrong_key_a_wrong_value_and_a_bad_config_argument():
  text = (
    "`model.spectral.lam` `model.spectral.layout` `model.spectral.mode=diagonal` "
    "`model.laplacian_mix=learned` `--config.model.num_laplacian_heads=2` "
    "`model.spectral.*` `model.width.*` `configs/vit_fashion_mnist.py:recipe=deit3` "
    "`configs/vit_fashion_mnist.py:recipe=nanochat` `eval.py` `spectral.project`"
  )
  bad, checked = problems(text, default_configs())
  assert checked == 9
  assert [b.split("`")[1] for b in bad] == [
    "model.spectral.layout",
    "model.spectral.mode=diagonal",
    "model.width.*",
    "configs/vit_fashion_mnist.py:recipe=nanochat",
  ]


def repo_text_files():
  """``(relative path, text)`` of the repository's own text files."""
  for dirpath, dirnames, filenames in os.walk(ROOT):
    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
    for name in sorted(filenames):
      path = os.path.join(dirpath, name)
      if name == ".git" or os.path.getsize(path) > 4_000_000:
        continue
      with open(path, "rb") as f:
        data = f.read()
      if b"\0" in data[:8192]:  # binary (the PNGs)
        continue
      yield os.path.relpath(path, ROOT), data.decode("utf-8", errors="replace")


@pytest.mark.slow
def test_no_file_names_a_methods_document_other_than_docs_methods_md():
  refs, bad = {}, []
  for rel, text in repo_text_files():
    for m in METHODS_DOC_RE.finditer(text):
      refs.setdefault(rel, []).append(m.group())
      # Pages of the site (docs/) link it by its name there.
      if m.group() != "docs/methods.md" and not (
        rel.startswith("docs" + os.sep) and m.group() == os.path.basename(DOC)
      ):
        bad.append(f"{rel}: {m.group()}")
  assert not bad, bad
  assert os.path.isfile(DOC)
  # The document is linked from the README and from the two method modules.
  for rel in (
    "README.md",
    os.path.join("laplax", "attention.py"),
    os.path.join("laplax", "spectral.py"),
  ):
    assert rel in refs, rel
