"""A real GCS emulator for tests of ``gs://`` workdirs, and a proxy that fails requests.

:func:`start_emulator` starts PyPI's ``gcp-storage-emulator`` (the GCS JSON
API, in memory) on ``127.0.0.1`` at a free port and returns a
:class:`Emulator`: its ``env`` (the variables that point gcsfs, tensorstore
and google-cloud-storage at it) and its ``bucket``. Use it as a context
manager, or through the pytest fixture ``gcs`` (tests/conftest.py), e.g. for
several processes (a test module imports ``gcs_fixture`` to use ``gcs``)::

    with start_emulator() as emu:
        subprocess.run([...], env={**os.environ, **emu.env})
        workdir = f"gs://{emu.bucket}/run"

:class:`FaultProxy` sits between the clients and the emulator and answers
chosen requests itself (503, 429, 403), as a failing GCS does.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import pytest


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def emulator_env(url: str) -> dict[str, str]:
  """The variables that send gcsfs (``STORAGE_EMULATOR_HOST``), tensorstore
  (``TENSORSTORE_GCS_HTTP_URL``) and google-cloud-storage to ``url``; gcsfs's
  zonal-bucket probe (60 s of gRPC against an emulator) is switched off."""
  return {
    "STORAGE_EMULATOR_HOST": url,
    "TENSORSTORE_GCS_HTTP_URL": url,
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    "GOOGLE_CLOUD_PROJECT": "laplax-test",
  }


@dataclass
class Emulator:
  """A running emulator: ``url`` (the emulator itself), ``bucket`` (created
  empty), ``proxy`` (the :class:`FaultProxy` the clients talk to) and ``env``
  (:func:`emulator_env` of the proxy)."""

  url: str
  bucket: str
  process: subprocess.Popen
  proxy: FaultProxy
  env: dict = field(default_factory=dict)

  def stop(self) -> None:
    """Stops the proxy and the emulator process (its data is in memory: gone)."""
    self.proxy.close()
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()

  def __enter__(self) -> Emulator:
    return self

  def __exit__(self, *exc) -> None:
    self.stop()


def start_emulator(bucket: str = "laplax-test", timeout: float = 60.0) -> Emulator:
  """Starts ``gcp-storage-emulator`` on 127.0.0.1 at a free port with an empty ``bucket``.

  Returns once the bucket answers. Raises RuntimeError if it does not within
  ``timeout`` seconds (the emulator's output is in the message).
  """
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  cmd = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host=127.0.0.1"]
  cmd += [f"--port={port}", "--in-memory", f"--default-bucket={bucket}"]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.monotonic() + timeout
  while True:
    try:
      with urllib.request.urlopen(f"{url}/storage/v1/b/{bucket}", timeout=2) as r:
        if r.status == 200:
          break
    except OSError:
      pass
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      raise RuntimeError(f"the GCS emulator did not start: {proc.stdout.read().decode()[-2000:]}")
    time.sleep(0.1)
  proc.stdout.close()  # its request log is not read: nothing may block on a full pipe
  proxy = FaultProxy(url)
  return Emulator(url=url, bucket=bucket, process=proc, proxy=proxy, env=emulator_env(proxy.url))


class FaultProxy:
  """An HTTP proxy to ``upstream`` that answers requests itself when told to.

  :meth:`fail` queues ``(status, count, match)``: the next ``count`` requests
  whose ``METHOD PATH?QUERY`` contains ``match`` get ``status`` with a GCS
  error body, without reaching the emulator. Every request line seen is in
  :attr:`seen`, every failed one in :attr:`failed`. Use :attr:`url` in
  :func:`emulator_env`.
  """

  def __init__(self, upstream: str):
    self.upstream = upstream.split("://", 1)[1]
    self.seen: list[str] = []
    self.failed: list[tuple[int, str]] = []
    self._faults: list[list] = []
    self._lock = threading.Lock()
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):
        pass

      def handle_one_request(self):
        with contextlib.suppress(ConnectionError):  # a client that hung up
          super().handle_one_request()

      def _handle(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        line = f"{self.command} {self.path}"
        status = proxy._take(line)
        if status is not None:
          payload = f'{{"error": {{"code": {status}, "message": "injected {status}"}}}}'.encode()
          self.send_response(status)
          self.send_header("Content-Type", "application/json")
          self.send_header("Content-Length", str(len(payload)))
          self.end_headers()
          self.wfile.write(payload)
          return
        conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        conn.request(self.command, self.path, body=body or None, headers=headers)
        r = conn.getresponse()
        data = r.read()
        headers = r.getheaders()
        if self.command == "GET" and r.status in (200, 206) and "alt=media" in self.path:
          headers += proxy._generation_headers(conn, self.path, headers)
        self.send_response(r.status)
        for k, v in headers:
          if k.lower() not in ("transfer-encoding", "content-length", "connection"):
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        conn.close()

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    self.server.daemon_threads = True
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
    self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
    self._thread.start()

  def _generation_headers(self, conn, path: str, headers: list) -> list:
    """``x-goog-generation`` of a download, which GCS sends and tensorstore reads
    (it checks the generation of what it read) but gcp-storage-emulator
    2026.7.19 leaves out: taken from the object's metadata."""
    if any(k.lower() == "x-goog-generation" for k, _ in headers):
      return []
    meta_path = path.replace("/download/storage/", "/storage/").replace("alt=media", "")
    conn.request("GET", meta_path)
    r = conn.getresponse()
    meta = r.read()
    if r.status != 200:
      return []
    info = json.loads(meta)
    return [
      ("x-goog-generation", str(info["generation"])),
      ("x-goog-metageneration", str(info.get("metageneration", 1))),
    ]

  def fail(self, status: int, count: int = 1, match: str = "") -> None:
    """Answers the next ``count`` requests containing ``match`` with ``status``."""
    with self._lock:
      self._faults.append([status, count, match])

  def clear(self) -> None:
    """Drops the faults still queued."""
    with self._lock:
      self._faults.clear()

  def _take(self, line: str) -> int | None:
    with self._lock:
      self.seen.append(line)
      for fault in self._faults:
        status, count, match = fault
        if count > 0 and match in line:
          fault[1] -= 1
          self.failed.append((status, line))
          return status
    return None

  def close(self) -> None:
    """Stops the proxy."""
    with contextlib.suppress(Exception):
      self.server.shutdown()
      self.server.server_close()


def objects(emulator_url: str, bucket: str, prefix: str = "") -> list[str]:
  """The names of the objects under ``prefix`` in ``bucket`` (straight from the emulator)."""
  import urllib.parse

  names, token = [], None
  while True:
    query = {"prefix": prefix, **({"pageToken": token} if token else {})}
    url = f"{emulator_url}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as r:
      page = json.loads(r.read())
    names += [o["name"] for o in page.get("items", [])]
    token = page.get("nextPageToken")
    if not token:
      return names


def environ_with(env: dict) -> dict:
  """``os.environ`` with ``env`` added (for subprocesses)."""
  return {**os.environ, **env}


@pytest.fixture(scope="module", name="gcs")
def gcs_fixture():
  """``gcs``: an :class:`Emulator` for the test module, its ``env`` set in this
  process (and so in the subprocesses it starts) while the module runs."""
  with start_emulator() as emu, pytest.MonkeyPatch.context() as mp:
    for k, v in emu.env.items():
      mp.setenv(k, v)
    yield emu
