"""The fingerprint of a lowered program: a hash of its StableHLO with what
changes without a change to the program taken out.

``bench/compile_report.py --topology T --fingerprint`` lowers a config's
sharded train step for the TPU of slice ``T`` without libtpu and without
devices: on a :class:`jax.sharding.AbstractMesh` whose abstract device is
that TPU (:func:`abstract_tpu_devices`), through
``jit(f).trace(*args).lower(lowering_platforms=("tpu",))``, the path JAX
takes for an abstract mesh; Pallas kernels (splash) are lowered to their
Mosaic modules for that TPU generation as on a TPU. ``bench/aot_tables.py``
records the fingerprint in each row of the docs' ahead-of-time table and
compares it to decide which rows need compiling again.

:func:`canonical_text` keeps the program and drops:

* source locations (``lowered.as_text(debug_info=False)``), also inside each
  Mosaic kernel, whose serialised module carries the kernel's file paths and
  line numbers: it is parsed and printed without them;
* the names of the private functions (``@_where_3``, ``@closed_call``, named
  after the Python functions JAX traced, with counters), of the module and
  of the Mosaic kernels' functions (their ``kernel_name``, the kernel's
  Python name): they are renumbered in the order they are defined;
* ``jax.result_info`` (the pytree paths of the outputs).

What stays is what the compiler is given: ops, shapes, dtypes, constants,
shardings, the mesh, aliasing, the kernels' bodies and parameters.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

# (device kind, cores per device, devices per chip) of the TPU generations,
# as libtpu 0.0.42.1 reports them (jax.experimental.topologies.get_topology_desc).
TPU_GENERATIONS = {
  "v4": ("TPU v4", 1, 2),
  "v5e": ("TPU v5 lite", 1, 1),
  "v5p": ("TPU v5", 2, 1),
  "v6e": ("TPU v6 lite", 1, 1),
}
_BACKEND_CONFIG = re.compile(r'(tpu_custom_call\([^)]*\) \{backend_config = )"((?:[^"\\]|\\.)*)"')
_RESULT_INFO = re.compile(r'jax\.result_info = "(?:[^"\\]|\\.)*"(, )?')
_PRIVATE = re.compile(r"func\.func private @([\w.$-]+|\"(?:[^\"\\]|\\.)*\")")
_SYMBOL = re.compile(r"@([\w.$-]+|\"(?:[^\"\\]|\\.)*\")")
_SYM_NAME = re.compile(r'sym_name = "([^"]+)"')
_KERNEL_NAME = re.compile(r'kernel_name = "(?:[^"\\]|\\.)*"(, )?')


def abstract_tpu_devices(topology: str) -> list:
  """``jax.sharding.AbstractDevice`` s of the TPU slice ``topology``
  (``"v5e:4x4"``: 16 ``TPU v5 lite``), one per device libtpu would make.

  Raises:
    ValueError: a topology that is not ``GENERATION:AxB[xC]`` of a generation
      of :data:`TPU_GENERATIONS`.
  """
  import jax

  found = re.fullmatch(r"(\w+):(\d+(?:x\d+)+)", topology)
  if not found or found.group(1) not in TPU_GENERATIONS:
    raise ValueError(
      f"--topology {topology!r} is not GENERATION:AxB[xC] of {', '.join(TPU_GENERATIONS)}"
    )
  kind, cores, per_chip = TPU_GENERATIONS[found.group(1)]
  chips = 1
  for side in found.group(2).split("x"):
    chips *= int(side)
  device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=cores, platform="tpu")
  return [device] * (chips * per_chip)


def _unescape(match: re.Match) -> str:
  """One MLIR string escape (``\\\\`` or ``\\XX``) as its character."""
  code = match.group(1)
  return "\\" if code == "\\" else chr(int(code, 16))


def _mosaic_text(backend_config: str) -> str:
  """A ``tpu_custom_call``'s backend config (MLIR-escaped JSON) with its
  serialised Mosaic module printed as text without locations."""
  from jaxlib.mlir import ir
  from jaxlib.mosaic.python import tpu

  config = json.loads(re.sub(r"\\(\\|[0-9A-Fa-f]{2})", _unescape, backend_config))
  call = config["custom_call_config"]
  with ir.Context() as context:
    tpu.register_dialect(context)  # its memory spaces; its ops are serialised as stable_mosaic.*
    context.allow_unregistered_dialects = True
    module = ir.Module.parse(base64.b64decode(call["body"]))
    body = module.operation.get_asm(enable_debug_info=False)
  names = {name: f"k{i}" for i, name in enumerate(dict.fromkeys(_SYM_NAME.findall(body)))}
  body = _SYM_NAME.sub(lambda m: f'sym_name = "{names[m.group(1)]}"', body)
  call["body"] = _SYMBOL.sub(lambda m: "@" + names.get(m.group(1), m.group(1)), body)
  return json.dumps(config, sort_keys=True)


def canonical_text(text: str) -> str:
  """``text`` (StableHLO printed without debug info) less what changes
  without a change to the program (the module docstring's list)."""

  def mosaic(match: re.Match) -> str:
    digest = hashlib.sha256(_mosaic_text(match.group(2)).encode()).hexdigest()
    return f'{match.group(1)}"mosaic sha256 {digest}"'

  text = _BACKEND_CONFIG.sub(mosaic, text)
  text = _RESULT_INFO.sub("", text)
  text = _KERNEL_NAME.sub("", text)
  text = re.sub(r"^module @[\w.$-]+", "module @program", text, count=1, flags=re.M)
  names = {name: f"@f{i}" for i, name in enumerate(dict.fromkeys(_PRIVATE.findall(text)))}
  return _SYMBOL.sub(lambda m: names.get(m.group(1), m.group(0)), text)


def fingerprint(lowered) -> str:
  """:func:`fingerprint_text` of ``lowered`` (a ``jax.stages.Lowered``)
  printed without debug info."""
  return fingerprint_text(lowered.as_text(debug_info=False))


def fingerprint_text(text: str) -> str:
  """``"sha256:"`` and the first 16 hex digits of the SHA-256 of
  :func:`canonical_text` of ``text`` (StableHLO without debug info)."""
  return "sha256:" + hashlib.sha256(canonical_text(text).encode()).hexdigest()[:16]
