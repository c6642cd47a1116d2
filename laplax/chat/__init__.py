"""The old place of the chat program, now :mod:`laplax.proj.nanochat.chat`: only
the command ``python -m laplax.chat`` stays here (its ``__main__.py``)."""
