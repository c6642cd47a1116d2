"""``python -m laplax.sandbox FILE``: :func:`laplax.sandbox.main`."""

import sys

from laplax.sandbox import main

if __name__ == "__main__":
  sys.exit(main())
