"""What the checkpoint checksums cost (``config.checkpoint_verify``).

    python bench/checksum_cost.py                     # configs/vit_fashion_mnist.py
    python bench/checksum_cost.py --dir /data/scratch --megabytes 1024

Prints, in one run:

1. hash throughput in seconds per GB (10^9 bytes) of the checksums of Python's
   standard library on ``--megabytes`` of random bytes in memory (CRC-32, the
   one laplax uses, beside Adler-32, SHA-256, SHA-1, BLAKE2b, MD5), and of
   :func:`laplax.workdir.integrity.file_checksum` reading a file of that size
   in ``--dir`` (just written, so mostly from the page cache: the hashing,
   not the disk);
2. for the config's checkpoint (default: the default ViT,
   ``configs/vit_fashion_mnist.py``, its TrainState at initialisation; no data
   is needed): its size, the median time over ``--repeats`` of a save
   (``Checkpointer.save`` + ``wait``, checksums off), of writing its manifest
   (what ``checkpoint_verify=True`` adds after each save, in orbax's save
   thread) and of verifying it (what it adds before each restore), and the
   manifest time as a fraction of the save time.

The numbers depend on the machine's load; docs/survive.md says which were quiet.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GB = 1e9


def hash_throughput(megabytes: int, directory: str) -> None:
  """Prints seconds per GB of each checksum on ``megabytes`` MiB."""
  from laplax.workdir import integrity

  data = os.urandom(megabytes << 20)
  hashes = {"crc32 (zlib)": lambda b: zlib.crc32(b), "adler32 (zlib)": lambda b: zlib.adler32(b)}
  for name in ("sha256", "sha1", "blake2b", "md5"):
    hashes[name] = lambda b, name=name: hashlib.new(name, b).digest()
  print(f"hash throughput on {megabytes} MiB in memory:")
  for name, fn in hashes.items():
    t = time.perf_counter()
    fn(data)
    print(f"  {name:15s} {(time.perf_counter() - t) / (len(data) / GB):.3f} s/GB")
  path = os.path.join(directory, "checksum_cost.bin")
  try:
    with open(path, "wb") as f:
      f.write(data)
    t = time.perf_counter()
    integrity.file_checksum(path)
    per_gb = (time.perf_counter() - t) / (len(data) / GB)
    print(
      f"  integrity.file_checksum of a {megabytes} MiB file in {directory} "
      f"(page cache): {per_gb:.3f} s/GB"
    )
  finally:
    os.remove(path)


def checkpoint_cost(config_path: str, repeats: int, directory: str) -> None:
  """Prints the save, manifest and verification times of the config's checkpoint."""
  import jax

  from bench.common import load_config
  from laplax import optim, tasks
  from laplax import state as state_lib
  from laplax.workdir import checkpoint, integrity, saving

  config = load_config(config_path)
  task = tasks.ClassificationTask(config, num_classes=10, image_shape=(28, 28, 1))
  state = state_lib.init_state(task, optim.make_optimizer(config), config.seed)
  jax.block_until_ready(state)
  root = tempfile.mkdtemp(prefix="checksum_cost_", dir=directory)
  try:
    ckpt = checkpoint.Checkpointer(
      os.path.join(root, "checkpoints"), max_to_keep=None, verify=False
    )
    saves, manifests, verifies = [], [], []
    for i in range(repeats + 1):
      t = time.perf_counter()
      ckpt.save(state.replace(step=state.step + i), {"position": i})
      ckpt.wait()
      save = time.perf_counter() - t
      step_dir = ckpt.step_dir(i)
      t = time.perf_counter()
      integrity.write_manifest(step_dir)
      manifest = time.perf_counter() - t
      t = time.perf_counter()
      assert integrity.verify(step_dir)
      verify = time.perf_counter() - t
      if i:  # the first save also starts orbax's machinery
        saves.append(save)
        manifests.append(manifest)
        verifies.append(verify)
    ckpt.close()
    size = saving.tree_size(ckpt.step_dir(1))
    save, manifest, verify = (statistics.median(x) for x in (saves, manifests, verifies))
    print(
      f"checkpoint of {config_path} (TrainState at initialisation, "
      f"{sum(x.size for x in jax.tree_util.tree_leaves(state.params)):,} parameters): "
      f"{size / 1e6:.2f} MB in {len(os.listdir(os.path.join(ckpt.step_dir(1), 'state')))} "
      f"entries of state/, median of {repeats} in {directory}:"
    )
    print(f"  save (checksums off): {save * 1e3:.1f} ms")
    print(f"  manifest: {manifest * 1e3:.2f} ms = {manifest / save:.1%} of the save")
    print(f"  verification before a restore: {verify * 1e3:.2f} ms")
  finally:
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/vit_fashion_mnist.py")
  parser.add_argument(
    "--dir", default=tempfile.gettempdir(), help="where the test file and checkpoints are written"
  )
  parser.add_argument("--megabytes", type=int, default=512, help="MiB hashed")
  parser.add_argument("--repeats", type=int, default=10, help="checkpoints saved")
  args = parser.parse_args()
  logging.getLogger("absl").setLevel(logging.ERROR)  # orbax's "waiting for previous save"
  hash_throughput(args.megabytes, args.dir)
  checkpoint_cost(args.config, args.repeats, args.dir)


if __name__ == "__main__":
  main()
