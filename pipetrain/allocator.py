"""Keep freed CPU memory in the process instead of returning it to the OS (glibc only).

Training frees and re-allocates the same large buffers every step: activations, and weight
gradients when the optimizer sets them to None. By default glibc serves blocks above its mmap
threshold with fresh ``mmap`` calls and gives them back on ``free``, so every step page-faults its
whole working set in again. On the 2-core CI machine this made single-process training of the
8-layer MLP (batch 128) 14% slower (560-574 ms against 489 ms per step), and made forwards
measured in isolation faster than the same forwards in training.

:func:`keep_freed_memory` turns that off with ``mallopt``: no mmap for large blocks, no trimming
of the heap's top. Memory stays reserved at the peak working set, as CUDA's caching allocator does
on GPUs. It is a no-op where glibc is absent (macOS, musl); CUDA memory is unaffected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

__all__ = ["keep_freed_memory"]

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


@functools.cache
def keep_freed_memory() -> bool:
    """Apply the allocator settings once per process; True if they took effect."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    log.debug("glibc mallopt (no mmap, no trim): %s", "applied" if ok else "refused")
    return ok
