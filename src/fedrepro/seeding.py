"""Seeds derived from (run seed, purpose, round, client): every random draw of a run is a pure
function of its coordinates, so a run resumed from a checkpoint draws exactly what it would have."""

from __future__ import annotations

import numpy as np

# Purposes keep the streams of one run independent of each other.
INIT, SAMPLING, BATCHES, DELAYS, SERVER, STRAGGLERS = 1, 2, 3, 4, 5, 6


def derive_seed(*coords: int) -> int:
    """A 32-bit seed from integer coordinates (NumPy's SeedSequence hashing)."""
    return int(np.random.SeedSequence([int(c) for c in coords]).generate_state(1)[0])


def rng_for(*coords: int) -> np.random.Generator:
    """A NumPy generator for these coordinates."""
    return np.random.default_rng(derive_seed(*coords))
