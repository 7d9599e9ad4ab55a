"""glibc malloc settings for streaming conversion. Call before importing jax, numpy or tensorstore.

Conversion allocates and frees piece-sized buffers from several threads (ours, tensorstore's). With
glibc's defaults each thread's arena keeps freed pieces, and the dynamic mmap threshold moves
buffers of a few MiB from mmap into those arenas, so RSS grows with the number of shards converted
(measured: docs/benchmarks.md). One arena and mmap for every buffer over 128 KiB hand freed pieces
back to the OS; set before any thread exists, they act like MALLOC_ARENA_MAX=1
MALLOC_MMAP_THRESHOLD_=131072 in the environment. A no-op off glibc.
"""

import ctypes

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # From glibc's malloc.h.


def tune_for_streaming() -> bool:
  """Returns whether the settings took (glibc only)."""
  try:
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_ARENA_MAX, 1)) and bool(libc.mallopt(M_MMAP_THRESHOLD, 128 << 10))
  except (OSError, AttributeError):
    return False
