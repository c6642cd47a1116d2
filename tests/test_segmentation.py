"""laplax.analysis.segmentation: mIoU by closed form, the linear probe on
constructed patch features (separable: 1.0; constant: the background-only
score), and the Fashion-MNIST canvases (labels, determinism under the seed)."""

import numpy as np
import pytest

from laplax.analysis import segmentation as seg


def test_confusion_and_miou_closed_form():
  target = np.array([[0, 0, 1], [1, 2, -1]])
  predicted = np.array([[0, 1, 1], [1, 1, 0]])
  m = seg.confusion(predicted, target, 4)
  np.testing.assert_array_equal(m[:3, :3], [[1, 1, 0], [0, 2, 0], [0, 1, 0]])
  r = seg.miou(m)
  # IoU: class 0 1/2, class 1 2/4, class 2 0/1, class 3 empty (left out).
  assert r["iou"] == [0.5, 0.5, 0.0, None]
  assert r["miou"] == pytest.approx(1 / 3) and r["pixel_accuracy"] == pytest.approx(3 / 5)
  with pytest.raises(ValueError, match=r"\[0, 4\)"):
    seg.confusion(np.full((2, 3), 4), target, 4)


def test_separable_patches_give_miou_1():
  """One-hot patch features, pixel labels constant on each patch. Bilinear
  upsampling blends a pixel's logits with its neighbour patches' (at a
  corner the own patch weighs (4/7)^2 = 0.33 against 0.67 for the other
  three), so a pixel whose neighbours share a class may take it however good
  the features are; here every 3x3 block of patches holds distinct classes."""
  rng = np.random.default_rng(0)
  rows, cols = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
  pattern = (rows % 3) * 3 + (cols % 3)
  classes = np.stack([rng.permutation(11)[pattern] for _ in range(48)])
  masks = np.repeat(np.repeat(classes, 7, 1), 7, 2).astype(np.int32)
  feats = np.eye(11, dtype=np.float32)[classes] + 0.01 * rng.normal(size=classes.shape + (11,))
  r = seg.linear_segmentation_probe(feats[:32], masks[:32], feats[32:], masks[32:],
                                    num_classes=11, steps=300, lr=0.2, batch_size=16)
  assert r["miou"] == 1.0 and r["pixel_accuracy"] == 1.0
  assert r["predictions"].shape == (16, 28, 28)


def test_constant_features_give_the_background_only_score():
  rng = np.random.default_rng(1)
  masks = np.zeros((24, 28, 28), np.int32)
  for m in masks:  # garments 1..10 on a background of about 80% of the pixels
    for c in rng.integers(1, 11, size=3):
      top, left = rng.integers(0, 22, size=2)
      m[top:top + 6, left:left + 6] = c
  feats = np.ones((24, 4, 4, 8), np.float32)
  r = seg.linear_segmentation_probe(feats[:16], masks[:16], feats[16:], masks[16:],
                                    num_classes=11, steps=200, batch_size=8)
  test = masks[16:]
  background = float((test == 0).mean())
  present = len(np.unique(np.concatenate([test.ravel(), [0]])))
  assert (r["predictions"] == 0).all()
  assert r["iou"][0] == pytest.approx(background)
  assert r["miou"] == pytest.approx(background / present)


def test_fashion_canvases_labels_and_determinism():
  rng = np.random.default_rng(2)
  images = rng.integers(0, 256, size=(20, 28, 28)).astype(np.uint8)
  images[images < 128] = 0  # a background the threshold removes
  labels = rng.integers(0, 10, size=20)
  a = seg.fashion_canvases(images, labels, 6, canvas_size=56, seed=3)
  b = seg.fashion_canvases(images, labels, 6, canvas_size=56, seed=3)
  c = seg.fashion_canvases(images, labels, 6, canvas_size=56, seed=4)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[1], c[1])
  canvases, masks = a
  assert canvases.shape == (6, 56, 56, 1) and canvases.dtype == np.uint8
  assert masks.shape == (6, 56, 56) and 0 <= masks.min() and masks.max() <= 10
  np.testing.assert_array_equal(masks > 0, canvases[..., 0] > seg.GARMENT_THRESHOLD)
  # One garment per canvas: the canvas is that garment at some offset.
  one, one_mask = seg.fashion_canvases(images, labels, 4, min_items=1, max_items=1, seed=5)
  for canvas, mask in zip(one[..., 0], one_mask):
    found = [(i, t, l) for i in range(20) for t in range(29) for l in range(29)
             if np.array_equal(np.where(images[i] > seg.GARMENT_THRESHOLD, images[i], 0),
                               canvas[t:t + 28, l:l + 28]) and canvas.sum() == images[i][
                                   images[i] > seg.GARMENT_THRESHOLD].sum()]
    assert found, "the canvas is not one pasted garment"
    i, t, l = found[0]
    on = images[i] > seg.GARMENT_THRESHOLD
    np.testing.assert_array_equal(mask[t:t + 28, l:l + 28], np.where(on, labels[i] + 1, 0))
    assert mask.sum() == on.sum() * (labels[i] + 1)
