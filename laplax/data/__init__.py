"""Input pipelines: :mod:`laplax.data.images` (TFDS + grain) and TFDS builders."""
