"""What the laplax TFDS builders share."""

from __future__ import annotations

import sys

import tensorflow_datasets as tfds
from etils import epath


class OwnCodePath:
  """Mixin (before ``tfds.core.GeneratorBasedBuilder``): ``code_path`` is the module's file.

  TFDS 4.9.10's default imports ``importlib_resources``, declared only for Python < 3.9.
  """

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(sys.modules[cls.__module__].__file__)
