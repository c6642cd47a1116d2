"""Input pipelines, by modality.

* :mod:`laplax.data.vision`: image classification (TFDS array_record -> grain),
  augmentation, DINO multi-crop views, segmentation masks (ADE20K, the
  Fashion-MNIST canvases).
* :mod:`laplax.data.text`: language-model corpora (a TFDS text corpus,
  FineWeb-Edu's parquet shards) and their tokenizers.
* :mod:`laplax.data.lra`: Long Range Arena (ListOps, Text, Retrieval, Image,
  Pathfinder).
* :mod:`laplax.data.builders`: the TFDS builders (Fashion-MNIST from IDX files,
  Fashion-Mosaic, text corpora).
* :mod:`laplax.data.lm_input`: a language-model config's input, picked by
  ``config.data.name``; :mod:`laplax.data.common`: what the pipelines share;
  :mod:`laplax.data.errors`: :class:`~laplax.data.errors.DataError`.

nanochat's chat mixtures are the project's (:mod:`laplax.proj.nanochat.data`).
"""
