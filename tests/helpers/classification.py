"""How far above chance a short classification run must be."""

import scipy.stats

K = 10


def chance_threshold(n, classes=K, p_value=1e-9):
  """The accuracy that a classifier at chance (``1 / classes``) exceeds over
  ``n`` independent examples with probability below ``p_value`` (binomial tail)."""
  return (scipy.stats.binom.isf(p_value, n, 1.0 / classes) + 1) / n
