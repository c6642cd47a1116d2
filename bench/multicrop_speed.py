"""Milliseconds per batch of the DINO multi-crop input pipeline (laplax.data.vision.images, .multicrop).

    python bench/multicrop_speed.py                        # Fashion-MNIST, batch 128
    python bench/multicrop_speed.py --batch_size 256 --batches 50

Prepares ``fashion_mnist_idx`` in --data_dir if needed (from --source_dir),
then times, on the default multi-crop config (2 global 28 px + 6 local 14 px
views for Fashion-MNIST), the median over --batches batches of:

* read: the batched ``__getitems__`` read of the batch alone;
* augment: the multi-crop augmentation of already-read images alone;
* batch (1 core): read + augmentation in this thread, what one grain worker
  thread does per batch;
* iterator: ``next()`` on ``multicrop_train_dataset`` with the data config's
  ``num_threads`` and ``prefetch`` (after warming up), i.e. what the trainer sees.

The first three are reported as wall-clock time and as CPU time of this thread
(``time.thread_time``), which is what they cost one core even when other
processes compete for the CPUs; the iterator only as wall-clock time.

Target: the 1-core batch well under 50 ms for batch 128 on Fashion-MNIST.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Measure one core.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from laplax.data.vision import images
from laplax.data.vision.multicrop import multicrop_views


def median_ms(fn, batches: int) -> tuple[float, float]:
  """Median wall-clock and this-thread CPU milliseconds of ``fn()``."""
  wall, cpu = [], []
  for _ in range(batches):
    start, start_cpu = time.perf_counter(), time.thread_time()
    fn()
    wall.append(time.perf_counter() - start)
    cpu.append(time.thread_time() - start_cpu)
  return 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--name", default="fashion_mnist_idx", help="TFDS dataset name")
  parser.add_argument("--data_dir", default="~/tensorflow_datasets")
  parser.add_argument("--source_dir", default=None, help="Fashion-MNIST IDX files")
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument("--batches", type=int, default=30, help="timed batches per measurement")
  args = parser.parse_args()

  data = images.default_config(args.name)
  data.data_dir = args.data_dir
  if args.source_dir:
    data.source_dir = args.source_dir
  images.prepare(data)
  multicrop = images.default_multicrop_config(args.name)
  source = images._open(data, data.train_split)
  height, width, channels = source.dataset_info.features["image"].shape
  fixed = height is not None and width is not None
  m = images._multicrop_settings(data, multicrop, channels)
  rng = np.random.default_rng(0)

  def indices():
    return rng.integers(0, len(source), args.batch_size)

  pictures, _ = images._read(source, indices())

  def augment():
    for local in (False, True):
      multicrop_views(pictures, rng, m, fixed, local)

  def batch():
    images._multicrop_batch(indices(), rng, source=source, m=m, fixed_size=fixed)

  print(
    f"{args.name}: batch {args.batch_size}, {m.num_global} x {m.global_size} px global + "
    f"{m.num_local} x {m.local_size} px local views, median of {args.batches} batches"
  )
  augment()  # Warm up numpy.
  for label, fn in (
    ("read", lambda: images._read(source, indices())),
    ("augment", augment),
    ("batch (1 core)", batch),
  ):
    wall, cpu = median_ms(fn, args.batches)
    print(f"  {label:22s} {wall:7.1f} ms/batch wall, {cpu:7.1f} ms/batch CPU")
  # Last, so that its prefetching threads do not compete with the timings above.
  dataset = images.multicrop_train_dataset(data, multicrop, batch_size=args.batch_size, seed=0)
  iterator = iter(dataset)
  for _ in range(5):  # Warm up: start the threads, fill the prefetch buffer.
    next(iterator)
  label = f"iterator ({data.num_threads} threads)"
  print(f"  {label:22s} {median_ms(lambda: next(iterator), args.batches)[0]:7.1f} ms/batch wall")


if __name__ == "__main__":
  main()
