"""Reading a run's TensorBoard event files."""

import glob
import os
import struct


def _masked_crc(data: bytes) -> int:
  """TFRecord's masked CRC-32C of ``data``."""
  from tensorboardX.crc32c import crc32c

  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(workdir):
  """Every ``(step, Summary.Value)`` of ``workdir/tensorboard/*``, parsed from
  the TFRecord files (length, CRCs checked) with tensorboardX's event proto."""
  from tensorboardX.proto import event_pb2

  out = []
  for path in sorted(glob.glob(os.path.join(str(workdir), "tensorboard", "events.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      header = data[pos : pos + 8]
      (length,), (header_crc,) = (
        struct.unpack("<Q", header),
        struct.unpack("<I", data[pos + 8 : pos + 12]),
      )
      assert header_crc == _masked_crc(header), path
      record = data[pos + 12 : pos + 12 + length]
      (record_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
      assert record_crc == _masked_crc(record), path
      pos += 16 + length
      event = event_pb2.Event()
      event.ParseFromString(record)
      out += [(event.step, v) for v in event.summary.value]
  return out
