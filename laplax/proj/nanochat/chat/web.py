"""The chat page and its JSON API (nanochat's ``scripts/chat_web.py``), FastAPI on uvicorn.

``GET /`` is one HTML page (the conversation, the answer streamed as it is
decoded, a Stop button, New chat). ``POST /chat/completions`` takes
nanochat's request ``{"messages": [{"role": "user" | "assistant", "content":
str}, ...], "temperature": float?, "top_k": int?, "max_tokens": int?}`` (and
``"seed": int?``) and answers with server-sent events, one ``data: {"token":
TEXT}`` per decoded piece of text and ``data: {"done": true}`` at the end (``data: {"error": LINE}``
if decoding fails, ``data: {"stopped": LINE}`` if the server shuts down). ``GET /health`` says
the mode and the queue. Every request passes :class:`laplax.proj.nanochat.chat.guard.Guard` first (its
``Host``, the page's ``Origin``, a token when set: a 403 otherwise); a post must be
``Content-Type: application/json`` (a 415 otherwise), its body parsed within bounds
(:mod:`laplax.proj.nanochat.chat.body`).

Bounds (:class:`Limits`): the request body, the number and length of the
messages, the tokens of an answer (and the model's context), the number of
requests waiting. One answer is decoded at a time: requests queue on an
``asyncio.Lock`` and decode on one worker thread; a client that goes away
(the page's Stop) ends its answer at the next token. Every bad request gets a
4xx response ``{"error": ONE LINE}``, never a traceback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import errno
import json
import random
import signal
import socket
import sys
import threading
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import ClientDisconnect

from laplax import utils
from laplax.errors import UserError
from laplax.proj.nanochat.chat import body as body_lib
from laplax.proj.nanochat.chat.engine import ChatEngine, ChatError
from laplax.proj.nanochat.chat.guard import Access, Guard, is_loopback, new_token


class ServeError(UserError, OSError):
  """The server cannot start (its address is taken); one line."""


# The seeds jax.random.PRNGKey tells apart without x64 (larger ones wrap or overflow).
MAX_SEED = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask (nanochat's abuse limits, and a queue bound)."""

  max_body_bytes: int = 256 * 1024
  max_messages: int = 500
  max_message_chars: int = 8000
  max_total_chars: int = 32000
  max_tokens: int = 4096  # and never past the model's context
  max_waiting: int = 16  # requests queued behind the one decoding


class Message(BaseModel):
  """One message of nanochat's request."""

  model_config = ConfigDict(extra="forbid")
  role: Literal["system", "user", "assistant"]
  content: str


class ChatRequest(BaseModel):
  """nanochat's ``/chat/completions`` request body."""

  model_config = ConfigDict(extra="forbid")
  messages: list[Message]
  temperature: float | None = None
  top_k: int | None = None
  max_tokens: int | None = None
  seed: int | None = None


def _error(status: int, message: str) -> JSONResponse:
  return JSONResponse({"error": message}, status_code=status)


def _validation_line(e: ValidationError) -> str:
  err = e.errors()[0]
  where = ".".join(str(x)[:40] for x in err.get("loc", ())) or "body"  # keys come from the input
  return f"{where[:120]}: {err.get('msg', 'invalid')}"


def _declared_size(request: Request) -> int:
  """The body's ``Content-Length`` (0 when absent; -1 when it is not a small number)."""
  value = request.headers.get("content-length") or "0"
  return int(value) if value.isdigit() and len(value) <= 15 else -1


def _is_json(request: Request) -> bool:
  media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
  return media == "application/json"


async def _read_body(request: Request, limit: int) -> bytes | JSONResponse | None:
  """The body (at most ``limit`` bytes), a 4xx response, or ``None`` when the
  client left before sending all of it (nothing to answer, nothing logged)."""
  size = _declared_size(request)
  if size < 0:
    return _error(400, "the Content-Length header is not a number of bytes")
  if size > limit:
    return _error(413, f"the body is {size} bytes; at most {limit}")
  raw = bytearray()
  try:
    async for chunk in request.stream():
      raw += chunk
      if len(raw) > limit:
        return _error(413, f"the body is over {limit} bytes")
  except ClientDisconnect:
    return None
  return bytes(raw)


def check_request(body: ChatRequest, limits: Limits) -> str | None:
  """The first bound the request breaks (one line), or ``None``."""
  n = len(body.messages)
  if n == 0:
    return "messages: at least one message is required"
  if n > limits.max_messages:
    return f"messages: {n} messages; at most {limits.max_messages} per request"
  total = 0
  for i, m in enumerate(body.messages):
    if not m.content:
      return f"messages.{i}: empty content"
    if len(m.content) > limits.max_message_chars:
      return f"messages.{i}: {len(m.content)} characters; at most {limits.max_message_chars}"
    total += len(m.content)
  if total > limits.max_total_chars:
    return f"messages: {total} characters in all; at most {limits.max_total_chars}"
  if body.messages[-1].role != "user":
    return "messages: the last message must be the user's (the one to answer)"
  if body.temperature is not None and not 0.0 <= body.temperature <= 2.0:
    return f"temperature={body.temperature} must be in [0, 2]"
  if body.top_k is not None and not 0 <= body.top_k <= 200:
    return f"top_k={body.top_k} must be in [0, 200] (0 = all tokens)"
  if body.max_tokens is not None and not 1 <= body.max_tokens <= limits.max_tokens:
    return f"max_tokens={body.max_tokens} must be in [1, {limits.max_tokens}]"
  if body.seed is not None and not 0 <= body.seed <= MAX_SEED:
    return f"seed={body.seed} must be in [0, {MAX_SEED}]"
  return None


STOPPED = "the server is shutting down"  # the final event of an answer cut by Ctrl-C


class _Stopping:
  """Set once, when the server shuts down; awaitable from any event loop
  (an ``asyncio.Event`` belongs to the first loop that waits on it)."""

  def __init__(self):
    self.is_set, self._waiters = False, set()

  def set(self) -> None:
    """Wakes every waiter; call it on the serving loop."""
    self.is_set = True
    for waiter in self._waiters:
      if not waiter.done():
        waiter.set_result(None)

  async def wait(self) -> None:
    """Returns once :meth:`set` was called."""
    if self.is_set:
      return
    waiter = asyncio.get_running_loop().create_future()
    self._waiters.add(waiter)
    try:
      await waiter
    finally:
      self._waiters.discard(waiter)


async def _before_stop(future: asyncio.Future, stopping: _Stopping) -> bool:
  """Waits for ``future`` or ``stopping``; whether ``future`` is done."""
  if not future.done() and not stopping.is_set:
    stop = asyncio.ensure_future(stopping.wait())
    try:
      await asyncio.wait({future, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
      stop.cancel()
  return future.done()


async def _acquire(lock: asyncio.Lock, stopping: _Stopping) -> bool:
  """Takes ``lock`` unless the server stops first; whether it was taken."""
  task = asyncio.ensure_future(lock.acquire())
  taken = False
  try:
    taken = await _before_stop(task, stopping)
    return taken
  finally:
    if not task.done():
      task.cancel()
    elif not taken and not task.cancelled():
      lock.release()


def make_app(
  engine: ChatEngine, limits: Limits = Limits(), defaults: Any = None, access: Access = Access()
) -> FastAPI:
  """The FastAPI app serving ``engine`` (see the module docstring), behind
  :class:`laplax.proj.nanochat.chat.guard.Guard` with ``access`` (default: loopback names
  and the page's own origin, no token).

  ``defaults`` has ``temperature``, ``top_k``, ``max_tokens`` and
  ``no_calculator`` (the command line's; default 0.6, 50, 256, False).
  ``app.state.stopping.set()`` (:class:`ChatServer` does it when it shuts
  down) ends every answer at once with ``data: {"stopped": LINE}``.
  """
  temperature = getattr(defaults, "temperature", 0.6)
  top_k = getattr(defaults, "top_k", 50)
  max_tokens = min(getattr(defaults, "max_tokens", 256), limits.max_tokens)
  calculator = not getattr(defaults, "no_calculator", False)
  app = FastAPI(title="laplax chat", docs_url=None, redoc_url=None, openapi_url=None)
  app.add_middleware(Guard, access=access)
  lock = asyncio.Lock()
  worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="laplax-chat")
  queue = {"waiting": 0, "served": 0}
  stopping = _Stopping()
  app.state.engine, app.state.queue, app.state.worker = engine, queue, worker
  app.state.stopping = stopping

  @app.get("/", response_class=HTMLResponse)
  async def page() -> HTMLResponse:
    return HTMLResponse(PAGE.replace("__MODE__", json.dumps(engine.mode_line)))

  @app.get("/health")
  async def health() -> dict:
    return {
      "status": "ok",
      "mode": "chat" if engine.chat else "completion",
      "context": engine.context,
      "waiting": queue["waiting"],
      "busy": lock.locked(),
      "served": queue["served"],
    }

  @app.post("/chat/completions")
  async def completions(request: Request):
    if not _is_json(request):
      return _error(415, "the body must be JSON, sent as Content-Type: application/json")
    raw = await _read_body(request, limits.max_body_bytes)
    if raw is None or isinstance(raw, JSONResponse):
      return raw or Response(status_code=400)  # a client gone mid-body reads no answer
    try:
      body = ChatRequest.model_validate(body_lib.parse(raw))
    except body_lib.BodyError as e:
      return _error(400, str(e))
    except ValidationError as e:
      return _error(422, _validation_line(e))
    problem = check_request(body, limits)
    if problem:
      return _error(400, problem)
    try:
      prompt = engine.prompt([m.model_dump() for m in body.messages])
    except ChatError as e:
      return _error(400, utils.first_line(e))
    if queue["waiting"] >= limits.max_waiting:
      return _error(503, f"busy: {queue['waiting']} requests are waiting; try again soon")
    temp = temperature if body.temperature is None else body.temperature
    seed = body.seed if body.seed is not None else (0 if temp == 0 else random.getrandbits(31))
    tokens = engine.tokens(
      prompt,
      max_tokens=min(max_tokens if body.max_tokens is None else body.max_tokens, engine.context),
      temperature=temp,
      top_k=(top_k if body.top_k is None else body.top_k) or None,
      seed=seed,
      calculator=calculator,
    )
    pieces = engine.texts(tokens)
    queue["waiting"] += 1
    loop = asyncio.get_running_loop()
    ticket = {"waiting": True, "closed": False}

    def release():  # once, however the request ends (also before its stream began)
      if ticket["waiting"]:
        ticket["waiting"] = False
        queue["waiting"] -= 1
      if not ticket["closed"]:
        ticket["closed"] = True
        worker.submit(pieces.close)  # after the token in flight, on the decoding thread

    async def next_event() -> tuple[dict, bool]:
      """The next event and whether it is the last. A shutdown ends the
      answer at once (the step in flight finishes on the worker, which
      :func:`serve` waits for)."""
      if stopping.is_set:
        return {"stopped": STOPPED}, True
      step = loop.run_in_executor(worker, next, pieces, None)
      step.add_done_callback(lambda f: f.cancelled() or f.exception())  # read, even if left
      if not await _before_stop(step, stopping):
        return {"stopped": STOPPED}, True
      piece = step.result()
      return ({"done": True}, True) if piece is None else ({"token": piece}, False)

    async def events():
      try:
        if not await _acquire(lock, stopping):
          yield _event({"stopped": STOPPED})
          return
        try:
          if ticket["waiting"]:
            ticket["waiting"] = False
            queue["waiting"] -= 1
          while not await request.is_disconnected():
            event, last = await next_event()
            yield _event(event)
            if last:
              break
          queue["served"] += 1
        finally:
          lock.release()
      except Exception as e:  # decoding failed: one line to the client, the server goes on
        yield _event({"error": utils.first_line(e)})
      finally:
        release()

    return _Answer(events(), release)

  return app


class _Answer(StreamingResponse):
  """The answer's event stream; ``release`` runs however it ends. A client
  that goes away before the stream begins cancels it before ``events()``
  runs at all (its ``finally`` never would): this ``__call__`` closes the
  generator and releases the request's place in the queue."""

  def __init__(self, content, release):
    super().__init__(content, media_type="text/event-stream")
    self._release = release

  async def __call__(self, scope, receive, send):
    try:
      await super().__call__(scope, receive, send)
    finally:
      try:
        await self.body_iterator.aclose()  # leaves the lock if it stopped at a yield
      except RuntimeError:  # still running elsewhere: its own finally releases
        pass
      self._release()


def _event(data: dict) -> str:
  return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def bind(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
  """A socket listening on ``host:port`` (0: a free port); uvicorn serves it
  later (a connection made before waits in the backlog). Listening at once
  holds the port: a second server fails here, not after its model loads.

  Raises:
    ServeError: the address cannot be bound (taken, or not this machine's).
  """
  try:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
  except (OSError, UnicodeError) as e:
    raise ServeError(
      f"cannot listen on {host}:{port} ({utils.first_line(e)}); check --host"
    ) from None
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
    sock.listen(128)
  except OSError as e:
    sock.close()
    fix = "pick another --port" if e.errno == errno.EADDRINUSE else "check --host and --port"
    raise ServeError(f"cannot listen on {host}:{port} ({e.strerror}); {fix}") from None
  return sock


GRACE_S = 2.0  # uvicorn's graceful shutdown: time to send every stream's final event


class ChatServer(uvicorn.Server):
  """uvicorn's server for a :func:`make_app` app. Its shutdown first sets the
  app's ``stopping`` (every answer ends at once with its final event), then
  does uvicorn's (the connections close within ``grace_s``). The SIGINT or
  SIGTERM that stopped it is kept in ``signals``, not raised again inside
  the event loop as uvicorn does (:func:`serve` raises it after the loop).
  """

  def __init__(self, app: FastAPI, grace_s: float = GRACE_S):
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=grace_s)
    super().__init__(config)
    self.stopping, self.signals = app.state.stopping, []

  async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
    """Ends every answer (the app's ``stopping``), then uvicorn's shutdown."""
    self.stopping.set()
    await super().shutdown(sockets)

  def handle_exit(self, sig: int, frame: Any) -> None:
    """uvicorn's signal handler; the signal is kept in ``signals``."""
    self.signals.append(sig)
    super().handle_exit(sig, frame)

  @contextlib.contextmanager
  def capture_signals(self):
    """uvicorn's, without raising the signals again at the end."""
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    original = {
      sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
      yield
    finally:
      for sig, handler in original.items():
        signal.signal(sig, handler)


def serve(
  engine: ChatEngine,
  host: str = "127.0.0.1",
  port: int = 8000,
  defaults: Any = None,
  limits: Limits = Limits(),
  sock: socket.socket | None = None,
  access: Access = Access(),
) -> None:
  """Serves :func:`make_app` with uvicorn on ``sock`` (default
  ``bind(host, port)``) until Ctrl-C (or SIGTERM), which stops it cleanly:
  every answer in flight ends at once with ``data: {"stopped": LINE}``, the
  decoding step in flight finishes, the port is released, and Ctrl-C then
  reaches the caller as KeyboardInterrupt (SIGTERM is raised again).

  ``access`` (:class:`laplax.proj.nanochat.chat.guard.Access`) says who may use it; a bind
  to an address that is not loopback without a token gets a new one. The
  URL printed at start carries it (``?token=``).

  Raises:
    ServeError: the address cannot be bound.
  """
  sock = sock or bind(host, port)
  host = sock.getsockname()[0]
  if access.token is None and not is_loopback(host):
    access = dataclasses.replace(access, token=new_token())
  app = make_app(engine, limits, defaults, access)
  server = ChatServer(app)
  bound = sock.getsockname()[1]
  shown = f"[{host}]" if ":" in host else host
  query = f"/?token={access.token}" if access.token else ""
  print(
    f"laplax-chat: open http://{shown}:{bound}{query} (API: POST /chat/completions); Ctrl-C stops",
    file=sys.stderr,
    flush=True,
  )
  try:
    server.run(sockets=[sock])
  finally:
    app.state.worker.shutdown(wait=True, cancel_futures=True)
    sock.close()
  if signal.SIGINT in server.signals:
    raise KeyboardInterrupt
  for sig in server.signals:
    signal.raise_signal(sig)


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>laplax chat</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 0; background: #f6f6f4; color: #222; }
  header { display: flex; align-items: center; gap: 1em; padding: .6em 1em;
           background: #fff; border-bottom: 1px solid #ddd; }
  header h1 { font-size: 1.1em; margin: 0; }
  #mode { color: #666; font-size: .85em; flex: 1; }
  main { max-width: 46em; margin: 0 auto; padding: 1em 1em 8em; }
  .message { white-space: pre-wrap; padding: .6em .9em; margin: .6em 0; border-radius: .6em; }
  .user { background: #dbe8ff; margin-left: 20%; }
  .assistant { background: #fff; border: 1px solid #e2e2e2; margin-right: 10%; }
  .error { background: #ffe3e0; }
  form { position: fixed; bottom: 0; left: 0; right: 0; display: flex; gap: .5em;
         padding: .8em; background: #fff; border-top: 1px solid #ddd; }
  textarea { flex: 1; font: inherit; padding: .5em; resize: none; height: 3em; }
  button { font: inherit; padding: 0 1.2em; }
</style>
</head>
<body>
<header><h1>laplax chat</h1><span id="mode"></span>
<button id="new-chat" type="button">New chat</button></header>
<main id="messages"></main>
<form id="form">
  <textarea id="input" placeholder="Message (Enter sends, Shift+Enter a new line)"></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" hidden>Stop</button>
</form>
<script>
const MODE = __MODE__;
document.getElementById("mode").textContent = MODE;
const list = document.getElementById("messages"), input = document.getElementById("input");
const send = document.getElementById("send"), stop = document.getElementById("stop");
let messages = [], controller = null;

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "message " + role;
  div.textContent = text;
  list.appendChild(div);
  window.scrollTo(0, document.body.scrollHeight);
  return div;
}

function busy(on) { send.hidden = on; stop.hidden = !on; input.disabled = on; }

async function ask(text) {
  messages.push({role: "user", content: text});
  bubble("user", text);
  const out = bubble("assistant", "");
  out.dataset.state = "streaming";
  controller = new AbortController();
  busy(true);
  let answer = "";
  try {
    const response = await fetch("/chat/completions", {
      method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({messages}), signal: controller.signal});
    if (!response.ok) {
      const body = await response.json().catch(() => ({error: response.statusText}));
      throw new Error(body.error || response.statusText);
    }
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "", stopped = null;
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\\n\\n")) >= 0) {
        const line = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ")) continue;
        const event = JSON.parse(line.slice(6));
        if (event.token) { answer += event.token; out.textContent = answer; }
        if (event.error) throw new Error(event.error);
        if (event.stopped) stopped = event.stopped;
      }
    }
    out.dataset.state = stopped ? "stopped" : "done";
    if (stopped) out.textContent = answer + "\\n[" + stopped + "]";
  } catch (e) {
    if (e.name === "AbortError") { out.dataset.state = "stopped"; }
    else { out.dataset.state = "error"; out.classList.add("error"); out.textContent = answer + "\\n[" + e.message + "]"; }
  }
  messages.push({role: "assistant", content: answer || "..."});
  controller = null;
  busy(false);
  input.focus();
}

document.getElementById("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = "";
  ask(text);
});
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); document.getElementById("form").requestSubmit(); }
});
stop.addEventListener("click", () => { if (controller) controller.abort(); });
document.getElementById("new-chat").addEventListener("click", () => {
  if (controller) controller.abort();
  messages = []; list.replaceChildren(); input.focus();
});
input.focus();
</script>
</body>
</html>
"""
