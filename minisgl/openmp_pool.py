"""Keep one thread of the process running torch's parallel ops, where two would slow both.

libgomp, the OpenMP runtime of torch's CPU build, gives every thread that runs a parallel region
a pool of worker threads of its own, and counts the workers of all the pools. While there are no
more of them than cores, a worker spins for a while after each region and the next region finds
it awake. Once there are more (a second thread has run a parallel op on a 2-core machine), it
spins about 100 iterations (libgomp's gomp_throttled_spin_count_var) and then sleeps, and every
parallel op waits for a futex wake-up per worker: SmolLM2's batch-1 decode step makes about 270
of them. The overlap loop's forward thread is such a second thread: it ran a bfloat16 batch-1
step in 15.3 ms where the normal loop takes 9 (Zen 4 EPYC, 2 cores). ``release_openmp_workers``
makes the thread that calls it give its pool back (OpenMP 5's ``omp_pause_resource_all``, which
ends its workers), and ``one_openmp_thread`` keeps a thread from building one again while it runs
a block of torch ops.
ThreadedDriver (scheduler_driver.py) avoids the same trap another way: the thread that runs the
model builds it, and a model built by the caller measured 20% slower there.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Iterator

import torch  # noqa: F401  (loads torch's libgomp first: _libgomp must find that copy, not the system's)


@functools.cache
def _libgomp():
    # torch has loaded it already; by its soname, dlopen returns that copy.
    try:
        lib = ctypes.CDLL("libgomp.so.1")
    except OSError:  # another OpenMP runtime (or none): nothing to release
        return None
    return lib if hasattr(lib, "omp_pause_resource_all") else None


def release_openmp_workers() -> bool:
    """End the calling thread's OpenMP workers; True if libgomp did. Its next parallel op, if it
    runs one with more than one thread, builds them again."""
    lib = _libgomp()
    omp_pause_soft = 1
    return lib is not None and lib.omp_pause_resource_all(omp_pause_soft) == 0


@contextlib.contextmanager
def one_openmp_thread() -> Iterator[None]:
    """Run the block's torch ops on the calling thread alone, so that they build no OpenMP pool.

    Through OpenMP's own per-thread setting: ``torch.set_num_threads`` also sets the count that
    another thread takes at its first parallel op, and the forward thread, starting its first op
    while this block runs, took 1."""
    lib = _libgomp()
    if lib is None:
        yield
        return
    threads = lib.omp_get_max_threads()
    lib.omp_set_num_threads(1)
    try:
        yield
    finally:
        lib.omp_set_num_threads(threads)
