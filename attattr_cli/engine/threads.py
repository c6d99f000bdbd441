"""How many threads torch runs a scoring run on: chosen for the work unless given.

A pass over a short input is a handful of small matrix products: splitting them over threads
costs more in hand-offs than it saves, and on a machine other processes keep busy a thread
that waits for a core stalls every product (a 5-token SmolLM2 prompt: 5-9 CPU s on one thread,
77 s wall with torch's default threads on a loaded 2-core machine). A long input's products
are large enough to share, but only cores no one else is using help. So:

* fewer than MIN_TOKENS_PER_THREAD tokens in a pass (an example's tokens, times the examples a
  group of short classifier inputs scores together): one thread;
* else as many as the cores free now (this process's usable cores minus the load average
  of the last minute, rounded; at least 1), and no more than the tokens allow
  (one per MIN_TOKENS_PER_THREAD tokens);
* ``--threads N`` / ``threads=N`` gives the count.

The count is set for the run and torch's own is restored after it (docs/long-context.md has
the figures measured on this machine).
"""

from __future__ import annotations

import contextlib
import os

MIN_TOKENS_PER_THREAD = 256


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def free_cores() -> int:
    """Cores no other process is using now: the usable cores minus the last minute's load."""
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return cores
    return max(1, min(cores, int(round(cores - load))))


def choose(tokens: int, requested: int | None = None) -> int:
    """The thread count for inputs of at most ``tokens`` tokens (``requested``: as given)."""
    if requested is not None:
        return int(requested)
    if tokens < MIN_TOKENS_PER_THREAD:
        return 1
    return max(1, min(free_cores(), tokens // MIN_TOKENS_PER_THREAD))


@contextlib.contextmanager
def using(count: int):
    """torch on ``count`` threads inside, its own count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield int(count)
    finally:
        torch.set_num_threads(before)
