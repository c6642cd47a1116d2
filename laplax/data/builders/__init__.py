"""TFDS builders; importing this package registers them with TFDS."""

from laplax.data.builders.fashion_mnist_idx import FashionMnistIdx

__all__ = ["FashionMnistIdx"]
