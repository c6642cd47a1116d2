"""Input pipelines: :mod:`laplax.data.vision.images` (TFDS + grain) and TFDS builders."""
