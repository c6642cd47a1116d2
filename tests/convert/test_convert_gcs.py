"""``python -m laplax.convert`` with ``--workdir gs://BUCKET/PATH``, against a real GCS emulator.

A tiny random timm ViT goes to a ``gs://`` workdir and one on local disk: both
hold the same parameters and config, eval.py and laplax.load read the
``gs://`` one, ``--to timm`` of it writes the weights timm started from, a
second ``--from`` onto it is refused in one line, and a failed write leaves
no object behind. No test leaves a local folder ``gs:``.
"""

import importlib.util
import json
import os

import numpy as np
import pytest

if not all(importlib.util.find_spec(m) for m in ("gcsfs", "gcp_storage_emulator", "torch", "timm")):
  pytest.skip(
    "needs gcsfs, gcp-storage-emulator, torch and timm (requirements-test.txt)",
    allow_module_level=True,
  )

from laplax import store  # noqa: E402
from laplax.convert import common, timm_vit  # noqa: E402

from helpers.gcs import gcs_fixture, objects  # noqa: E402, F401  (the fixture gcs)
from helpers.runs import CONFIG, ROOT, run, run_in_process  # noqa: E402

FMNIST_ARGS = "img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=1,embed_dim=16,num_heads=2"


def _from_timm(workdir, data_dir):
  return [
    "-m",
    "laplax.convert",
    "--from",
    "timm",
    "--model",
    "vit_tiny_patch16_224",
    "--model_args",
    FMNIST_ARGS,
    "--workdir",
    str(workdir),
    "--config",
    CONFIG,
    f"--config.data.data_dir={data_dir}",
    "--config.eval_batch_size=100",
    "--config.data.eval_split=test[:100]",
  ]


def _flat(params):
  return {k: np.asarray(v) for k, v in common.flat(params).items()}


@pytest.mark.slow
@pytest.mark.subprocess
def test_timm_round_trip_through_gs(gcs, tmp_path, fmnist_data_dir, capfd):
  """--from timm onto gs:// equals the local conversion; eval.py, laplax.load and
  --to timm read it; a second --from onto it is refused, nothing changed."""
  url = f"gs://{gcs.bucket}/conv"
  local = tmp_path / "conv"
  for workdir in (url, local):
    r = run(_from_timm(workdir, fmnist_data_dir))
    assert r.returncode == 0, r.stderr[-2000:]
  names = objects(gcs.url, gcs.bucket, "conv/")
  assert "conv/config.json" in names and "conv/checkpoints/0/commit_success.txt" in names
  assert "conv/train.lock" not in names and not any("/.convert-" in n for n in names)
  assert json.loads(store.read_text(f"{url}/config.json")) == json.loads(
    (local / "config.json").read_text()
  )
  gs_config, _, gs_params, step = common.read_workdir(url)
  _, _, local_params, _ = common.read_workdir(str(local))
  assert step == 0 and gs_config.model.width == 16
  got, want = _flat(gs_params), _flat(local_params)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  # eval.py and laplax.load on the gs:// workdir, as on the local one.
  r = run_in_process(["eval.py", "--workdir", url], capfd)
  assert r.returncode == 0, r.stderr[-2000:]
  result = json.loads(store.read_text(f"{url}/eval.json"))
  assert result["step"] == 0 and result["num_examples"] == 100
  import laplax

  loaded = laplax.load(url)
  assert _flat(loaded.params).keys() == want.keys()
  # --to timm of the gs:// workdir writes what --to timm of the local one does.
  out, ref = tmp_path / "back", tmp_path / "ref"
  r = run(["-m", "laplax.convert", "--to", "timm", "--workdir", url, "--out", str(out)])
  assert r.returncode == 0, r.stderr[-2000:]
  assert timm_vit.convert_to_timm(str(local), str(ref), force=False) is None
  for name in (timm_vit.WEIGHTS, timm_vit.TIMM_CONFIG):
    assert (out / name).read_bytes() == (ref / name).read_bytes(), name
  back = timm_vit.timm_from_dir(str(out))
  assert back.cls_token.shape == (1, 1, 16)
  # Never overwritten: a second --from is one line, exit 2, every object as it was.
  before = {n: store.read_bytes(f"gs://{gcs.bucket}/{n}") for n in objects(gcs.url, gcs.bucket)}
  r = run(_from_timm(url, fmnist_data_dir))
  errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
  assert r.returncode == 2 and len(errors) == 1 and "exists" in errors[0], r.stderr[-2000:]
  after = {n: store.read_bytes(f"gs://{gcs.bucket}/{n}") for n in objects(gcs.url, gcs.bucket)}
  assert after == before
  # --out gs://: the same files, uploaded; a second --to onto it is refused, nothing changed.
  r = run(["-m", "laplax.convert", "--to", "timm", "--workdir", url, "--out", f"{url}-timm/"])
  assert r.returncode == 0, r.stderr[-2000:]
  assert store.files_under(f"{url}-timm") == {
    name: (ref / name).stat().st_size for name in (timm_vit.WEIGHTS, timm_vit.TIMM_CONFIG)
  }
  for name in (timm_vit.WEIGHTS, timm_vit.TIMM_CONFIG):
    assert store.read_bytes(f"{url}-timm/{name}") == (ref / name).read_bytes(), name
  uploaded = {n: store.read_bytes(f"{url}-timm/{n}") for n in store.files_under(f"{url}-timm")}
  r = run(["-m", "laplax.convert", "--to", "timm", "--workdir", url, "--out", f"{url}-timm"])
  errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
  assert r.returncode == 2 and len(errors) == 1 and "exists" in errors[0], r.stderr[-2000:]
  assert {n: store.read_bytes(f"{url}-timm/{n}") for n in uploaded} == uploaded
  assert not os.path.exists(os.path.join(ROOT, "gs:")) and not os.path.exists("gs:")


@pytest.mark.slow
def test_failed_gs_write_leaves_nothing_and_frees_the_workdir(gcs, tmp_path):
  """A write that fails after the checkpoint (a file to copy in is missing)
  removes every object it wrote, the lock included; the same workdir then converts."""
  from laplax.cli import common as cli

  local = str(tmp_path / "local")
  config = cli._load_config_file(CONFIG)
  common.plain_attention(config, [])
  timm_vit.convert_from_timm("vit_tiny_patch16_224", None, FMNIST_ARGS, config, local)
  config, spec, params, _ = common.read_workdir(local)
  params = common.to_layout(params, spec)
  url = f"gs://{gcs.bucket}/failed"
  sizes = dict(num_classes=10, image_shape=(28, 28, 1))
  with pytest.raises(FileNotFoundError):
    common.write_workdir(url, config, params, files={"x.json": str(tmp_path / "no")}, **sizes)
  assert objects(gcs.url, gcs.bucket, "failed/") == []
  common.write_workdir(url, config, params, **sizes)
  got, want = _flat(common.read_workdir(url)[2]), _flat(common.read_workdir(local)[2])
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  assert "failed/train.lock" not in objects(gcs.url, gcs.bucket, "failed/")
