"""What the laplax TFDS builders share."""

from __future__ import annotations

import sys

import tensorflow_datasets as tfds
from etils import epath


class OwnCodePath:
  """Mixin for a TFDS builder class: its ``code_path`` is its own module's file.

  TFDS 4.9.10's default ``code_path`` imports ``importlib_resources``, which
  TFDS only declares as a dependency for Python < 3.9; naming the file
  directly avoids that import. Put it before ``tfds.core.GeneratorBasedBuilder``
  among the bases.
  """

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(sys.modules[cls.__module__].__file__)
