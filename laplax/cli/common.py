"""Command-line plumbing shared by ``train.py`` and ``eval.py``.

Flags are parsed by absl and ``ml_collections.config_flags`` (so
``--config file.py:arg`` and ``--config.key=value`` work), but every user error
-- an unknown flag or config key, a bad value, a missing file, an invalid
config, missing data -- becomes one line on stderr and exit code 2, with no
traceback and nothing written.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import signal
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import ml_collections
from absl import flags
from ml_collections.config_flags import config_flags  # its ConfigFileFlagParser

from laplax import utils
from laplax.config.validation import REPLACED_KEYS, ConfigError
from laplax.errors import UserError

USAGE_EXIT = 2


class UsageError(UserError, ValueError):
  """A command-line problem; the message is one line with the fix."""


# Python warnings known to be noise for a laplax user: (category, message
# regex, module regex). Each is silenced by name; every other warning (JAX's
# "Some donated buffers were not usable", its sharding warnings, a library
# deprecation that concerns the user's own settings) reaches stderr. Found by
# running train.py and eval.py (ViT, GPT, DINO; --analysis, --sample,
# --choices; resume, two devices, bfloat16) with `python -W default`.
NOISY_WARNINGS = (
  # ml_collections.config_flags loads the --config file with importlib's
  # deprecated loader.load_module() (config_flags.py, _load_source), at
  # every train.py start: a deprecation in ml_collections' code, not the
  # user's, that importlib's frozen bootstrap module raises.
  (DeprecationWarning, r"the load_module\(\) method is deprecated", r"importlib\._bootstrap"),
)


def silence_noisy_warnings() -> None:
  """Ignores the warnings of :data:`NOISY_WARNINGS`, and only those (the
  filters go first, so they hold under ``python -W default`` too)."""
  for category, message, module in NOISY_WARNINGS:
    warnings.filterwarnings("ignore", message=message, category=category, module=module)


def quiet() -> None:
  """Silences library chatter: absl/orbax/TFDS/grain INFO logs, TFDS's
  progress bars, and the known-noisy Python warnings
  (:func:`silence_noisy_warnings`); other warnings reach the user."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  logging.getLogger().setLevel(logging.WARNING)
  for name in ("absl", "orbax", "tensorflow_datasets", "grain"):
    logging.getLogger(name).setLevel(logging.ERROR)
  import tensorflow_datasets as tfds

  tfds.disable_progress_bar()  # stderr stays for the one-line errors
  silence_noisy_warnings()


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
        key = ".".join(parts[: i + 1])
        if key in REPLACED_KEYS:
          return f"{arg}: config.{key} was replaced by config.evals; {REPLACED_KEYS[key]}"
        return f"unknown config key {key!r} in {arg}; keys of {parent}: {', '.join(known)}"
      node = node[part]
  return None


def flag_value(argv: list[str], name: str) -> str | None:
  """The value of the last ``--NAME VALUE`` / ``--NAME=VALUE`` in ``argv``
  (absl: the last wins), read before the flags are parsed; ``None`` if absent."""
  value = None
  for i, arg in enumerate(argv):
    if arg == f"--{name}" and i + 1 < len(argv):
      value = argv[i + 1]
    elif arg.startswith(f"--{name}="):
      value = arg.split("=", 1)[1]
  return value


def _config_spec(argv: list[str]) -> str | None:
  """The value of the last ``--config`` flag in ``argv``."""
  return flag_value(argv, "config")


# ml_collections' TypeError when a value of another type overrides a field.
_BAD_TYPE = re.compile(
  r"Could not override field '(\w+)' \(reference\)\. (.*) is of original type "
  r"<class '(\w+)'> and cannot be casted to type <class '(\w+)'>"
)
# absl's message for a --config.KEY=VALUE that does not parse as the key's type.
_BAD_OVERRIDE = re.compile(r"flag --config\.([\w.]+)=")


def _override_hint(argv: list[str], message: str) -> str:
  """``; --config.KEY takes a TYPE (the config's value: V)`` for a bad
  ``--config.KEY=VALUE`` in ``message``; ``""`` when it cannot be told."""
  found, spec = _BAD_OVERRIDE.match(message), _config_spec(argv)
  if not found or spec is None:
    return ""
  try:
    value = _load_config_file(spec)
    for part in found.group(1).split("."):
      value = value[part]
  except (UsageError, KeyError, TypeError):
    return ""
  if value is None or isinstance(value, (dict, ml_collections.ConfigDict)):
    return ""
  kind = type(value).__name__
  return f"; --config.{found.group(1)} takes {_article(kind)} {kind} (the config's: {value!r})"


def _article(word: str) -> str:
  return "an" if word[:1] in "aeiou" else "a"


def _load_config_file(spec: str):
  """Loads ``FILE.py[:arg]`` the way config_flags does, or raises UsageError."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise UsageError(
      f"config file {path} does not exist; e.g. --config configs/vit_fashion_mnist.py"
    )
  try:
    module_spec = importlib.util.spec_from_file_location("laplax_user_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
  except Exception as e:
    typed = _BAD_TYPE.search(str(e)) if isinstance(e, TypeError) else None
    if typed:  # ml_collections' message for a value of the wrong type
      field, value, given, wanted = typed.groups()
      raise UsageError(
        f"could not load config {spec}: {value!r} is {_article(given)} {given} where {field} "
        f"takes {_article(wanted)} {wanted}; give {_article(wanted)} {wanted} in the argument "
        "after the colon"
      ) from None
    raise UsageError(
      f"could not load config {spec}: {type(e).__name__}: "
      f"{utils.first_line(e) if str(e).strip() else ''}"
    ) from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise UsageError(
      f"get_config() of {path} returned {type(config).__name__}; it "
      f"must return an ml_collections.ConfigDict"
    )
  return config


_JAX_FLAG = re.compile(r"--(no)?jax_\w")
_ABSL_DEFINE = {
  bool: flags.DEFINE_bool,
  int: flags.DEFINE_integer,
  float: flags.DEFINE_float,
  str: flags.DEFINE_string,
  "enum": flags.DEFINE_enum,
  "enum_class": flags.DEFINE_enum_class,
}


def jax_options(argv: list[str], apply: bool = True) -> list[str]:
  """Sets the ``--jax_NAME=VALUE`` options of ``argv`` (``--jax_NAME`` /
  ``--nojax_NAME`` for booleans) in ``jax.config`` and returns ``argv``
  without them.

  The equivalent of ``jax.config.parse_flags_with_absl()`` for a script with
  flags of its own: every JAX config option becomes an absl flag (of its
  type, e.g. ``--jax_debug_nans=true``, ``--jax_log_compiles``,
  ``--jax_default_matmul_precision=highest``) in a ``FlagValues`` of its
  own, so ``train.py`` and ``eval.py`` take them alike and parsing them twice
  in one process (the tests) is safe. Options that must be set before JAX
  starts its backend (``jax_platforms``, ``jax_num_cpu_devices``) work too:
  the scripts parse their flags first. ``apply=False`` only checks them.

  Raises:
    UsageError: an unknown ``--jax_`` option or a bad value.
  """
  given = [a for a in argv[1:] if _JAX_FLAG.match(a)]
  if not given:
    return argv
  import jax

  values = flags.FlagValues()
  current = jax.config.values
  for name, (kind, args, kwargs) in jax.config.meta.items():
    _ABSL_DEFINE[kind](name, current[name], *args, flag_values=values, **kwargs)
  try:
    values([argv[0]] + given)
  except flags.Error as e:
    raise UsageError(
      f"{utils.first_line(e)} (a JAX option; the names are those of jax.config.values)"
    ) from None
  if apply:
    for name in jax.config.meta:
      if values[name].present:
        try:
          jax.config.update(name, values[name].value)
        except Exception as e:
          raise UsageError(f"--{name}={values[name].value}: {utils.first_line(e)}") from None
  return [argv[0]] + [a for a in argv[1:] if a not in given]


class _CompletingConfigParser(flags.ArgumentParser):
  """A ``--config`` file parser (``config_flags``' ``parser``) whose config
  gets the settings of its task's evaluators
  (:func:`laplax.evaluators.registry.complete`) before the
  ``--config.eval.KEY=VALUE`` overrides are applied, so those keys exist and
  are typed although no config file names them."""

  def __init__(self, parser: config_flags.ConfigFileFlagParser):
    self.parser = parser

  def __getattr__(self, name):
    return getattr(self.parser, name)

  def parse(self, argument):
    return _with_evaluator_settings(self.parser.parse(argument))


def _with_evaluator_settings(config):
  """``config`` with its evaluators' settings (a ConfigDict; anything else,
  e.g. config_flags' stand-in for a file that failed to load, as it is)."""
  if isinstance(config, ml_collections.ConfigDict):
    from laplax.evaluators import registry  # CLIs start light

    registry.complete(config)
  return config


def _complete_evaluator_settings(flag_values: flags.FlagValues) -> None:
  """Gives the ``--config`` file flag of ``flag_values`` (if it has one) the
  parser :class:`_CompletingConfigParser`."""
  if "config" in flag_values:
    flag = flag_values["config"]
    if isinstance(flag.parser, config_flags.ConfigFileFlagParser):
      flag.parser = _CompletingConfigParser(flag.parser)


def parse_flags(
  argv: list[str],
  flag_values: flags.FlagValues | None = None,
  help_module: types.ModuleType | None = None,
  jax_config: bool = True,
) -> None:
  """Parses ``argv`` into absl FLAGS (or into ``flag_values``: eval.py's own
  flags, or ``python -m laplax.sweep`` checking each run's ``train.py``
  command line on its own). ``--jax_NAME=VALUE`` options set JAX's config
  (:func:`jax_options`; with ``jax_config=False``, as the sweep checks
  another process's command line, they are only checked). The known-noisy
  warnings are silenced first (:func:`silence_noisy_warnings`: loading the
  config file raises one).

  ``--help``, ``-h`` or ``--helpfull`` prints the docstring of
  ``help_module`` (default: the ``__main__`` script's) and the flags it
  defines, then exits 0. The CLIs in the package pass their own module: run
  as a console script (``laplax-train``), ``__main__`` is pip's launcher.

  Raises:
    UsageError: unknown flags, unknown config keys, bad values, bad config file,
      unknown JAX options.
  """
  silence_noisy_warnings()
  flag_values = flags.FLAGS if flag_values is None else flag_values
  if any(a in ("--help", "-h", "--helpfull", "-?") for a in argv[1:]):
    module = help_module or sys.modules.get("__main__")
    print((getattr(module, "__doc__", None) or "").strip() + "\n")
    print(
      "flags:\n"
      + (flag_values.module_help(help_module) if help_module else flag_values.main_module_help())
    )
    print(
      "\nand any JAX option as --jax_NAME=VALUE (e.g. --jax_debug_nans=true; "
      "the names of jax.config.values)"
    )
    sys.exit(0)
  argv = jax_options(argv, apply=jax_config)
  _complete_evaluator_settings(flag_values)
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)  # config_flags warns of a None config
  try:
    flag_values(argv)
  except flags.Error as e:
    spec = _config_spec(argv)
    if spec is not None and "config" in str(e).split(":")[0]:
      _load_config_file(spec)  # raises a UsageError naming the real problem
    raise UsageError(utils.first_line(e) + _override_hint(argv, utils.first_line(e))) from None
  except Exception as e:
    spec = _config_spec(argv)
    msg = None
    if spec is not None:
      config = _with_evaluator_settings(_load_config_file(spec))  # UsageError if it cannot load
      if isinstance(config, ml_collections.ConfigDict):
        msg = _unknown_key_message(argv, config)
    raise UsageError(msg or f"bad command line: {utils.first_line(e)}") from None
  finally:
    absl_logger.setLevel(level)


def load_config_flag(
  name: str = "config", flag_values: flags.FlagValues | None = None, argv: list[str] | None = None
) -> ml_collections.ConfigDict:
  """The parsed ``--config`` (of ``flag_values``, default absl's FLAGS, parsed
  from ``argv``, default ``sys.argv``) as a ConfigDict, completed with every
  key its task reads (:func:`laplax.tasks.schema.complete`; before it is
  validated).

  Raises:
    UsageError: the flag is missing or its file could not be loaded.
  """
  flag_values = flags.FLAGS if flag_values is None else flag_values
  if flag_values[name].present == 0 and flag_values[name].value is None:
    raise UsageError(f"--{name} is required, e.g. --{name} configs/vit_fashion_mnist.py")
  try:
    config = flag_values[name].value
    if not isinstance(config, ml_collections.ConfigDict):
      raise TypeError(type(config).__name__)
    config.keys()  # an _ErrorConfig raises here with the loading error
  except Exception:
    _load_config_file(
      _config_spec(sys.argv if argv is None else argv) or ""
    )  # names the real problem
    raise UsageError(f"could not load --{name}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise UsageError(f"--{name} did not give a ConfigDict (get_config() must return one)")
  from laplax.evaluators import registry
  from laplax.tasks import schema  # the task registry

  return registry.complete(schema.complete(config))


def explicit_model_keys(argv: list[str]) -> list[str]:
  """The dotted ``config.model`` keys a command line sets: ``--config.model.KEY=``
  overrides, and the keys the config file's argument changes
  (``--config FILE.py:laplacian=1`` against ``FILE.py`` without it).

  Raises:
    UsageError: the config file cannot be loaded.
  """
  keys = [m.group(1) for a in argv for m in [re.match(r"--config\.model\.([\w.]+)", a)] if m]
  spec = _config_spec(argv)
  if spec and ":" in spec:
    with_arg = utils.flatten_dotted(_load_config_file(spec).model.to_dict())
    plain = utils.flatten_dotted(_load_config_file(spec.partition(":")[0]).model.to_dict())
    keys += [k for k, v in with_arg.items() if plain.get(k) != v]
  return keys


def model_from_init(config: ml_collections.ConfigDict, argv: list[str]) -> None:
  """With ``config.init_from``, ``config.model`` takes the model section of that
  workdir's ``config.json``, except the keys the command line sets
  (:func:`explicit_model_keys`: ``--config.model.num_laplacian_heads=2``
  fine-tunes a converted timm model with Laplacian heads; the architecture
  is the one the weights have). A language model also takes its
  ``data.tokenizer`` and ``data.vocab_size`` (its ``tokenizer.json`` is
  copied by the trainer).

  Raises:
    ConfigError: ``init_from`` has no readable ``config.json``, or its model
      family differs from the config's.
  """
  init_from = config.init_from or ""
  if not isinstance(init_from, str) or not init_from:
    return
  from laplax import store
  from laplax.workdir.files import load_saved_config

  store.check_scheme(init_from, "config.init_from=")
  path = os.path.expanduser(init_from)
  saved = load_saved_config(path) if store.isdir(path) else None
  if saved is None:
    raise ConfigError(
      f"config.init_from={init_from} is not a laplax workdir (no "
      f"config.json); give a train.py or laplax.convert --workdir"
    )
  if saved.model.name != config.model.name:
    raise ConfigError(
      f"config.init_from={init_from} holds a {saved.model.name} "
      f"model, this config a {config.model.name}; use a config of "
      f"the same family"
    )
  given = explicit_model_keys(argv)
  for key in ("tokenizer", "vocab_size"):  # a language model's embedding rows mean
    if (
      key in config.data
      and key in saved.data
      and not any(  # the saved run's tokens
        a.startswith(f"--config.data.{key}=") for a in argv
      )
    ):
      config.data[key] = saved.data[key]
  for key, value in utils.flatten_dotted(saved.model.to_dict()).items():
    if any(key == g or key.startswith(g + ".") for g in given):
      continue
    *parents, leaf = key.split(".")
    node = config.model
    for part in parents:
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if not (isinstance(node, ml_collections.ConfigDict) and leaf in node):
      continue
    if key == "laplacian_mask" and value:
      value = tuple(tuple(row) for row in value)
    try:
      node[leaf] = value
    except TypeError:
      raise ConfigError(
        f"config.init_from={init_from}: its model.{key}={value!r} does "
        f"not fit this config's type; set --config.model.{key}"
      ) from None


def apply_target_flops(config: ml_collections.ConfigDict, argv: list[str]) -> None:
  """``config.total_steps`` from a FLOPs budget ``config.target_flops``, on the
  final config (after the overrides and :func:`model_from_init`), unless
  ``argv`` sets ``--config.total_steps`` (it wins, as nanochat's
  ``--num-iterations``): :func:`laplax.config.defaults.apply_target_flops`."""
  from laplax.config import defaults

  explicit = flag_value(argv, "config.total_steps") is not None
  defaults.apply_target_flops(config, explicit_steps=explicit)


def run(main: Callable[[Any], int | None], command: str | None = None) -> None:
  """Runs ``main(guard)`` and maps user errors to one stderr line and exit code 2:
  every :class:`~laplax.errors.UserError` (a bad flag or config, missing
  data, a locked workdir, a file that cannot be written, ...) and a step
  that ran out of device memory (:func:`laplax.train.fit.out_of_memory`).

  SIGINT and SIGTERM work throughout (:class:`laplax.signals.Guard`,
  ``command`` names the program in its line, default the script's name):
  in the training loop the first one stops after the step in flight with a
  checkpoint (exit 0); anywhere else (imports, data preparation,
  compilation, evaluation), or when that step does not finish within
  :data:`~laplax.signals.BOUND_S` seconds (``$LAPLAX_STOP_BOUND_S``),
  or at a second signal, the
  process prints one line saying what is saved and exits with 130 (SIGINT)
  or 143 (SIGTERM); nothing is half-written (datasets, caches, configs and
  checkpoints are written under a temporary name and renamed). ``main``
  gets the :class:`~laplax.signals.Guard` to say what that line reports:
  its ``workdir`` (``train.py``: the last complete checkpoint there) or its
  ``nothing_saved`` phrase.
  """
  from laplax import signals

  command = command or os.path.basename(sys.argv[0] or "laplax")
  try:
    bound = signals.bound_from_env()
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(USAGE_EXIT)
  with signals.Guard(command, bound) as guard:
    try:
      code = _run_main(lambda: main(guard))
    except KeyboardInterrupt as e:
      signum = e.signum if isinstance(e, signals.Signalled) else signal.SIGINT
      # No interpreter teardown: threads of the data pipeline or of a checkpoint
      # write may be mid-operation (an interrupted write is skipped on restart).
      guard.hard_exit(signum, late=False, reason=f"before {command} finished")
  sys.exit(code or 0)


def _run_main(main: Callable[[], int | None]) -> int | None:
  """``main()``, with the user errors of :func:`run` printed and exit 2."""
  from laplax.train import fit

  try:
    return main()
  except UserError as e:
    message = utils.first_line(e) if chr(10) in str(e) else str(e)
  except Exception as e:
    message = fit.out_of_memory(e)
    if message is None:
      raise
  print(f"error: {message}", file=sys.stderr)
  sys.exit(USAGE_EXIT)
