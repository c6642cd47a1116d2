"""The processes of a multi-process run watch each other: one that ends hard stops the rest.

A stop that all processes agree on goes through JAX: the training loop calls
:func:`jax.experimental.multihost_utils.reached_preemption_sync_point` at
every step, and a SIGTERM or SIGINT to any process reaches JAX's preemption
notifier (:meth:`laplax.signals.Guard.graceful`), so that every process
saves the same step and exits 0. A process that ends without that (SIGKILL,
a crash, its machine gone) leaves the others blocked in the next collective
until JAX's coordination service misses its heartbeats (100 s by default),
and then they abort with a long C++ log. :class:`Peers` notices it at once:
each process keeps one TCP connection to process 0, whose address JAX's
coordination service already holds (``jax.distributed``'s coordinator) and
whose port it publishes in the service's key-value store. The kernel closes a
process's sockets when it ends, however it ends, so an end of file without
the ``bye`` a process sends when it closes its :class:`Peers` means that
process is gone: process 0 tells the others which one, and each process
stops with one line naming it (:meth:`laplax.signals.Guard.peer_lost`,
exit :data:`laplax.signals.PEER_LOST_EXIT`). A machine that vanishes
without its kernel closing the connection is left to the heartbeats.

A process's end also fails a collective in flight in the others' main
threads (gloo: ``Connection reset by peer``), at about the moment the watch
sees it; so a ``jax.errors.JaxRuntimeError`` inside :func:`watched` first
waits up to :data:`GRACE_S` for the watch to name a process that ended
(whose line then ends this process) before it is raised. When process 0
ends, the coordination service it hosts ends too, and JAX's client may abort
a process with its own C++ log before the watch's line: JAX 0.10.2's
client error callback (``missed_heartbeat_callback``) cannot be a Python
function (calling it throws ``std::bad_cast``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator

_KEY = "laplax/peers/port"
_TIMEOUT_MS = 120_000  # how long the others wait for process 0's port
GRACE_S = 10.0  # how long an error that a process's end causes waits for its line


def _client():
  """JAX's coordination-service client (``jax.distributed.initialize`` made it)."""
  from jax._src import distributed

  return distributed.global_state.client, distributed.global_state.coordinator_address


class Peers:
  """This process's watch over the other processes of the run.

  Args:
    index: this process's index (``jax.process_index()``).
    count: the number of processes (``jax.process_count()``, > 1).
    on_lost: called (from a watcher thread) with a phrase naming the process
      that ended, e.g. ``"process 1 of 2 (pid 4242) ended"``; it should end
      this process (:meth:`laplax.signals.Guard.peer_lost`).
    client, host: the key-value store (``key_value_set``,
      ``blocking_key_value_get``) and process 0's host name; default JAX's
      coordination-service client and the coordinator's host.

  Raises:
    OSError: process 0 cannot listen or another process cannot connect.
  """

  def __init__(
    self,
    index: int,
    count: int,
    on_lost: Callable[[str], None],
    client=None,
    host: str | None = None,
  ):
    self.index, self.count, self._on_lost = int(index), int(count), on_lost
    self._closing = False
    self.lost = threading.Event()  # set once a process is found gone
    self._lock = threading.Lock()
    self._conns: dict[int, socket.socket] = {}
    self._pids: dict[int, int] = {}
    if client is None:
      client, address = _client()
      host = host or address.rsplit(":", 1)[0]
    if self.index == 0:
      self._server = socket.create_server(("", 0))
      client.key_value_set(_KEY, str(self._server.getsockname()[1]))
      for _ in range(self.count - 1):
        conn, _ = self._server.accept()
        k, pid = _read_line(conn).split()
        self._conns[int(k)], self._pids[int(k)] = conn, int(pid)
      for k, conn in self._conns.items():
        threading.Thread(target=self._watch, args=(k, conn), daemon=True).start()
    else:
      port = int(client.blocking_key_value_get(_KEY, _TIMEOUT_MS))
      conn = socket.create_connection((host.strip("[]"), port))
      conn.sendall(f"{self.index} {os.getpid()}\n".encode())
      self._conns[0] = conn
      threading.Thread(target=self._watch, args=(0, conn), daemon=True).start()

  def _watch(self, k: int, conn: socket.socket) -> None:
    """Reads ``conn`` (process ``k``'s connection) until ``bye`` or its end."""
    data = b""
    while True:
      try:
        chunk = conn.recv(256)
      except OSError:
        chunk = b""
      if not chunk:
        break
      data += chunk
      if b"bye\n" in data:
        return  # k closed its Peers: it stops with us
      if b"lost " in data and b"\n" in data.split(b"lost ", 1)[1]:
        self._lost(data.split(b"lost ", 1)[1].split(b"\n", 1)[0].decode())
        return
    if self._closing:
      return
    pid = f" (pid {self._pids[k]})" if k in self._pids else ""
    what = f"process {k} of {self.count}{pid} ended without stopping with the others"
    if self.index == 0:  # tell the others which one, then stop
      with self._lock:
        for other, c in self._conns.items():
          if other != k:
            with contextlib.suppress(OSError):
              c.sendall(f"lost {what}\n".encode())
    self._lost(what)

  def _lost(self, what: str) -> None:
    if not self._closing:
      self.lost.set()
      self._on_lost(what)

  def ended_the_run(self, timeout: float | None = None) -> bool:
    """Whether a process is found gone within ``timeout`` seconds (default
    :data:`GRACE_S`; ``on_lost`` then ends this process): the likely cause
    of a failed collective."""
    return not self._closing and self.lost.wait(GRACE_S if timeout is None else timeout)

  def close(self) -> None:
    """This process stops with the others (the end of training, a stop all
    agreed on, an error every process raises): says ``bye`` and closes."""
    self._closing = True
    with self._lock:
      for conn in self._conns.values():
        with contextlib.suppress(OSError):
          conn.sendall(b"bye\n")
          conn.shutdown(socket.SHUT_WR)
    if self.index == 0:
      self._server.close()


@contextlib.contextmanager
def watched(guard) -> Iterator[Peers | None]:
  """:class:`Peers` for the block when the run has several processes (else
  ``None``): a process that ends meanwhile stops this one
  (``guard.peer_lost``). The block's normal end says ``bye``; an exception
  does not (and stops the watch), so that the others stop too when this
  process ends, and this one ends with its own error."""
  import jax

  if jax.process_count() == 1:
    yield None
    return
  peers = Peers(jax.process_index(), jax.process_count(), guard.peer_lost)
  try:
    yield peers
  except BaseException as e:
    if isinstance(e, jax.errors.JaxRuntimeError) and peers.ended_the_run():
      threading.Event().wait()  # the watcher thread is ending the process with its line
    peers._closing = True  # this process's own error line, not another's
    raise
  peers.close()


def _read_line(conn: socket.socket) -> str:
  data = b""
  while not data.endswith(b"\n"):
    chunk = conn.recv(64)
    if not chunk:
      raise OSError("a process closed its connection before it said who it is")
    data += chunk
  return data.decode().strip()
