"""One BLAS thread for a twin process.

numpy's bundled OpenBLAS starts a pool of one thread per core when numpy is
imported. A run is one Python thread, and its numpy work (seeded draws,
elementwise pricing of long decode stretches, small least-squares fits) is
too small for BLAS to split, so the pool only spins while it starts: on a
2-core machine ``python -c "import numpy"`` takes 0.28 s CPU (median of 7),
0.16 s with ``OPENBLAS_NUM_THREADS=1``. The command line (:func:`twin.cli.main`)
and ``twin bench``'s measured child therefore ask for one thread before
numpy loads, unless the user's environment says otherwise; a program that
imports ``twin`` as a library keeps its own setting. The commands ``twin
bench --vs`` times get the environment as the user gave it (:func:`user_env`).
"""

from __future__ import annotations

import os
import sys

_VAR = "OPENBLAS_NUM_THREADS"
_set_here = False


def one_blas_thread() -> None:
    """Ask OpenBLAS for one thread, if numpy is not loaded yet and the
    environment does not name a count."""
    global _set_here
    if "numpy" in sys.modules or _VAR in os.environ:
        return
    os.environ[_VAR] = "1"
    _set_here = True


def user_env() -> dict[str, str]:
    """This process's environment as the user gave it (without the setting
    :func:`one_blas_thread` made)."""
    env = dict(os.environ)
    if _set_here:
        env.pop(_VAR, None)
    return env
