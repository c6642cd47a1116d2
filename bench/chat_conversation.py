"""Three turns with a chat workdir in the terminal and on the web API, checked against eval.py --sample.

    python bench/chat_conversation.py --workdir runs/chat/sft
    python bench/chat_conversation.py --workdir runs/chat/sft --max_tokens 48 \\
        --question "Hello!" --question "What is 12*7?" --question "Thanks. Why?"

What it does, all greedy (temperature 0), ``--max_tokens`` tokens at most per answer:

1. The terminal: ``python -m laplax.proj.nanochat.chat --workdir W --temperature 0
   --max_tokens N`` on a pseudo-terminal; the questions are typed one by one
   and each answer is read as printed. The prompt of turn k is the
   conversation as the terminal keeps it, tokens (``<|bos|>``, each turn
   ``<|user_start|>`` ... ``<|assistant_end|>``); the script rebuilds those
   tokens with :class:`laplax.proj.nanochat.chat.engine.ChatEngine` (the terminal's own
   decoding) and checks that they decode to what was printed.
2. ``eval.py --sample``: for each turn, ``eval.py --workdir W --sample PROMPT
   --temperature 0 --max_new_tokens N`` in a process of its own (N cut to
   where the terminal stops at a full context), PROMPT the turn's prompt
   tokens as text. ``eval.py`` encodes special-token strings
   as plain text (tiktoken's ``encode_ordinary``), so the process runs eval.py
   with the tokenizer's ``encode`` allowing the special tokens (tiktoken's
   ``encode(text, allowed_special="all")``); the script checks that this gives
   the terminal's prompt tokens. Its continuation, cut at the first
   ``<|assistant_end|>`` or ``<|bos|>``, is compared with the terminal's
   answer (up to ``<|python_end|>`` where the calculator ran: eval.py has no
   calculator).
3. The page's API: ``python -m laplax.proj.nanochat.chat --workdir W --web --port 0
   --temperature 0 --max_tokens N``; the same questions are sent to ``POST
   /chat/completions`` with httpx, each request carrying the conversation so
   far as texts (as the page does). Stopped with SIGINT.

Printed: per turn the question, the three answers (Python reprs), whether
they are equal, whether the calculator ran; then the server's exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (bench/common.py)

sys.path.insert(0, ROOT)
QUESTIONS = [
  "Hello! Who are you?",
  "Ada has 3 boxes with 4 apples each and finds 2 more apples. How many apples does Ada have?",
  "Thanks. What is 12*7?",
]
EVAL_WITH_SPECIAL_TOKENS = """\
import runpy, sys
import numpy as np
from laplax.data.text import nanochat_tokenizer as t
t.NanochatTokenizer.encode = lambda self, text: np.asarray(
    self.encoding.encode(text, allowed_special="all"), np.int32)
sys.argv = ["eval.py", *sys.argv[1:]]
runpy.run_path("eval.py", run_name="__main__")
"""
STOPS = ("<|assistant_end|>", "<|bos|>")


class Terminal:
  """``python -m laplax.proj.nanochat.chat ARGS`` on a pseudo-terminal."""

  def __init__(self, args, env):
    master, slave = pty.openpty()
    self.proc = subprocess.Popen(
      [sys.executable, "-m", "laplax.proj.nanochat.chat", *args],
      stdin=slave,
      stdout=slave,
      stderr=slave,
      cwd=ROOT,
      env=env,
      start_new_session=True,
    )
    os.close(slave)
    self.fd, self.text = master, ""

  def expect(self, pattern, timeout=600):
    deadline = time.monotonic() + timeout
    while True:
      m = re.search(pattern, self.text)
      if m:
        before, self.text = self.text[: m.start()], self.text[m.end() :]
        return before
      left = deadline - time.monotonic()
      if left <= 0:
        raise SystemExit(f"the terminal printed no {pattern!r}: {self.text!r}")
      ready, _, _ = select.select([self.fd], [], [], left)
      if ready:
        try:
          chunk = os.read(self.fd, 4096)
        except OSError:
          chunk = b""
        if not chunk:
          raise SystemExit(f"the terminal ended before {pattern!r}: {self.text!r}")
        self.text += chunk.decode("utf-8", "replace").replace("\r\n", "\n")

  def type(self, keys):
    os.write(self.fd, keys.encode())


def cut(text):
  """``text`` up to the first stop token's name."""
  ends = [text.index(s) for s in STOPS if s in text]
  return text[: min(ends)] if ends else text


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--workdir", required=True, help="a chat (SFT or mid-training) workdir")
  p.add_argument("--max_tokens", type=int, default=96)
  p.add_argument("--question", action="append", help="a turn (default: three built-in ones)")
  args = p.parse_args(argv)
  questions = args.question or QUESTIONS
  env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
  n = str(args.max_tokens)
  import httpx
  import numpy as np

  from laplax.proj.nanochat.chat.engine import ChatEngine

  engine = ChatEngine.load(args.workdir)
  if not engine.chat:
    raise SystemExit(f"{args.workdir}: {engine.mode_line}; give a chat workdir")
  decode = lambda ids: engine.tokenizer.decode(np.asarray(ids, np.int32))
  special = engine.special

  # 1. The terminal.
  term = Terminal(["--workdir", args.workdir, "--temperature", "0", "--max_tokens", n], env)
  print("terminal:", term.expect(r"User: ").strip().replace("\n", " | "))
  turns, history = [], engine.start()
  for question in questions:
    term.type(question + "\n")
    term.expect(r"Assistant: ")
    printed = term.expect(r"\nUser: ").rstrip("\n")
    prompt = history + engine.user_turn(question)
    answer = list(engine.tokens(prompt, max_tokens=args.max_tokens, temperature=0.0))
    turns.append(
      {
        "question": question,
        "prompt": prompt,
        "terminal": printed,
        "rebuilt_equal": decode(answer).replace("\r\n", "\n") == printed,
        "calculator": special["<|python_start|>"] in answer
        and special["<|output_start|>"] in answer,
        "python_start": special["<|python_start|>"] in answer,
      }
    )
    history = prompt + answer + [special["<|assistant_end|>"]]
  term.type("/quit\n")
  print(f"terminal exit code {term.proc.wait(timeout=60)}")
  os.close(term.fd)

  # 2. eval.py --sample on each turn's prompt.
  for turn in turns:
    text = decode(turn["prompt"])
    reencoded = engine.tokenizer.encoding.encode(text, allowed_special="all")
    turn["prompt_tokens_equal"] = reencoded == list(turn["prompt"])
    room = min(args.max_tokens, engine.context - len(turn["prompt"]) + 1)  # the terminal's stop
    run = subprocess.run(
      [sys.executable, "-c", EVAL_WITH_SPECIAL_TOKENS, "--workdir", args.workdir]
      + ["--sample", text, "--temperature", "0", "--max_new_tokens", str(room)],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
    )
    if run.returncode != 0 or text not in run.stdout:
      raise SystemExit(f"eval.py --sample failed ({run.returncode}): {run.stderr[-2000:]}")
    continuation = run.stdout[run.stdout.rindex(text) + len(text) :].rstrip("\n")
    turn["eval"] = cut(continuation)
    mine = turn["terminal"]
    if turn["python_start"] and "<|python_end|>" in mine:  # eval.py has no calculator
      end = mine.index("<|python_end|>") + len("<|python_end|>")
      turn["eval_equal"] = turn["eval"][:end] == mine[:end]
    else:
      turn["eval_equal"] = turn["eval"] == mine

  # 3. The page's API.
  server, url = common.start_chat_server(
    ["--workdir", args.workdir, "--temperature", "0", "--max_tokens", n], ROOT
  )
  try:
    print("web:", url)
    messages = []
    with httpx.Client(base_url=url, timeout=600) as client:
      for turn in turns:
        messages.append({"role": "user", "content": turn["question"]})
        turn["web_prompt_equal"] = engine.prompt(messages).tolist() == list(turn["prompt"])
        with client.stream("POST", "/chat/completions", json={"messages": messages}) as r:
          events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
        if r.status_code != 200 or events[-1] != {"done": True}:
          raise SystemExit(f"the API answered {r.status_code}: {events}")
        turn["web"] = "".join(e["token"] for e in events[:-1])
        turn["web_equal"] = turn["web"] == turn["terminal"]
        messages.append({"role": "assistant", "content": turn["web"]})
  finally:
    server.send_signal(signal.SIGINT)
    code = server.wait(timeout=60)

  for k, turn in enumerate(turns, 1):
    print(f"\nturn {k}: {turn['question']!r}")
    print(f"  terminal: {turn['terminal']!r}")
    print(f"  eval.py --sample (cut at the stop token): {turn['eval']!r}")
    print(f"  web API: {turn['web']!r}")
    print(
      f"  terminal tokens rebuilt: {turn['rebuilt_equal']}; eval.py prompt = terminal prompt: "
      f"{turn['prompt_tokens_equal']}; eval.py = terminal: {turn['eval_equal']}; web prompt = "
      f"terminal prompt: {turn['web_prompt_equal']}; web = terminal: {turn['web_equal']}; "
      f"calculator ran: {turn['calculator']}"
    )
  print(f"\nweb server exit code after SIGINT: {code}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
