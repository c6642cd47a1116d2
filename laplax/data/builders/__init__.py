"""TFDS builders; importing this package registers them with TFDS."""

from laplax.data.builders.fashion_mnist_idx import FashionMnistIdx
from laplax.data.builders.fashion_mosaic import FashionMosaic
from laplax.data.builders.text_corpus import TextCorpus

__all__ = ["FashionMnistIdx", "FashionMosaic", "TextCorpus"]
