r"""Convert weights between laplax and timm / Hugging Face ``transformers``.

    python -m laplax.convert --from timm --model deit3_small_patch16_224 \
        --workdir runs/deit3_s [--weights FILE.safetensors|.pth] \
        [--model_args img_size=28,in_chans=1,patch_size=7,num_classes=10] \
        [--config configs/deit3_imagenet.py] [--config.key=value ...]
    python -m laplax.convert --from hf-gpt2 --model HF_DIR --workdir runs/gpt2 \
        [--config configs/gpt2_124m.py] [--config.key=value ...]
    python -m laplax.convert --from hf-bert --model HF_DIR --workdir runs/bert \
        [--config configs/bert_cramming.py] [--config.key=value ...]
    python -m laplax.convert --from hf-nystromformer --model HF_DIR --workdir runs/nf \
        [--config configs/bert_cramming.py] [--config.key=value ...]
    python -m laplax.convert --from nanochat --model CHECKPOINT_DIR [--step N] \
        [--tokenizer tokenizer.pkl|DIR] --workdir runs/d20 [--config configs/gpt_d20.py]
    python -m laplax.convert --to timm --workdir runs/vit --out OUT_DIR [--force]
    python -m laplax.convert --to hf-gpt2 --workdir runs/gpt --out OUT_DIR [--force]
    python -m laplax.convert --to hf-bert --workdir runs/bert --out OUT_DIR [--force]
    python -m laplax.convert --to nanochat --workdir runs/d20 --out OUT_DIR

``--from`` writes a new laplax workdir (``config.json`` and a step-0
checkpoint): ``eval.py --workdir`` evaluates it, ``train.py
--config.init_from=WORKDIR`` fine-tunes from it (Laplacian heads and
spectral settings may differ). The config gives the data and training
settings (default: ``configs/deit3_imagenet.py`` for timm, ``configs/swin_imagenet.py``
for a timm ``swin_*`` model, ``configs/davit_imagenet.py`` for a ``davit_*`` one,
``configs/xcit_imagenet.py`` for an ``xcit_*`` one,
``configs/gpt2_124m.py`` for GPT-2, ``configs/bert_cramming.py`` for BERT and
the Nystromformer (``NystromformerForMaskedLM``,
:mod:`laplax.convert.hf_nystromformer`; ``--from`` only),
``configs/gpt_d20.py`` for nanochat); the
model keys come from the source (nanochat: ``meta_<step>.json``, its
Laplacian heads included; :mod:`laplax.convert.nanochat`).
``--to`` writes ``OUT_DIR`` for timm (``model.safetensors`` and
``timm_config.json``, the ``VisionTransformer`` arguments) or a
``save_pretrained`` directory for ``transformers``, or nanochat's checkpoint
directory (``model_<step>.pt``, ``meta_<step>.json``, ``tokenizer.pkl``).
For timm and GPT-2 a model with Laplacian heads or spectral conditioning is
refused unless ``--force``; nanochat carries Laplacian heads as the
authors' ``laplacian_heads``. Every other model option is checked against
what the target's converter module declares in its own table (``SUPPORT``,
:func:`laplax.convert.support.unsupported`): an option the table does not
list is refused unless at its default, by ``--to`` and ``--from`` alike
(fail closed: a new spec field is refused until the converter lists it).
``--workdir`` may be ``gs://BUCKET/PATH`` for ``--from`` and ``--to`` alike
(:mod:`laplax.convert.remote`); ``--out`` is a local directory or a ``gs://``
folder (written locally, then uploaded: :func:`laplax.convert.remote.write_output`).
Bad input prints one line and exits with code 2; nothing is written.
SIGINT or SIGTERM ends it within 5 s with one line and exit code 130 or 143,
leaving nothing behind (the output is written in a temporary directory,
removed at such an exit, and renamed into place when complete).
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

from laplax import signals
from laplax.cli import common as cli

_FROM = flags.DEFINE_enum(
  "from",
  None,
  ["timm", "hf-gpt2", "hf-bert", "hf-nystromformer", "nanochat"],
  "Source of the weights.",
)
_TO = flags.DEFINE_enum(
  "to", None, ["timm", "hf-gpt2", "hf-bert", "nanochat"], "Target of the weights."
)
_MODEL = flags.DEFINE_string(
  "model",
  None,
  "timm model name, a Hugging Face "
  "save_pretrained directory of GPT2LMHeadModel, or nanochat's "
  "checkpoint directory (base_checkpoints/d20).",
)
_STEP = flags.DEFINE_integer("step", None, "nanochat: the checkpoint step (default: the last).")
_TOKENIZER = flags.DEFINE_string(
  "tokenizer",
  None,
  "nanochat: its tokenizer.pkl (or a "
  "directory with it, or a nanochat_tokenizer.json); default: "
  "found beside the checkpoint or in BASE/tokenizer/.",
)
_WEIGHTS = flags.DEFINE_string(
  "weights",
  None,
  "timm weights (.safetensors or .pth); "
  "default: the timm model's random initialisation (torch seed 0).",
)
_MODEL_ARGS = flags.DEFINE_string(
  "model_args",
  "",
  "timm.create_model keyword arguments, k=v,k=v (ints, floats, True/False, strings).",
)
_WORKDIR = flags.DEFINE_string("workdir", None, "The laplax workdir (new for --from).")
_OUT = flags.DEFINE_string("out", None, "Output directory of --to (must not exist).")
_FORCE = flags.DEFINE_bool(
  "force", False, "Write a model with Laplacian heads or spectral conditioning anyway."
)
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Data and training settings of --from (FILE.py[:args]).", lock_config=False
)

REPO_CONFIGS = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs"
)
DEFAULT_CONFIGS = {
  "timm": "deit3_imagenet.py",
  "hf-gpt2": "gpt2_124m.py",
  "hf-bert": "bert_cramming.py",
  "hf-nystromformer": "bert_cramming.py",
  "nanochat": "gpt_d20.py",
}


def _config(source: str):
  """The ``--config`` ConfigDict, or the source's default config file."""
  if flags.FLAGS["config"].present or flags.FLAGS["config"].value is not None:
    return cli.load_config_flag()
  path = os.path.join(REPO_CONFIGS, DEFAULT_CONFIGS[source])
  if not os.path.isfile(path):
    raise cli.UsageError(
      f"--config is required here (no {path}); give the data and "
      f"training settings, e.g. --config configs/{DEFAULT_CONFIGS[source]}"
    )
  return cli._load_config_file(path)


def _with_default_config(argv: list[str]) -> list[str]:
  """``argv`` with ``--config`` set to the source's default config file when
  ``--from`` is given without one (so ``--config.key=value`` overrides parse):
  for a timm model, the ``DEFAULT_CONFIG`` of the timm converter whose
  ``MODEL_PREFIXES`` starts its name (``configs/swin_imagenet.py`` for a
  ``swin_*`` model; :func:`laplax.convert.timm_vit.converters`)."""
  source = cli.flag_value(argv, "from")
  name = DEFAULT_CONFIGS.get(source, "")
  model = cli.flag_value(argv, "model") or ""
  if source == "timm":
    from laplax.convert import timm_vit

    for converter in timm_vit.converters():
      if model.startswith(converter.MODEL_PREFIXES):  # () matches nothing
        name = converter.DEFAULT_CONFIG
  path = os.path.join(REPO_CONFIGS, name)
  if source in DEFAULT_CONFIGS and cli.flag_value(argv, "config") is None and os.path.isfile(path):
    return argv[:1] + [f"--config={path}"] + argv[1:]
  return argv


def _export(target: str) -> None:
  """``--to TARGET``: writes ``--workdir``'s run as ``target``'s files into
  ``--out``, a new local directory or ``gs://`` folder (written locally, then
  uploaded: :func:`laplax.convert.remote.write_output`).

  Raises:
    UsageError: no ``--out``.
    ConvertError: the run cannot be expressed in ``target`` or ``--out`` exists.
  """
  from laplax import store
  from laplax.convert import common, hf_bert, hf_gpt2, nanochat, timm_vit

  if not _OUT.value:
    raise cli.UsageError(f"--out is required with --to {target} (a new directory)")
  if target == "nanochat":
    write = lambda out: nanochat.convert_to_nanochat(_WORKDIR.value, out)
  else:
    convert = {
      "timm": timm_vit.convert_to_timm,
      "hf-gpt2": hf_gpt2.convert_to_hf,
      "hf-bert": hf_bert.convert_to_hf,
    }[target]
    write = lambda out: convert(_WORKDIR.value, out, _FORCE.value)
  if store.is_remote(_OUT.value):
    from laplax.convert import remote

    note = remote.write_output(_OUT.value.rstrip("/"), write, common.ConvertError)
  else:
    note = write(_OUT.value)
  print(f"wrote {_OUT.value}" + (f"; --force: {note}" if note else ""))


def main(guard: signals.Guard) -> int:
  """Runs the conversion the flags ask for."""
  sys.argv = _with_default_config(sys.argv)
  cli.parse_flags(sys.argv)
  source, target = flags.FLAGS["from"].value, _TO.value
  if (source is None) == (target is None):
    raise cli.UsageError(
      "give exactly one of --from timm|hf-gpt2|hf-bert|hf-nystromformer|nanochat and "
      "--to timm|hf-gpt2|hf-bert|nanochat"
    )
  if not _WORKDIR.value:
    raise cli.UsageError("--workdir is required (the laplax run directory)")
  from laplax import store

  try:
    store.check_scheme(_WORKDIR.value)
  except store.StoreError as e:
    raise cli.UsageError(str(e)) from None
  try:
    store.check_scheme(_OUT.value or "", "--out")
  except store.StoreError as e:
    raise cli.UsageError(str(e)) from None
  cli.quiet()
  from laplax.convert import common, hf_bert, hf_gpt2, hf_nystromformer, nanochat, timm_vit

  # A signal's exit line: the output is renamed into place in whole.
  guard.nothing_saved = "nothing was written (the output appears only complete)"
  if source is not None:
    if not _MODEL.value:
      raise cli.UsageError(
        "--model is required with --from (a timm model name, a "
        "Hugging Face directory or nanochat's checkpoint directory)"
      )
    if source != "nanochat" and (_STEP.value is not None or _TOKENIZER.value):
      raise cli.UsageError("--step and --tokenizer are for --from nanochat")
    config = _config(source)
    given = cli.explicit_model_keys(sys.argv)
    common.plain_attention(config, given)
    if source == "nanochat":
      tokenizer = nanochat.convert_from_nanochat(
        _MODEL.value,
        config,
        _WORKDIR.value,
        step=_STEP.value,
        tokenizer=_TOKENIZER.value,
        given=given,
      )
      if tokenizer:
        print(f"tokenizer: {tokenizer} -> {nanochat.TOKENIZER_FILE}")
    elif source == "timm":
      timm_vit.convert_from_timm(
        _MODEL.value, _WEIGHTS.value, _MODEL_ARGS.value, config, _WORKDIR.value
      )
    else:
      if _WEIGHTS.value or _MODEL_ARGS.value:
        raise cli.UsageError(
          "--weights and --model_args are for --from timm; the "
          "Hugging Face directory holds the weights and config"
        )
      convert = {
        "hf-bert": hf_bert.convert_from_hf,
        "hf-gpt2": hf_gpt2.convert_from_hf,
        "hf-nystromformer": hf_nystromformer.convert_from_hf,
      }[source]
      convert(_MODEL.value, config, _WORKDIR.value)
    print(
      f"wrote {_WORKDIR.value} (step 0): evaluate it with eval.py --workdir "
      f"{_WORKDIR.value}, fine-tune with train.py --config.init_from={_WORKDIR.value}"
    )
  else:
    _export(target)
  return 0


if __name__ == "__main__":
  cli.run(main, command="python -m laplax.convert")
