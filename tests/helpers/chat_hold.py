"""``laplax-chat`` whose answers to "(hold)" never end by themselves (the
tests' hook for a stop that must land during an answer, on a machine of any
speed).

    python -c "from helpers import chat_hold; chat_hold.main()" ARGS   # cwd tests/ or on sys.path

runs laplax.proj.nanochat.chat's command line with ``ChatEngine.tokens`` wrapped: an answer
to a message (the prompt's last) with :data:`MARK` gives its first real token, then the
same token again every :data:`STEP_S` seconds, forever (each a short
"decoding step"); other answers are the real ones. Ctrl-C in the terminal,
or a server's shutdown, is then always what ends it.
"""

import time

STEP_S = 0.1
MARK = "(hold)"


def hold_marked_answers() -> None:
  """Wraps ``ChatEngine.tokens`` (see the module docstring)."""
  import numpy as np

  from laplax.proj.nanochat.chat.engine import ChatEngine

  real = ChatEngine.tokens

  def tokens(self, prompt, **kw):
    it = real(self, prompt, **kw)
    last = self.tokenizer.decode(np.asarray(prompt, np.int32)).rsplit("<|user_start|>", 1)[-1]
    if MARK not in last:  # the last message asks for a held answer
      return it
    return _forever(it)

  ChatEngine.tokens = tokens


def _forever(it):
  try:
    first = next(iter(it))
    yield first
    while True:
      time.sleep(STEP_S)
      yield first
  finally:
    it.close()


def main() -> None:
  """``laplax-chat`` (its ``run_cli``) with the answers to :data:`MARK` held."""
  hold_marked_answers()
  from laplax.proj.nanochat.chat import cli

  cli.run_cli()
