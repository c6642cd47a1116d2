"""laplax.proj.nanochat.chat: the terminal conversation (through a pseudo-terminal), the
JSON API (a real uvicorn server on a loopback port), the page in Chromium,
on tiny GPT workdirs trained here (a base model and its SFT); answers are
checked against eval.py --sample's greedy decoding (laplax.models.sampling)."""

import argparse
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import jax
import numpy as np
import pytest

pytest.importorskip("pyarrow")

from laplax.models import sampling  # noqa: E402
from laplax.proj.nanochat.chat import cli as chat_cli  # noqa: E402
from laplax.proj.nanochat.chat import web  # noqa: E402
from laplax.proj.nanochat.chat.engine import ChatEngine  # noqa: E402
from laplax.proj.nanochat.data import fixtures as chat_fixtures  # noqa: E402

from helpers.runs import ROOT, run_in_process

TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=64",
  "--config.model.max_length=256",
  "--config.batch_size=4",
  "--config.eval_batch_size=4",
  "--config.eval.sample_tokens=0",
]
STEPS = ["--config.total_steps=2", "--config.eval_every=2", "--config.checkpoint_every=2"]
QUESTIONS = ["Which is hot?", "And 2+2?", "Thanks. Why?"]


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
  """A base GPT (nanochat's tokenizer, 2 steps) and its SFT (2 steps)."""
  root = tmp_path_factory.mktemp("chat_runs")
  data, corpus = root / "data", root / "corpus"
  chat_fixtures.write(str(data), scale=0.05)
  corpus.mkdir()
  for name in "abc":
    (corpus / f"{name}.txt").write_text("Which is hot? The sun is hot. 2+2=4. " * 40)
  base, sft = root / "base", root / "sft"
  argv = [
    "train.py",
    "--config",
    os.path.join(ROOT, "configs", "gpt_shakespeare.py"),
    "--workdir",
    str(base),
    f"--config.data.source_dir={corpus}",
    f"--config.data.data_dir={root / 'tfds'}",
    "--config.data.tokenizer=nanochat",
    "--config.data.vocab_size=270",
  ]
  assert run_in_process(argv + TINY + STEPS).returncode == 0
  argv = [
    "train.py",
    "--config",
    os.path.join(ROOT, "configs", "gpt_tiny_sft.py"),
    "--workdir",
    str(sft),
    f"--config.init_from={base}",
    f"--config.data.source_dir={data}",
    "--config.data.max_eval_conversations=4",
  ]
  assert run_in_process(argv + TINY[5:] + STEPS).returncode == 0
  return base, sft


@pytest.fixture(scope="module")
def engine(workdirs):
  return ChatEngine.load(str(workdirs[1]))


def greedy_answer(engine, prompt, max_tokens):
  """eval.py --sample's greedy decoding (sampling.generate) of ``prompt``,
  cut at the first stop token and where the context is full."""
  room = min(max_tokens, engine.context - len(prompt) + 1)  # the last from a full cache
  out = sampling.generate(
    engine.model, engine.params, np.asarray(prompt), max_new_tokens=room, temperature=0.0
  ).tolist()
  stops = [i for i, t in enumerate(out) if t in engine.stops]
  return out[: stops[0]] if stops else out


@pytest.mark.slow
@pytest.mark.subprocess
def test_engine_modes_and_three_turns_equal_greedy_decoding(workdirs, engine):
  assert engine.chat and "chat mode" in engine.mode_line
  base = ChatEngine.load(str(workdirs[0]))
  assert not base.chat and base.mode_line.startswith("plain completion mode")
  history = engine.start()
  for question in QUESTIONS:
    prompt = history + engine.user_turn(question)
    got = list(engine.tokens(prompt, max_tokens=24, temperature=0.0))
    assert got == greedy_answer(engine, prompt, 24)
    history = prompt + got + [engine.special["<|assistant_end|>"]]
  # nanochat's message shape renders to the same tokens as the kept conversation.
  first = engine.prompt([{"role": "user", "content": QUESTIONS[0]}])
  assert first.tolist() == engine.start() + engine.user_turn(QUESTIONS[0])


# --------------------------------------------------------------------------
# The terminal, through a pseudo-terminal.


HOLD = "import sys; sys.path.insert(0, {tests!r}); from helpers import chat_hold; chat_hold.main()"


def laplax_chat(held=False):
  """The command that runs ``laplax-chat``; ``held``: its answers to
  "(hold)" never end by themselves (helpers/chat_hold.py)."""
  if not held:
    return [sys.executable, "-m", "laplax.proj.nanochat.chat"]
  # SIGINT at its default whatever this process has, as a terminal starts a
  # command (an ignored SIGINT would pass to the child, and Ctrl-C do nothing).
  return [
    "env",
    "--default-signal=INT",
    sys.executable,
    "-c",
    HOLD.format(tests=os.path.join(ROOT, "tests")),
  ]


class Terminal:
  """``python -m laplax.proj.nanochat.chat ARGS`` on a pseudo-terminal: what it prints, keys typed."""

  def __init__(self, *args, held=False):
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    self.proc = subprocess.Popen(
      laplax_chat(held) + list(args),
      stdin=slave,
      stdout=slave,
      stderr=slave,
      cwd=ROOT,
      env=env,
      start_new_session=True,  # its own session: the pty is its controlling terminal
      preexec_fn=lambda: __import__("fcntl").ioctl(0, __import__("termios").TIOCSCTTY, 0),
    )
    os.close(slave)
    self.fd, self.text = master, ""

  def expect(self, pattern, timeout=120):
    """Reads until ``pattern`` (a regex) appears after what was read; returns the text before it."""
    deadline = time.monotonic() + timeout
    while True:
      m = re.search(pattern, self.text)
      if m:
        before, self.text = self.text[: m.start()], self.text[m.end() :]
        return before
      left = deadline - time.monotonic()
      assert left > 0, f"no {pattern!r} in {self.text!r}"
      ready, _, _ = select.select([self.fd], [], [], left)
      if ready:
        try:
          chunk = os.read(self.fd, 4096)
        except OSError:
          chunk = b""
        assert chunk, f"the chat ended before {pattern!r}: {self.text!r}"
        self.text += chunk.decode("utf-8", "replace").replace("\r\n", "\n")

  def type(self, keys):
    os.write(self.fd, keys.encode())

  def close(self):
    try:
      return self.proc.wait(timeout=30)
    finally:
      os.close(self.fd)


def shown(engine, tokens):
  return engine.tokenizer.decode(np.asarray(tokens, np.int32))


@pytest.mark.subprocess
@pytest.mark.slow
def test_terminal_three_turns_clear_and_ctrl_c(workdirs, engine):
  term = Terminal("--workdir", str(workdirs[1]), "--temperature", "0", "--max_tokens", "24")
  assert "chat mode" in term.expect(r"User: ")
  history = engine.start()
  for question in QUESTIONS:
    term.type(question + "\n")
    term.expect(r"Assistant: ")
    prompt = history + engine.user_turn(question)
    expected = greedy_answer(engine, prompt, 24)
    assert term.expect(r"\nUser: ").rstrip("\n") == shown(engine, expected).replace("\r\n", "\n")
    history = prompt + expected + [engine.special["<|assistant_end|>"]]
  term.type("/clear\n")
  assert "new conversation" in term.expect(r"User: ")
  term.type(QUESTIONS[0] + "\n")
  term.expect(r"Assistant: ")
  first = greedy_answer(engine, engine.start() + engine.user_turn(QUESTIONS[0]), 24)
  assert term.expect(r"\nUser: ").rstrip("\n") == shown(engine, first)
  term.type("/quit\n")
  assert term.close() == 0

  # Ctrl-C stops an answer, not the program. An answer to "(hold)" never ends
  # by itself (helpers/chat_hold.py), so the key always lands in it.
  term = Terminal(
    "--workdir", str(workdirs[1]), "--temperature", "0", "--max_tokens", "24", held=True
  )
  term.expect(r"User: ")
  term.type(QUESTIONS[1] + " (hold)\n")
  term.expect(r"Assistant: ")
  term.expect(r"\S")  # its first piece is out
  term.type("\x03")
  assert "[stopped]" in term.expect(r"\nUser: ")
  term.type(QUESTIONS[0] + "\n")  # it still answers, the real answer
  term.expect(r"Assistant: ")
  term.expect(r"\nUser: ")  # a complete answer, then the prompt
  term.type("\x04")  # Ctrl-D ends it
  assert term.close() == 0


@pytest.mark.slow
@pytest.mark.subprocess
def test_one_prompt_and_plain_completion_equal_eval_sample(workdirs, capfd):
  base, sft = map(str, workdirs)
  engine = ChatEngine.load(sft)
  assert chat_cli.main(["--workdir", sft, "-p", QUESTIONS[1], "--temperature", "0"]) == 0
  out = capfd.readouterr()
  expected = greedy_answer(engine, engine.start() + engine.user_turn(QUESTIONS[1]), 256)
  assert out.out == shown(engine, expected) + "\n" and "chat mode" in out.err
  # A base model continues the text exactly as eval.py --sample does.
  argv = ["--workdir", base, "-p", "The sun", "--temperature", "0", "--max_tokens", "20"]
  assert chat_cli.main(argv) == 0
  out = capfd.readouterr()
  assert "plain completion mode" in out.err
  sample = run_in_process(
    [
      "eval.py",
      "--workdir",
      base,
      "--sample",
      "The sun",
      "--temperature",
      "0",
      "--max_new_tokens",
      "20",
    ],
    capfd,
  )
  assert sample.returncode == 0
  assert sample.stdout.splitlines()[-1] == "The sun" + out.out.rstrip("\n")


@pytest.mark.parametrize(
  "args, fragment",
  [
    ([], "--workdir"),
    (["--workdir", "WD", "--temperature", "5"], "--temperature=5.0 must be in [0, 2]"),
    (["--workdir", "WD", "--max_tokens", "0"], "--max_tokens=0 must be >= 1"),
    (["--workdir", "WD", "--seed", str(10**30)], "--seed=1000000000000000000000000000000 must"),
    (["--workdir", "WD", "--web", "-p", "hi"], "cannot be combined with --web"),
    (["--workdir", "WD", "--bogus"], "unrecognized arguments: --bogus"),
    (["--workdir", "WD", "--web", "--allow_origin", "evil.example"], "must be an origin"),
    (["--workdir", "WD", "--web", "--allow_host", "a.b:80"], "without scheme or port"),
    (["--workdir", "WD", "--web", "--token", ""], "--token must be a non-empty word"),
    (["--workdir", "/nonexistent/run"], "is not a directory"),
    (["--workdir", "EMPTY"], "config.json"),
  ],
)
def test_bad_flags_are_one_line_exit_2(workdirs, tmp_path, monkeypatch, capsys, args, fragment):
  args = [str(workdirs[1]) if a == "WD" else str(tmp_path) if a == "EMPTY" else a for a in args]
  monkeypatch.setattr(sys, "argv", ["laplax-chat", *args])
  with pytest.raises(SystemExit) as e:
    chat_cli.run_cli()
  err = capsys.readouterr().err
  assert e.value.code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------------------
# The API and the page, on a real uvicorn server on a loopback port.


class Server:
  """uvicorn serving ``make_app(engine)`` in a thread, on a free loopback port."""

  def __init__(self, engine, limits=web.Limits(), access=web.Access(), **defaults):
    defaults = argparse.Namespace(
      **{"temperature": 0.0, "top_k": 50, "max_tokens": 24, "no_calculator": False, **defaults}
    )
    self.app = web.make_app(engine, limits, defaults, access)
    self.sock = socket.socket()
    self.sock.bind(("127.0.0.1", 0))
    self.port = self.sock.getsockname()[1]
    self.url = f"http://127.0.0.1:{self.port}"
    self.server = web.ChatServer(self.app)
    self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

  def __enter__(self):
    self.thread.start()
    for _ in range(200):
      if self.server.started:
        return self
      time.sleep(0.05)
    raise AssertionError("uvicorn did not start")

  def __exit__(self, *exc):
    self.server.should_exit = True
    self.thread.join(timeout=30)
    self.sock.close()


JSON = {"Content-Type": "application/json"}


def events(response):
  """The SSE ``data:`` objects of a streamed response."""
  return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def ask(client, messages, **kw):
  with client.stream("POST", "/chat/completions", json={"messages": messages, **kw}) as r:
    assert r.status_code == 200, r.read()
    got = events(r)
  assert got[-1] == {"done": True}
  return "".join(e["token"] for e in got[:-1])


@pytest.mark.subprocess
def test_api_three_turns_bad_requests_concurrency_and_stop(engine):
  with Server(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
    messages = []
    for question in QUESTIONS:
      messages.append({"role": "user", "content": question})
      answer = ask(client, messages, temperature=0.0, max_tokens=24)
      expected = greedy_answer(engine, engine.prompt(messages), 24)
      assert answer == shown(engine, expected)
      messages.append({"role": "assistant", "content": answer})
    assert client.get("/health").json()["mode"] == "chat"
    page = client.get("/")
    assert page.status_code == 200 and 'id="stop"' in page.text and "chat mode" in page.text

    user = {"role": "user", "content": "hi"}
    bad = [
      (b"{not json", 400, "not JSON"),
      (json.dumps({"messages": "hi"}), 422, "messages"),
      (json.dumps({"messages": [{"role": "robot", "content": "x"}]}), 422, "role"),
      (json.dumps({"messages": [user], "extra": 1}), 422, "extra"),
      (json.dumps({"messages": []}), 400, "at least one"),
      (json.dumps({"messages": [user, {"role": "assistant", "content": "a"}]}), 400, "last"),
      (json.dumps({"messages": [user, user]}), 400, "alternate"),
      (json.dumps({"messages": [user], "max_tokens": 10**6}), 400, "max_tokens"),
      (json.dumps({"messages": [user], "temperature": -1}), 400, "temperature"),
      (json.dumps({"messages": [user], "top_k": 10**30}), 400, "top_k"),
      (json.dumps({"messages": [user], "seed": 10**30}), 400, "seed=10000"),
      (json.dumps({"messages": [user], "seed": -1}), 400, "seed=-1 must be in [0, 4294967295]"),
      (json.dumps({"messages": [{"role": "user", "content": "x" * 8001}]}), 400, "8000"),
      (json.dumps({"messages": [{"role": "user", "content": "word " * 1500}]}), 400, "context"),
      (b"x" * (300 * 1024), 413, "bytes"),
    ]
    for body, status, fragment in bad:
      r = client.post("/chat/completions", content=body, headers=JSON)
      assert r.status_code == status and fragment in r.json()["error"], (body[:40], r.text)
      assert "\n" not in r.json()["error"] and "Traceback" not in r.text

    # Concurrent requests queue on the one model; each gets its own answer.
    results = [None] * 4
    questions = [QUESTIONS[i % 3] for i in range(4)]

    def one(i):
      with httpx.Client(base_url=server.url, timeout=60) as c:
        results[i] = ask(c, [{"role": "user", "content": questions[i]}], temperature=0.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    for q, got in zip(questions, results):
      prompt = engine.prompt([{"role": "user", "content": q}])
      assert got == shown(engine, greedy_answer(engine, prompt, 24))

    # A client that goes away mid-answer: the server is free for the next one.
    with client.stream(
      "POST", "/chat/completions", json={"messages": [user], "max_tokens": 200, "temperature": 1}
    ) as r:
      next(r.iter_lines())
    assert ask(client, [{"role": "user", "content": QUESTIONS[0]}], temperature=0.0)
    health = client.get("/health").json()
    assert health["waiting"] == 0 and not health["busy"]


MESSAGE = b'"messages": [{"role": "user", "content": "hi"}]'
HOSTILE = [  # body, the error's start; each was a 500 and a traceback before
  (b"[" * 40_000, "the body is nested more than 16 deep"),  # RecursionError in json.loads
  (b"{" + MESSAGE + b', "max_tokens": ' + b"7" * 5000 + b"}", "the body has an integer of more"),
  (b"{" + MESSAGE + b', "max_tokens": ' + b"7" * 4300 + b"}", "the body has an integer of more"),
  (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "the body has a string with a"),
  (b"{" + MESSAGE + b', "temperature": NaN}', "the body is not JSON (NaN"),
  (b"\xff\xfe{}", "the body is not UTF-8"),
]


@pytest.mark.subprocess
def test_hostile_bodies_are_one_short_line_and_leave_no_traceback(engine, capfd):
  with Server(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
    for body, start in HOSTILE:
      r = client.post("/chat/completions", content=body, headers=JSON)
      error = r.json()["error"]
      assert r.status_code == 400 and error.startswith(start), (body[:40], r.text)
      assert "\n" not in error and len(error) < 100 and "7777" not in error
    # Only JSON is taken: a form's or a text/plain body (no CORS preflight) is not.
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
      headers = {"Content-Type": kind} if kind else {}
      r = client.post("/chat/completions", content=b"{" + MESSAGE + b"}", headers=headers)
      assert r.status_code == 415 and r.json()["error"].startswith("the body must be JSON")
    # A client that leaves mid-body (1000 bytes announced, 10 sent).
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
      sock.sendall(
        f"POST /chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"messages'.encode()
      )
    assert ask(client, [{"role": "user", "content": QUESTIONS[0]}], temperature=0.0)
    assert client.get("/health").json()["served"] == 1
  err = capfd.readouterr().err  # the server has stopped: everything it logs is here
  for word in ("Traceback", "Error", "Exception", "Disconnect"):
    assert word not in err, err


@pytest.mark.subprocess
def test_foreign_host_and_origin_are_refused_and_the_token_is_checked(engine):
  access = web.Access(hosts=("chat.lan",), origins=("http://app.example:9000",))
  user = {"messages": [{"role": "user", "content": QUESTIONS[0]}], "temperature": 0}
  with Server(engine, access=access) as server, httpx.Client(base_url=server.url) as client:
    port = server.port
    refused = [
      ({"Host": f"evil.example:{port}"}, "Host 'evil.example:"),  # DNS rebinding
      ({"Host": f"127.0.0.1:{port + 1}"}, "Host '127.0.0.1:"),  # another port
      ({"Host": "localhost"}, "Host 'localhost'"),  # port 80 only
      ({"Origin": "http://evil.example"}, "Origin 'http://evil.example' is not this server's"),
      ({"Origin": f"http://127.0.0.1:{port + 1}"}, "Origin"),  # another loopback origin
      ({"Origin": "null"}, "Origin 'null'"),  # a sandboxed frame, a file:// page
      ({"Origin": f"https://127.0.0.1:{port}"}, "Origin"),  # another scheme
    ]
    for headers, start in refused:
      for method, path in (("POST", "/chat/completions"), ("GET", "/"), ("GET", "/health")):
        r = client.request(method, path, json=user, headers=headers)
        assert r.status_code == 403 and r.json()["error"].startswith(start), (headers, r.text)
        assert "\n" not in r.json()["error"]
    assert client.get("/health").json()["served"] == 0  # none of them reached the model
    allowed = [
      {},  # no Origin: not a browser's cross-site request
      {"Origin": server.url},
      {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"},
      {"Host": f"[::1]:{port}"},
      {"Host": f"CHAT.lan:{port}", "Origin": f"http://chat.lan:{port}"},  # --allow_host
      {"Origin": "http://app.example:9000"},  # --allow_origin
    ]
    for headers in allowed:
      with client.stream("POST", "/chat/completions", json=user, headers=headers) as r:
        assert r.status_code == 200 and events(r)[-1] == {"done": True}, headers
    assert client.get("/health").json()["served"] == len(allowed)

  token = web.Access(token="s3cret-t0ken")
  with Server(engine, access=token) as server, httpx.Client(base_url=server.url) as client:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": "laplax_chat_token=x"}):
      r = client.post("/chat/completions", json=user, headers=headers)
      assert r.status_code == 403 and "token" in r.json()["error"], headers
    for how in ({"Authorization": "Bearer s3cret-t0ken"}, {"Authorization": "token s3cret-t0ken"}):
      assert client.get("/health", headers=how).status_code == 200
    assert client.get("/health?token=s3cret-t0ken").status_code == 200
    page = client.get("/?token=s3cret-t0ken")
    assert page.status_code == 200 and "HttpOnly; SameSite=Strict" in page.headers["set-cookie"]
    assert client.get("/health").json()["served"] == 0  # the page's cookie lets it in


def asgi_call(app, body, disconnect_at_once):
  """One ASGI request to ``app`` with ``body``: its messages to the server, and
  ``http.disconnect`` either right after the body (a client gone before its
  stream begins: sending the response's start waits once, as uvicorn's send
  does while the connection's write buffer drains, and the disconnect is
  seen then) or only once the response is complete."""
  import asyncio

  async def run():
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    sent, done = [], asyncio.Event()

    async def receive():
      if pending:
        return pending.pop(0)
      if not disconnect_at_once:
        await done.wait()
      return {"type": "http.disconnect"}

    async def send(message):
      sent.append(message)
      if disconnect_at_once and message["type"] == "http.response.start":
        await asyncio.sleep(0)
      if message["type"] == "http.response.body" and not message.get("more_body"):
        done.set()

    scope = {
      "type": "http",
      "asgi": {"version": "3.0", "spec_version": "2.3"},  # as uvicorn says
      "http_version": "1.1",
      "method": "POST",
      "scheme": "http",
      "path": "/chat/completions",
      "raw_path": b"/chat/completions",
      "query_string": b"",
      "root_path": "",
      "headers": [
        (b"host", b"127.0.0.1:80"),
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
      ],
      "client": ("127.0.0.1", 1),
      "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

  return asyncio.run(run())


@pytest.mark.subprocess
def test_client_gone_before_its_stream_begins_leaves_no_place_in_the_queue(engine):
  body = json.dumps({"messages": [{"role": "user", "content": QUESTIONS[0]}], "temperature": 0})
  app = web.make_app(engine)
  try:
    assert asgi_call(app, body.encode(), disconnect_at_once=True) == b""  # no answer was decoded
    assert app.state.queue == {"waiting": 0, "served": 0}  # it never reached the lock
    answer = asgi_call(app, body.encode(), disconnect_at_once=False).decode()
    got = [json.loads(line[6:]) for line in answer.split("\n\n") if line.startswith("data: ")]
    assert got[-1] == {"done": True} and app.state.queue == {"waiting": 0, "served": 1}
    prompt = engine.prompt([{"role": "user", "content": QUESTIONS[0]}])
    expected = shown(engine, greedy_answer(engine, prompt, 256))
    assert "".join(e["token"] for e in got[:-1]) == expected
  finally:
    app.state.worker.shutdown(wait=True)
  # The same on a real server: a client that sends its request and hangs up at once.
  with Server(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
    request = (
      f"POST /chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
      "Content-Type: application/json\r\n"
      f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    for _ in range(3):
      with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(request)
    assert ask(client, [{"role": "user", "content": QUESTIONS[0]}], temperature=0.0)
    deadline = time.monotonic() + 60  # the hung-up requests end on the server's own time
    while (health := client.get("/health").json())["waiting"] or health["busy"]:
      assert time.monotonic() < deadline, health
      time.sleep(0.05)


def listening(pid):
  """The (address, port) pairs process ``pid``'s TCP sockets listen on."""
  inodes = set()
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
      link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
      continue
    if link.startswith("socket:["):
      inodes.add(link[8:-1])
  found = []
  for table in ("tcp", "tcp6"):
    with open(f"/proc/{pid}/net/{table}") as f:
      for row in f.read().splitlines()[1:]:
        cols = row.split()
        if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
          address, port = cols[1].split(":")
          raw = bytes.fromhex(address)
          if table == "tcp":
            host = socket.inet_ntop(socket.AF_INET, raw[::-1])
          else:  # four little-endian 32-bit words
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
            host = socket.inet_ntop(socket.AF_INET6, words)
          found.append((host, int(port, 16)))
  return found


def start_server(sft, *flags):
  """``laplax-chat --web`` (answers to "(hold)" held) on a free port: the
  process, its stderr lines (read as they come) and the line that says where it is."""
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(
    laplax_chat(held=True)
    + ["--workdir", sft, "--web", "--temperature", "0", "--port", "0"]
    + list(flags),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=ROOT,
    env=env,
  )
  lines = []
  reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
  reader.start()
  deadline = time.monotonic() + 300
  while not any("laplax-chat: open" in line for line in lines):
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      raise AssertionError(lines)
    time.sleep(0.1)
  return proc, lines, reader, next(line for line in lines if "laplax-chat: open" in line)


@pytest.mark.subprocess
@pytest.mark.slow
def test_serve_binds_loopback_answers_and_stops_on_sigint(workdirs, engine):
  sft = str(workdirs[1])
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
  proc, lines, reader, opened = start_server(sft, "--max_tokens", "24")
  try:
    host, port = re.search(r"http://([\d.]+):(\d+) ", opened).groups()
    port = int(port)
    assert listening(proc.pid) == [("127.0.0.1", port)] and host == "127.0.0.1"  # loopback only

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
      messages = [{"role": "user", "content": QUESTIONS[0]}]
      expected = shown(engine, greedy_answer(engine, engine.prompt(messages), 24))
      assert ask(client, messages) == expected
      # DNS rebinding: a name that resolves to 127.0.0.1 is not this server's.
      r = client.post(
        "/chat/completions", json={"messages": messages}, headers={"Host": f"evil.example:{port}"}
      )
      assert r.status_code == 403 and r.json()["error"].startswith("Host 'evil.example:")
      assert client.get("/health").json()["served"] == 1

    # A second server on the same port: one line, exit 2, before loading a model.
    argv = [
      sys.executable,
      "-m",
      "laplax.proj.nanochat.chat",
      "--workdir",
      sft,
      "--web",
      "--port",
      str(port),
    ]
    second = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip().splitlines() == [
      f"error: cannot listen on 127.0.0.1:{port} (Address already in use); pick another --port"
    ]

    # Ctrl-C while an answer streams that would never end by itself: the client
    # gets the final event, the server exits 130.
    held = {"messages": [{"role": "user", "content": QUESTIONS[1] + " (hold)"}]}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
      with client.stream("POST", "/chat/completions", json=held) as r:
        lines_in = r.iter_lines()
        first = next(line for line in lines_in if line.startswith("data: "))
        assert "token" in json.loads(first[6:])
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        rest = [json.loads(line[6:]) for line in lines_in if line.startswith("data: ")]
    assert rest[-1] == {"stopped": web.STOPPED} and all("token" in e for e in rest[:-1]), rest
    assert proc.wait(timeout=120) == 130  # run_cli's Ctrl-C code, after a clean stop
    print(f"SIGINT to exit: {time.monotonic() - sent:.2f} s")
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  reader.join(timeout=30)
  err = "".join(lines)
  for word in ("Traceback", "Error", "Exception", "Cancel"):
    assert word not in err, err
  assert proc.stdout.read() == ""
  with socket.socket() as sock:  # the port is free again
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))


@pytest.mark.subprocess
@pytest.mark.slow
def test_serve_on_a_non_loopback_address_needs_the_printed_token(workdirs):
  proc, lines, reader, opened = start_server(str(workdirs[1]), "--host", "0.0.0.0")
  try:
    port, token = re.search(r"http://0\.0\.0\.0:(\d+)/\?token=([\w-]+) ", opened).groups()
    assert len(token) == 32
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
      r = client.get("/health")
      assert r.status_code == 403 and r.json()["error"].startswith("no token: open the URL")
      r = client.get("/health", headers={"Authorization": "Bearer " + token[::-1]})
      assert r.status_code == 403 and r.json()["error"].startswith("a wrong token")
      assert client.get(f"/?token={token}").status_code == 200  # the page sets its cookie
      messages = [{"role": "user", "content": QUESTIONS[0]}]
      assert ask(client, messages, temperature=0.0)  # the cookie is the key
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
      r = client.get("/health", headers={"Authorization": f"Bearer {token}"})
      assert r.status_code == 200 and r.json()["served"] == 1
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  reader.join(timeout=30)
  assert "Traceback" not in "".join(lines)


def scripted_step(script):
  """A stand-in for sampling.decode_step whose samples are ``script`` in order."""

  def factory(model):
    def step(params, cache, tokens, used, rng, salt, temperature, top_k):
      return cache, np.asarray([script[int(salt) % len(script)]], np.int32)

    return step

  return factory


def test_calculator_answers_a_scripted_tool_call(engine, monkeypatch):
  s, tok = engine.special, engine.tokenizer
  script = [s["<|python_start|>"], *tok.encode("12*7").tolist(), s["<|python_end|>"]]
  script += [0] * 5 + tok.encode(" so 84.").tolist() + [s["<|assistant_end|>"]]
  monkeypatch.setattr(sampling, "decode_step", scripted_step(script))
  expected = "<|python_start|>12*7<|python_end|><|output_start|>84<|output_end|>"
  with Server(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
    answer = ask(client, [{"role": "user", "content": "What is 12*7?"}])
  assert answer.startswith(expected) and answer.endswith(" so 84."), answer
  prompt = engine.prompt([{"role": "user", "content": "What is 12*7?"}])
  # The next turn's prompt from the answer's text is the one the terminal keeps
  # (its tokens): the tool blocks are their special tokens again, not text.
  tokens = list(engine.tokens(prompt, max_tokens=40))
  assert shown(engine, tokens) == answer
  messages = [
    {"role": "user", "content": "What is 12*7?"},
    {"role": "assistant", "content": answer},
    {"role": "user", "content": "Thanks."},
  ]
  kept = prompt.tolist() + tokens + [s["<|assistant_end|>"]] + engine.user_turn("Thanks.")
  assert engine.prompt(messages).tolist() == kept
  cut = dict(messages[1], content="So <|python_start|>12*")  # an answer cut inside a block
  plain = engine.prompt([messages[0], cut, messages[2]]).tolist()
  assert s["<|python_start|>"] not in plain and shown(engine, plain).count("<|python_start|>") == 1
  plain = shown(engine, list(engine.tokens(prompt, max_tokens=40, calculator=False)))
  assert "<|output_start|>" not in plain


def rss_bytes():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_memory_flat_and_no_recompilation_over_200_requests(engine):
  step = sampling.decode_step(engine.model)
  lengths = ["hi", "Which is hot? " * 3, "The sun is hot. " * 9, "2+2=4. " * 30]
  with Server(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
    for i in range(200):
      text = lengths[i % len(lengths)]
      ask(client, [{"role": "user", "content": text}], max_tokens=4, temperature=1.0, seed=i)
      if i == 9:
        compiled, live, rss = step._cache_size(), len(jax.live_arrays()), rss_bytes()
  assert step._cache_size() == compiled  # nothing compiled after warm-up
  assert len(jax.live_arrays()) <= live  # no array kept per request
  assert rss_bytes() <= 1.1 * rss
  assert sampling.decode_step.cache_info().currsize <= sampling.CACHED_MODELS


def chromium():
  """(chromium, chromedriver) paths, or None."""
  found = [shutil.which(n) for n in ("chromium", "chromedriver")]
  return found if all(found) else None


@pytest.mark.skipif(
  chromium() is None,
  reason="Debian chromium and chromium-driver are not installed (scripts/install.sh --test)",
)
@pytest.mark.slow
def test_page_in_chromium_streams_stops_and_holds_three_turns(engine, monkeypatch):
  webdriver = pytest.importorskip("selenium.webdriver")
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import WebDriverWait

  pace = {"delay": 0.0, "made": 0, "closed": 0}
  tokens = engine.tokens

  def paced(*args, **kw):  # the real answer, token by token at a pace the browser can catch
    it = tokens(*args, **kw)
    try:
      for token in it:
        time.sleep(pace["delay"])
        pace["made"] += 1
        yield token
    finally:
      pace["closed"] += 1

  monkeypatch.setattr(engine, "tokens", paced)
  options = webdriver.ChromeOptions()
  for flag in (
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--window-size=900,700",
  ):
    options.add_argument(flag)
  options.binary_location = chromium()[0]
  service = webdriver.ChromeService(executable_path=chromium()[1])
  with Server(engine, max_tokens=24) as server:
    driver = webdriver.Chrome(options=options, service=service)
    try:
      wait = WebDriverWait(driver, 60, poll_frequency=0.05)
      driver.get(server.url)
      assert "chat mode" in driver.find_element(By.ID, "mode").text
      answers = lambda: driver.find_elements(By.CSS_SELECTOR, ".message.assistant")
      # Stop: the answer streams in, Stop ends it, the server stops decoding.
      pace["delay"] = 0.05
      driver.find_element(By.ID, "input").send_keys(QUESTIONS[1] + "\n")  # 24 tokens, 1.2 s
      wait.until(lambda d: len(answers()) == 1 and len(answers()[0].text) > 0)
      driver.find_element(By.ID, "stop").click()
      wait.until(lambda d: answers()[0].get_attribute("data-state") == "stopped")
      wait.until(lambda d: pace["closed"] == 1)
      assert 0 < pace["made"] < 24
      assert driver.find_element(By.ID, "send").is_displayed()
      driver.find_element(By.ID, "new-chat").click()
      assert answers() == []
      # Three turns, each the greedy answer to the conversation so far.
      pace["delay"] = 0.0
      messages = []
      for k, question in enumerate(QUESTIONS):
        driver.find_element(By.ID, "input").send_keys(question + "\n")
        wait.until(lambda d, k=k: len(answers()) == k + 1)
        wait.until(lambda d, k=k: answers()[k].get_attribute("data-state") == "done")
        messages.append({"role": "user", "content": question})
        expected = shown(engine, greedy_answer(engine, engine.prompt(messages), 24))
        got = driver.execute_script("return arguments[0].textContent", answers()[k])
        assert got == expected
        messages.append({"role": "assistant", "content": got})
      if os.environ.get("LAPLAX_CHAT_SCREENSHOT"):
        driver.save_screenshot(os.environ["LAPLAX_CHAT_SCREENSHOT"])
    finally:
      driver.quit()


ATTACK = """<!doctype html>
<html><body><iframe name="sink"></iframe><script>
window.results = {};
const target = "TARGET/chat/completions";
const body = JSON.stringify({messages: [{role: "user", content: "Which is hot?"}], temperature: 0});
async function attack() {
  try {  // a simple request: no preflight, the answer unreadable but decoded
    await fetch(target, {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body});
    results.simple = "sent";
  } catch (e) { results.simple = "failed"; }
  try {  // a JSON request: preflighted
    const r = await fetch(target, {method: "POST", headers: {"Content-Type": "application/json"}, body});
    results.json = r.status;
  } catch (e) { results.json = "blocked"; }
  await new Promise((resolve) => {  // a form whose text/plain body is the JSON
    const form = document.createElement("form");
    form.method = "POST"; form.action = target; form.enctype = "text/plain"; form.target = "sink";
    const field = document.createElement("input");
    field.name = body.slice(0, -1) + ', "x": "'; field.value = '"}';
    form.appendChild(field); document.body.appendChild(form);
    document.querySelector("iframe").onload = resolve;
    form.submit();
  });
  results.form = "sent";
  results.done = true;
}
attack();
</script></body></html>
"""


def chrome(*flags):
  """Headless Chromium (selenium)."""
  webdriver = pytest.importorskip("selenium.webdriver")
  options = webdriver.ChromeOptions()
  for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", *flags):
    options.add_argument(flag)
  options.binary_location = chromium()[0]
  service = webdriver.ChromeService(executable_path=chromium()[1])
  return webdriver.Chrome(options=options, service=service)


class PageServer:
  """Another loopback origin (127.0.0.1, another port) serving one page."""

  def __init__(self, html):
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):
        data = html.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
    self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

  def __enter__(self):
    self.thread.start()
    return self

  def __exit__(self, *exc):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.mark.skipif(
  chromium() is None,
  reason="Debian chromium and chromium-driver are not installed (scripts/install.sh --test)",
)
@pytest.mark.slow
def test_a_page_of_another_origin_or_a_rebound_name_cannot_make_it_decode(engine):
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import WebDriverWait

  with Server(engine, max_tokens=8) as server, httpx.Client(base_url=server.url) as client:
    attacker = PageServer(ATTACK.replace("TARGET", server.url))
    rebound = f"http://evil.example:{server.port}/"  # a name an attacker points at 127.0.0.1
    driver = chrome("--host-resolver-rules=MAP evil.example 127.0.0.1")
    try:
      wait = WebDriverWait(driver, 60, poll_frequency=0.05)
      with attacker:
        driver.get(attacker.url)
        wait.until(lambda d: d.execute_script("return window.results.done === true"))
        results = driver.execute_script("return window.results")
      assert results["json"] == "blocked", results  # the preflight is refused
      assert client.get("/health").json()["served"] == 0  # nothing was decoded
      driver.get(rebound)
      assert "is not this server" in driver.find_element(By.TAG_NAME, "body").text
      assert client.get("/health").json()["served"] == 0
      # The server's own page still works.
      driver.get(server.url)
      driver.find_element(By.ID, "input").send_keys(QUESTIONS[0] + "\n")
      answers = lambda: driver.find_elements(By.CSS_SELECTOR, ".message.assistant")
      wait.until(
        lambda d: len(answers()) == 1 and answers()[0].get_attribute("data-state") == "done"
      )
      expected = greedy_answer(
        engine, engine.prompt([{"role": "user", "content": QUESTIONS[0]}]), 8
      )
      assert driver.execute_script("return arguments[0].textContent", answers()[0]) == shown(
        engine, expected
      )
      assert client.get("/health").json()["served"] == 1
    finally:
      driver.quit()
