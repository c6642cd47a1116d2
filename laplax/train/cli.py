"""Command-line plumbing shared by ``train.py`` and ``eval.py``.

Flags are parsed by absl and ``ml_collections.config_flags`` (so
``--config file.py:arg`` and ``--config.key=value`` work), but every user error
-- an unknown flag or config key, a bad value, a missing file, an invalid
config, missing data -- becomes one line on stderr and exit code 2, with no
traceback and nothing written.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from typing import Callable

from absl import flags
import ml_collections

from laplax.train.config import ConfigError

USAGE_EXIT = 2


class UsageError(ValueError):
  """A command-line problem; the message is one line with the fix."""


def quiet() -> None:
  """Silences library chatter (absl/orbax INFO logs, TF-less TFDS warnings)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  logging.getLogger().setLevel(logging.WARNING)
  for name in ("absl", "orbax", "tensorflow_datasets", "grain"):
    logging.getLogger(name).setLevel(logging.ERROR)
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  tfds.disable_progress_bar()  # stderr stays for the one-line errors
  warnings.filterwarnings("ignore", category=UserWarning)
  warnings.filterwarnings("ignore", category=DeprecationWarning)
  warnings.filterwarnings("ignore", category=FutureWarning)


def _unknown_key_message(argv: list[str], config) -> str | None:
  """Names the first ``--config.a.b=`` override whose key is not in ``config``."""
  for arg in argv:
    m = re.match(r"--config\.([\w.]+)", arg)
    if not m:
      continue
    node, parts = config, m.group(1).split(".")
    for i, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        parent = ".".join(["config"] + parts[:i])
        known = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        return (f"unknown config key {'.'.join(parts[:i + 1])!r} in {arg}; keys of "
                f"{parent}: {', '.join(known)}")
      node = node[part]
  return None


def parse_flags(argv: list[str]) -> None:
  """Parses ``argv`` into absl FLAGS.

  Raises:
    UsageError: unknown flags, unknown config keys, bad values, bad config file.
  """
  try:
    flags.FLAGS(argv)
  except flags.Error as e:
    raise UsageError(str(e).splitlines()[0]) from None
  except (AttributeError, KeyError) as e:
    config_flag = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
    msg = None
    if isinstance(config_flag, ml_collections.ConfigDict):
      msg = _unknown_key_message(argv, config_flag)
    raise UsageError(msg or f"bad --config override: {e}") from None


def load_config_flag(name: str = "config") -> ml_collections.ConfigDict:
  """The parsed ``--config`` as a ConfigDict.

  Raises:
    UsageError: the flag is missing or its file could not be loaded.
  """
  if flags.FLAGS[name].present == 0 and flags.FLAGS[name].value is None:
    raise UsageError(f"--{name} is required, e.g. --{name} configs/vit_fashion_mnist.py")
  try:
    config = flags.FLAGS[name].value
    config.keys()  # an _ErrorConfig raises here with the loading error
  except Exception as e:  # pylint: disable=broad-except
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UsageError(f"could not load --{name}: {first}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise UsageError(f"--{name} did not give a ConfigDict (get_config() must return one)")
  return config


def run(main: Callable[[], int | None], user_errors: tuple = ()) -> None:
  """Runs ``main`` and maps user errors to one stderr line and exit code 2."""
  from laplax.data.images import DataError  # pylint: disable=import-outside-toplevel
  errors = (UsageError, ConfigError, DataError) + tuple(user_errors)
  try:
    code = main()
  except errors as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(USAGE_EXIT)
  sys.exit(code or 0)
