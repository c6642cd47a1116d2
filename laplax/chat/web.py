"""The chat page and its JSON API (nanochat's ``scripts/chat_web.py``), FastAPI on uvicorn.

``GET /`` is one HTML page (the conversation, the answer streamed as it is
decoded, a Stop button, New chat). ``POST /chat/completions`` takes
nanochat's request ``{"messages": [{"role": "user" | "assistant", "content":
str}, ...], "temperature": float?, "top_k": int?, "max_tokens": int?}`` (and
``"seed": int?``) and answers with server-sent events, one ``data: {"token":
TEXT}`` per decoded piece of text and ``data: {"done": true}`` at the end (``data: {"error": LINE}``
if decoding fails). ``GET /health`` says the mode and the queue.

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
import dataclasses
import errno
import json
import random
import socket
import sys
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from laplax import utils
from laplax.chat.engine import ChatEngine, ChatError
from laplax.errors import UserError


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
  where = ".".join(str(x) for x in err.get("loc", ())) or "body"
  return f"{where}: {err.get('msg', 'invalid')}"


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


def make_app(engine: ChatEngine, limits: Limits = Limits(), defaults: Any = None) -> FastAPI:
  """The FastAPI app serving ``engine`` (see the module docstring).

  ``defaults`` has ``temperature``, ``top_k``, ``max_tokens`` and
  ``no_calculator`` (the command line's; default 0.6, 50, 256, False).
  """
  temperature = getattr(defaults, "temperature", 0.6)
  top_k = getattr(defaults, "top_k", 50)
  max_tokens = min(getattr(defaults, "max_tokens", 256), limits.max_tokens)
  calculator = not getattr(defaults, "no_calculator", False)
  app = FastAPI(title="laplax chat", docs_url=None, redoc_url=None, openapi_url=None)
  lock = asyncio.Lock()
  worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="laplax-chat")
  queue = {"waiting": 0, "served": 0}
  app.state.engine, app.state.queue, app.state.worker = engine, queue, worker

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
    size = int(request.headers.get("content-length") or 0)
    if size > limits.max_body_bytes:
      return _error(413, f"the body is {size} bytes; at most {limits.max_body_bytes}")
    raw = bytearray()
    async for chunk in request.stream():
      raw += chunk
      if len(raw) > limits.max_body_bytes:
        return _error(413, f"the body is over {limits.max_body_bytes} bytes")
    try:
      body = ChatRequest.model_validate(json.loads(raw))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      return _error(400, f"the body is not JSON: {utils.first_line(e)}")
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

    async def events():
      try:
        async with lock:
          if ticket["waiting"]:
            ticket["waiting"] = False
            queue["waiting"] -= 1
          while True:
            if await request.is_disconnected():
              break
            piece = await loop.run_in_executor(worker, next, pieces, None)
            if piece is None:
              yield _event({"done": True})
              break
            yield _event({"token": piece})
          queue["served"] += 1
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


def serve(
  engine: ChatEngine,
  host: str = "127.0.0.1",
  port: int = 8000,
  defaults: Any = None,
  limits: Limits = Limits(),
  sock: socket.socket | None = None,
) -> None:
  """Serves :func:`make_app` with uvicorn on ``sock`` (default
  ``bind(host, port)``) until Ctrl-C (or SIGTERM), which stops it cleanly
  (answers in flight end, the port is released; uvicorn then raises the
  signal again: Ctrl-C reaches the caller as KeyboardInterrupt).

  Raises:
    ServeError: the address cannot be bound.
  """
  sock = sock or bind(host, port)
  host = sock.getsockname()[0]
  app = make_app(engine, limits, defaults)
  config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
  server = uvicorn.Server(config)
  bound = sock.getsockname()[1]
  shown = f"[{host}]" if ":" in host else host
  print(
    f"laplax-chat: open http://{shown}:{bound} (API: POST /chat/completions); Ctrl-C stops",
    file=sys.stderr,
    flush=True,
  )
  try:
    server.run(sockets=[sock])
  finally:
    app.state.worker.shutdown(wait=True, cancel_futures=True)
    sock.close()


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
    let buffer = "";
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
      }
    }
    out.dataset.state = "done";
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
