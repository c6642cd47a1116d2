"""The old place of nanochat's chat data, now :mod:`laplax.proj.nanochat.data`:
only the commands ``python -m laplax.data.chat.fixtures`` and ``python -m
laplax.data.chat.mixture`` stay here."""
