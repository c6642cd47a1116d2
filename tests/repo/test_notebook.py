"""Executes notebooks/laplax_demo.ipynb top to bottom with nbclient, as a user does.

The kernel is this interpreter (``sys.executable``, so the venv that runs
pytest): a kernelspec written into the test's temporary directory and found
by a ``KernelSpecManager`` that looks only there, so no kernelspec installed
on the machine (a user's ``python3``) is used or needed, and nothing is
installed. ``IPYTHONDIR`` and ``JUPYTER_RUNTIME_DIR`` also point into the
temporary directory, and so does ``TMPDIR``, where the notebook's training
workdirs go. ``LAPLAX_DEMO_STEPS=20`` shortens both training runs (the
notebook then also uses batches of 32 and 500 test images);
``LAPLAX_DATA_DIR`` is the session's prepared Fashion-MNIST (conftest.py's
``fmnist_data_dir``). The first cell's two other ways to find laplax (no
checkout: an error naming ``LAPLAX_REPO``; with it: a clone) run in
subprocesses outside the checkout.
"""

import base64
import io
import json
import os
import subprocess
import sys
import types

import jax
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "laplax_demo.ipynb")
STEPS = 20
KERNEL = "laplax-test"


def kernel_manager(directory) -> KernelManager:
  """A KernelManager for ``sys.executable``'s ipykernel, from a kernelspec in ``directory``."""
  spec_dir = directory / "kernels" / KERNEL
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(
    json.dumps(
      {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
      }
    )
  )
  specs = KernelSpecManager(kernel_dirs=[str(directory / "kernels")])
  return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def setup_cell() -> str:
  """The source of the notebook's first code cell (finds or installs laplax)."""
  nb = nbformat.read(NOTEBOOK, as_version=4)
  return next(c.source for c in nb.cells if c.cell_type == "code")


def run_setup_cell(cwd, **env):
  """The first cell in a new interpreter in ``cwd`` (outside the checkout)."""
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LAPLAX_REPO")} | env
  probe = subprocess.run(
    [
      sys.executable,
      "-c",
      "import importlib.util, sys; sys.exit(importlib.util.find_spec('laplax') is not None)",
    ],
    cwd=cwd,
    env=env,
    check=False,
  )
  if probe.returncode:
    pytest.skip("laplax is installed in this interpreter, so the cell finds it there")
  return subprocess.run(
    [sys.executable, "-c", setup_cell()],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )


def test_setup_cell_without_checkout_or_repo_asks_for_laplax_repo(tmp_path):
  result = run_setup_cell(tmp_path)
  assert result.returncode == 1
  assert (
    result.stderr.strip()
    .splitlines()[-1]
    .startswith("RuntimeError: no laplax checkout found: set LAPLAX_REPO to the git URL")
  )
  assert not list(tmp_path.iterdir())  # nothing cloned or downloaded


def test_setup_cell_clones_laplax_repo(tmp_path):
  """With LAPLAX_REPO (here this checkout's git repository) the cell clones it
  and takes laplax and configs/ from the clone (nothing to pip install here)."""
  if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(
    os.path.join(ROOT, ".git")
  ):
    pytest.skip("the repository is not a git checkout")
  result = run_setup_cell(tmp_path, LAPLAX_REPO=ROOT, LAPLAX_DEMO_STEPS="7")
  assert result.returncode == 0, result.stderr
  clone = tmp_path / "laplax"
  assert (clone / "configs" / "vit_fashion_mnist.py").is_file()
  assert result.stdout.splitlines()[-1] == (
    f"laplax from {clone} | steps per run: 7 | batch size: 32"
  )


def test_data_cell_downloads_missing_idx_files(tmp_path, monkeypatch):
  """Where the IDX files are absent (Colab) the data cell fetches the four of
  them into ./fashion-mnist and points SOURCE_DIR there; here its URL is
  replaced by a file:// URL of the Debian package's directory."""
  from laplax.data.builders import fashion_mnist_idx as fmnist

  source = "/usr/share/datasets/fashion-mnist"
  if not os.path.isfile(os.path.join(source, "train-images-idx3-ubyte.gz")):
    pytest.skip("Fashion-MNIST missing: apt-get install -y dataset-fashion-mnist")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  cell = next(c.source for c in nb.cells if c.cell_type == "code" and "FMNIST_URL" in c.source)
  official = 'FMNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"'
  assert official in cell
  monkeypatch.chdir(tmp_path)
  monkeypatch.delenv("LAPLAX_DATA_DIR", raising=False)
  absent = types.SimpleNamespace(
    DEFAULT_SOURCE_DIR=str(tmp_path / "absent"), source_files=fmnist.source_files
  )
  namespace = {"os": os, "fmnist": absent}
  exec(cell.replace(official, f'FMNIST_URL = "file://{source}/"'), namespace)
  assert namespace["SOURCE_DIR"] == str(tmp_path / "fashion-mnist")
  names = sorted(os.listdir(tmp_path / "fashion-mnist"))
  assert names == sorted(
    os.path.basename(p) for pair in fmnist.source_files(source).values() for p in pair
  )
  for name in names:
    with (
      open(tmp_path / "fashion-mnist" / name, "rb") as got,
      open(os.path.join(source, name), "rb") as want,
    ):
      assert got.read() == want.read()
  fmnist.check_headers(str(tmp_path / "fashion-mnist"))
  assert namespace["DATA_DIR"] == "~/tensorflow_datasets"


def test_notebook_outputs_are_cleared():
  """The committed notebook has no outputs (the repository stays small)."""
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code
  assert all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow
def test_notebook_executes(tmp_path, monkeypatch, fmnist_data_dir):
  """Every cell runs without error; the figures are real PNGs; both runs trained."""
  work = tmp_path / "tmp"
  work.mkdir()
  for name, value in {
    "LAPLAX_DEMO_STEPS": str(STEPS),
    "LAPLAX_DATA_DIR": fmnist_data_dir,
    "TMPDIR": str(work),
    "IPYTHONDIR": str(tmp_path / "ipython"),
    "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "PYTHONWARNINGS": "ignore",
  }.items():
    monkeypatch.setenv(name, value)
  monkeypatch.delenv("LAPLAX_REPO", raising=False)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(
    nb,
    km=kernel_manager(tmp_path),
    timeout=600,
    resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}},
  )
  client.execute()  # raises CellExecutionError on the first failing cell

  pngs = [
    base64.b64decode(out["data"]["image/png"])
    for cell in nb.cells
    if cell.cell_type == "code"
    for out in cell.outputs
    if out.get("output_type") == "display_data" and "image/png" in out.get("data", {})
  ]
  assert len(pngs) >= 4
  for png in pngs:
    with Image.open(io.BytesIO(png)) as image:
      assert image.format == "PNG" and min(image.size) >= 100

  text = "".join(
    out.get("text", "")
    for cell in nb.cells
    if cell.cell_type == "code"
    for out in cell.outputs
    if out.get("output_type") == "stream"
  )
  assert f"backend: {jax.default_backend()}" in text
  # Both training runs wrote their metrics through the library's loop, in TMPDIR.
  (demo,) = list(work.glob("laplax_demo_*"))
  for k in (0, 4):
    with open(demo / f"laplacian{k}" / "metrics.jsonl") as f:
      records = [json.loads(line) for line in f]
    assert max(r["step"] for r in records if r.get("split") == "train") == STEPS
    (final,) = [r for r in records if r.get("split") == "eval"]
    assert final["step"] == STEPS and final["num_examples"] == 500
    with open(demo / f"laplacian{k}" / "config.json") as f:
      assert json.load(f)["model"]["num_laplacian_heads"] == k
