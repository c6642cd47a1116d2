"""bench/program_fingerprint.py: what the fingerprint of a lowered program
keeps (ops, constants, shardings, kernels) and what it drops (locations,
traced functions' names, output paths), and the abstract TPU devices it
lowers for (their counts and kinds as libtpu 0.0.42.1's
``get_topology_desc`` reports them)."""

import sys

import pytest

from helpers.runs import ROOT, run

sys.path.insert(0, ROOT)
from bench import program_fingerprint as pf  # noqa: E402

PROGRAM = """module @jit_train_step attributes {mhlo.num_partitions = 4 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32> {jax.result_info = "result['a']"}) {
    %0 = call @_where_3(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = call @norm(%0) : (tensor<4xf32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
  }
  func.func private @_where_3(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    return %arg0 : tensor<4xf32>
  }
  func.func private @norm(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %cst = stablehlo.constant dense<1.000000e-06> : tensor<4xf32>
    %0 = stablehlo.add %arg0, %cst : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""


def test_names_of_traced_functions_and_outputs_do_not_change_the_fingerprint():
  renamed = (
    PROGRAM.replace("@jit_train_step", "@jit_step")
    .replace("@_where_3", "@_where_7")
    .replace("@norm", "@rms_norm")
    .replace("result['a']", "result['b']")
  )
  assert pf.fingerprint_text(renamed) == pf.fingerprint_text(PROGRAM)
  text = pf.canonical_text(PROGRAM)
  assert "call @f0(%arg0)" in text and "func.func private @f1(" in text
  assert "module @program" in text and "result_info" not in text


def test_a_constant_an_op_or_the_order_of_calls_changes_the_fingerprint():
  base = pf.fingerprint_text(PROGRAM)
  assert pf.fingerprint_text(PROGRAM.replace("1.000000e-06", "1.000000e-05")) != base
  assert pf.fingerprint_text(PROGRAM.replace("stablehlo.add", "stablehlo.subtract")) != base
  assert pf.fingerprint_text(PROGRAM.replace("num_partitions = 4", "num_partitions = 8")) != base
  swapped = PROGRAM.replace("call @_where_3(%arg0)", "call @TMP(%arg0)")
  swapped = swapped.replace("call @norm(%0)", "call @_where_3(%0)").replace("@TMP", "@norm")
  assert pf.fingerprint_text(swapped) != base
  assert base.startswith("sha256:") and len(base) == len("sha256:") + 16


def test_abstract_tpu_devices_match_libtpu_topologies():
  v5e = pf.abstract_tpu_devices("v5e:4x4")
  assert len(v5e) == 16 and v5e[0].device_kind == "TPU v5 lite" and v5e[0].platform == "tpu"
  assert len(pf.abstract_tpu_devices("v5e:16x16")) == 256
  v5p = pf.abstract_tpu_devices("v5p:2x2x2")
  assert len(v5p) == 8 and (v5p[0].device_kind, v5p[0].num_cores) == ("TPU v5", 2)
  assert len(pf.abstract_tpu_devices("v4:2x2x2")) == 16  # two devices a chip
  assert pf.abstract_tpu_devices("v6e:4x4")[0].device_kind == "TPU v6 lite"
  for bad in ("v9:4x4", "v5e", "v5e:4by4"):
    with pytest.raises(ValueError, match="is not GENERATION:AxB"):
      pf.abstract_tpu_devices(bad)


@pytest.mark.slow  # two interpreters importing JAX
@pytest.mark.subprocess
def test_fingerprint_without_a_topology_is_one_line_exit_2():
  proc = run(["bench/compile_report.py", "--fingerprint", "--config", "configs/gpt_d20.py"])
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
    "error: --fingerprint lowers a train step for a TPU slice: give --topology, e.g. v5e:4x4"
  ]
  proc = run(["bench/compile_report.py", "--fingerprint", "--topology", "v9:4x4"])
  assert proc.returncode == 2
  assert proc.stderr.strip().startswith("error: --topology 'v9:4x4' is not GENERATION:AxB")
