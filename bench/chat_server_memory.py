"""Memory of a real chat server over many requests: its RSS after request 10 and after the last.

    python bench/chat_server_memory.py --workdir runs/chat/sft
    python bench/chat_server_memory.py --workdir runs/chat/sft --requests 200 --max_tokens 4

Starts ``python -m laplax.proj.nanochat.chat --workdir WORKDIR --web --port 0`` as its own
process (the port it prints is read from its stderr), sends ``--requests``
short requests one after another with httpx to ``POST /chat/completions``
(four prompts of 1 to about 60 tokens in turn, ``--max_tokens`` tokens each,
temperature 1 with the request's number as its seed, so the answers differ),
and reads the server's resident memory from ``/proc/PID/status`` (``VmRSS``)
after request 10 (compilation done) and after the last. Printed: both
figures in MiB, their ratio (last over tenth) and the server's ``/health``
counters. The server is stopped with SIGINT at the end (exit code 130).
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (bench/common.py)

PROMPTS = ["hi", "Which is hot? " * 3, "The sun is hot. " * 9, "2+2=4. " * 30]


def rss_kib(pid: int) -> int:
  """``VmRSS`` of process ``pid`` in KiB."""
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1])
  raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--workdir", required=True, help="a train.py language-model workdir")
  p.add_argument("--requests", type=int, default=200, help="requests in all (default 200)")
  p.add_argument("--warmup", type=int, default=10, help="the first figure's request (default 10)")
  p.add_argument("--max_tokens", type=int, default=4, help="tokens of each answer (default 4)")
  args = p.parse_args(argv)
  if not 1 <= args.warmup < args.requests:
    p.error("--warmup must be in [1, --requests)")
  import httpx

  chat_args = ["--workdir", args.workdir, "--max_tokens", str(args.max_tokens)]
  server, url = common.start_chat_server(chat_args, ROOT)
  try:
    figures = {}
    with httpx.Client(base_url=url, timeout=600) as client:
      for i in range(args.requests):
        body = {
          "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
          "temperature": 1.0,
          "seed": i,
        }
        with client.stream("POST", "/chat/completions", json=body) as r:
          if r.status_code != 200:
            raise SystemExit(f"request {i + 1}: {r.status_code} {r.read()!r}")
          text = "".join(r.iter_lines())
        if '"done": true' not in text:
          raise SystemExit(f"request {i + 1} did not finish: {text!r}")
        if i + 1 in (args.warmup, args.requests):
          figures[i + 1] = rss_kib(server.pid)
      health = client.get("/health").json()
  finally:
    if server.poll() is None:
      server.send_signal(signal.SIGINT)
      try:
        server.wait(timeout=60)
      except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
  first, last = figures[args.warmup], figures[args.requests]
  print(f"command: python -m laplax.proj.nanochat.chat {' '.join(chat_args)} --web --port 0")
  print(f"server RSS after request {args.warmup}: {first / 1024:.1f} MiB")
  print(f"server RSS after request {args.requests}: {last / 1024:.1f} MiB")
  print(f"ratio (request {args.requests} / request {args.warmup}): {last / first:.3f}")
  print(f"health: {health}; server exit code {server.returncode}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
