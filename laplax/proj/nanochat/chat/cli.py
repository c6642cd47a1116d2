"""Talk to a trained GPT in the terminal or in a web page (``laplax-chat``).

    laplax-chat --workdir runs/chat/sft                  # a conversation in the terminal
    laplax-chat --workdir runs/chat/sft -p "What is 3*7?" # one answer, then exit
    laplax-chat --workdir runs/chat/sft --web --port 8000 # the page at http://127.0.0.1:8000

As nanochat's ``scripts/chat_cli.py``: the conversation is kept as tokens in
nanochat's chat format (:mod:`laplax.proj.nanochat.chat.engine`), each answer is printed
token by token as it is decoded; ``/clear`` (or ``clear``) starts a new
conversation, ``/quit``, ``quit``, ``exit`` or Ctrl-D ends the program, and
Ctrl-C stops the answer being written (the partial answer stays in the
conversation; at the prompt it only clears the line). A base-model or
byte-level workdir is in plain completion mode (each line is continued as
text), said in one line at the start. ``--web`` serves the page and its API
instead (:mod:`laplax.proj.nanochat.chat.web`). Bad flags or a workdir that cannot be
loaded print one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse

from laplax import utils
from laplax.errors import UserError

USAGE_EXIT = 2
CLEAR = ("/clear", "clear")
QUIT = ("/quit", "quit", "exit")
MAX_SEED = 2**32 - 1  # jax.random.PRNGKey's distinct seeds (laplax.proj.nanochat.chat.web.MAX_SEED)


class UsageError(UserError, ValueError):
  """A bad command line; the message is one line with the fix."""


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit 2 (run_cli), instead of argparse's usage dump
    raise UsageError(f"{message} (see laplax-chat --help)")


def parser() -> argparse.ArgumentParser:
  """The command line of ``laplax-chat`` (nanochat's chat_cli and chat_web flags)."""
  p = _Parser(
    prog="laplax-chat",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--workdir", required=True, help="Run directory written by train.py.")
  p.add_argument("--step", type=int, default=None, help="Checkpoint step (default: the newest).")
  p.add_argument("--temperature", type=float, default=0.6, help="0 = greedy (default 0.6).")
  p.add_argument("--top_k", type=int, default=50, help="Sample among the k likeliest (0 = all).")
  p.add_argument("--max_tokens", type=int, default=256, help="Most tokens of one answer.")
  p.add_argument("--seed", type=int, default=0, help="Sampling seed (answer n uses seed + n).")
  p.add_argument("-p", "--prompt", default=None, help="Answer this one prompt and exit.")
  p.add_argument("--no_calculator", action="store_true", help="Do not run the calculator tool.")
  p.add_argument("--web", action="store_true", help="Serve the chat page and its API.")
  p.add_argument("--host", default="127.0.0.1", help="--web: address to bind (127.0.0.1).")
  p.add_argument("--port", type=int, default=8000, help="--web: port (default 8000).")
  p.add_argument(
    "--allow_host",
    action="append",
    default=[],
    metavar="NAME",
    help="--web: a name the server also answers to in Host (repeatable; it always answers "
    "to localhost, 127.0.0.1, [::1] and the address it serves).",
  )
  p.add_argument(
    "--allow_origin",
    action="append",
    default=[],
    metavar="ORIGIN",
    help="--web: a page origin (http://host:port) that may also use the API (repeatable; "
    "default: the server's own page only).",
  )
  p.add_argument(
    "--token",
    default=None,
    help="--web: the token every request must carry (default: none on a loopback --host, "
    "a new one, printed at start, on any other).",
  )
  return p


def _check_web(args: argparse.Namespace) -> None:
  for name in args.allow_host:
    if not name or any(c in name for c in "/:@ ") and not name.startswith("["):
      raise UsageError(f"--allow_host={name!r} must be a host name, without scheme or port")
  for origin in args.allow_origin:
    parts = urllib.parse.urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
      raise UsageError(
        f"--allow_origin={origin!r} must be an origin: http(s)://host[:port], no path"
      )
  if args.token is not None and (
    not args.token or not args.token.isprintable() or " " in args.token
  ):
    raise UsageError("--token must be a non-empty word (printable, no spaces)")


def check(args: argparse.Namespace) -> None:
  """The flags' values.

  Raises:
    UsageError: the first bad value.
  """
  if not 0.0 <= args.temperature <= 2.0:
    raise UsageError(f"--temperature={args.temperature} must be in [0, 2]")
  if args.top_k < 0:
    raise UsageError(f"--top_k={args.top_k} must be >= 0 (0 = all tokens)")
  if args.max_tokens < 1:
    raise UsageError(f"--max_tokens={args.max_tokens} must be >= 1")
  if not 0 <= args.seed <= MAX_SEED:
    raise UsageError(f"--seed={args.seed} must be in [0, {MAX_SEED}]")
  if not 0 <= args.port <= 65535:
    raise UsageError(f"--port={args.port} must be in [0, 65535]")
  _check_web(args)
  if args.web and args.prompt is not None:
    raise UsageError("-p answers one prompt in the terminal; it cannot be combined with --web")
  from laplax import store

  store.check_scheme(args.workdir)
  if not store.isdir(args.workdir):  # gs://: a prefix holding the run's objects
    raise UsageError(f"--workdir {args.workdir} is not a directory; give a train.py workdir")


def answer(engine, prompt, args, seed: int, write, out: list[int]) -> None:
  """Streams one answer to ``write``, its tokens appended to ``out`` (a
  KeyboardInterrupt stops it there and reaches the caller)."""
  tokens = engine.tokens(
    prompt,
    max_tokens=args.max_tokens,
    temperature=args.temperature,
    top_k=args.top_k or None,
    seed=seed,
    calculator=not args.no_calculator,
  )
  try:
    for piece in engine.texts(tokens, out):
      write(piece)
  finally:
    tokens.close()


def converse(engine, args, read=input, write=None) -> int:
  """The terminal conversation (see the module docstring); returns 0."""

  def show(text):
    sys.stdout.write(text)
    sys.stdout.flush()

  write = write or show
  history = engine.start()
  turn = 0
  show(
    "Type a message; /clear starts a new conversation, /quit or Ctrl-D ends, "
    "Ctrl-C stops an answer.\n"
  )
  while True:
    try:
      line = read("\nUser: ")
    except EOFError:
      show("\n")
      return 0
    except KeyboardInterrupt:
      show("\n")
      continue
    text = line.strip()
    if text.lower() in QUIT:
      return 0
    if text.lower() in CLEAR:
      history = engine.start()
      show("(a new conversation)\n")
      continue
    if not text:
      continue
    if engine.chat:
      prompt = history + engine.user_turn(text)
      if len(prompt) >= engine.context:
        show(
          f"(the conversation would be {len(prompt)} tokens; the model's context is "
          f"{engine.context}: /clear to start a new one)\n"
        )
        continue
    else:
      prompt = engine.tokenizer.encode(text).tolist()
      if not prompt or len(prompt) > engine.context:
        show(f"(a prompt needs 1 to {engine.context} tokens; it has {len(prompt)})\n")
        continue
    tokens: list[int] = []
    try:  # Ctrl-C anywhere in the turn stops the answer; what was said stays
      show("\nAssistant: ")
      answer(engine, prompt, args, (args.seed + turn) % (MAX_SEED + 1), write, tokens)
      show("\n")
    except KeyboardInterrupt:
      show(" [stopped]\n")
    turn += 1
    if engine.chat:
      history = prompt + tokens + [engine.special["<|assistant_end|>"]]


def main(argv: list[str] | None = None) -> int:
  """Parses ``argv`` (default ``sys.argv[1:]``) and runs the conversation,
  the one answer of ``-p`` or the web server.

  Raises:
    UsageError, laplax.loading.LoadError, DataError: the user errors
    :func:`run_cli` prints as one line.
  """
  args = parser().parse_args(sys.argv[1:] if argv is None else argv)
  check(args)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  sock = None
  if args.web:  # a taken port fails at once, before the model loads
    from laplax.proj.nanochat.chat import web

    sock = web.bind(args.host, args.port)
  from laplax.proj.nanochat.chat.engine import ChatEngine

  try:
    engine = ChatEngine.load(args.workdir, args.step)
  except BaseException:
    if sock is not None:
      sock.close()
    raise
  print(engine.mode_line, file=sys.stderr, flush=True)
  if sock is not None:
    access = web.Access(
      hosts=tuple(h.lower() for h in args.allow_host),
      origins=tuple(args.allow_origin),
      token=args.token,
    )
    web.serve(engine, defaults=args, sock=sock, access=access)
    return 0
  if args.prompt is not None:
    if engine.chat:
      prompt = engine.start() + engine.user_turn(args.prompt)
    else:
      prompt = engine.tokenizer.encode(args.prompt).tolist()
    if not prompt or len(prompt) >= engine.context:
      raise UsageError(
        f"-p is {len(prompt)} tokens; the model's context is {engine.context}: give "
        f"a prompt of 1 to {engine.context - 1} tokens"
      )
    try:
      answer(engine, prompt, args, args.seed, lambda t: print(t, end="", flush=True), [])
      print()
    except KeyboardInterrupt:
      print(" [stopped]")
    return 0
  return converse(engine, args)


def run_cli() -> None:
  """The ``laplax-chat`` command: :func:`main` with its user errors as one
  stderr line and exit code 2; Ctrl-C outside an answer exits 130."""
  try:
    code = main()
  except UserError as e:
    print(f"error: {utils.first_line(e)}", file=sys.stderr)
    sys.exit(USAGE_EXIT)
  except KeyboardInterrupt:
    print(file=sys.stderr)
    sys.exit(130)
  sys.exit(code or 0)
