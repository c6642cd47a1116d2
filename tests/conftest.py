"""Shared pytest fixtures: a Fashion-MNIST TFDS data_dir prepared once per session."""

import os

import pytest

FMNIST_SOURCE = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="session")
def fmnist_data_dir(tmp_path_factory):
  """A TFDS data_dir holding ``fashion_mnist_idx`` prepared from the real IDX files."""
  if not os.path.exists(os.path.join(FMNIST_SOURCE, "train-images-idx3-ubyte.gz")):
    pytest.skip("Fashion-MNIST missing: apt-get install -y dataset-fashion-mnist")
  from laplax.data import images
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  config = images.default_config()
  config.data_dir = data_dir
  config.source_dir = FMNIST_SOURCE
  images.prepare(config)
  return data_dir
