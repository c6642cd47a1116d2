"""``python -m laplax.data.listops --out DIR``: generated ListOps in the LRA
release's format (:mod:`laplax.data.lra.listops`)."""

import sys

from laplax.data.lra.listops import main

if __name__ == "__main__":
  sys.exit(main())
