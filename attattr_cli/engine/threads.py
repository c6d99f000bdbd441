"""How many threads torch runs a scoring run on: chosen for the work unless given.

* fewer than MIN_TOKENS_PER_THREAD tokens in a pass (an example's tokens, times the examples a
  group scores together, in proportion to the model's width against REFERENCE_WIDTH): one thread
  (small products split over threads cost more in hand-offs, and stall on a busy machine);
* else as many as the cores free now (:func:`free_cores`), and no more than the tokens allow
  (one per MIN_TOKENS_PER_THREAD tokens);
* ``--threads N`` / ``threads=N`` gives the count, 1 to the machine's CPUs (:func:`check`).

The count is set for the run and torch's own is restored after it (docs/long-context.md,
"Threads", has the figures).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import time

MIN_TOKENS_PER_THREAD = 256
# the hidden width the token counts are measured at (SmolLM2-135M's): a pass of a narrower model
# counts its tokens in proportion (docs/long-context.md, "Threads")
REFERENCE_WIDTH = 576
SAMPLE_S = 0.25  # how long the machine's idle time is sampled (paid only by inputs that may use threads)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def most() -> int:
    """The most threads a run may ask for: this machine's CPUs (torch cannot take more than
    an int holds, and threads beyond the CPUs only wait for one)."""
    return os.cpu_count() or 1


def check(count, flag: str = "--threads", zero_ok: bool = False) -> None:
    """Refuse (OptionError, one line) a thread count outside 1 .. :func:`most` (``zero_ok``: 0,
    "leave torch's count as it is", is taken too); None passes (the count is chosen)."""
    from ..errors import OptionError

    if count is None:
        return
    least = 0 if zero_ok else 1
    if isinstance(count, bool) or not isinstance(count, int):
        raise OptionError(f"{flag} must be a whole number, got {count!r}")
    if not least <= count <= most():
        raise OptionError(f"{flag} must be between {least} and {most()} (this machine's CPUs), got {count}")


def _cpu_times(path: str = "/proc/stat") -> tuple[int, int]:
    """(idle, total) CPU time of the whole machine so far, in clock ticks (idle and I/O wait
    count as idle; guest time is already in user time)."""
    with open(path) as fh:
        ticks = [int(x) for x in fh.readline().split()[1:9]]
    return ticks[3] + ticks[4], sum(ticks)


def idle_cpus(sample: float = SAMPLE_S) -> float | None:
    """How many of the machine's CPUs were idle over the next ``sample`` seconds (None where
    /proc/stat cannot say)."""
    try:
        idle0, total0 = _cpu_times()
        time.sleep(sample)
        idle1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (idle1 - idle0) / (total1 - total0) * (os.cpu_count() or 1)


def free_cores() -> int:
    """Cores no other process is using now: the machine's idle CPUs over a short sample
    (``SAMPLE_S``, from /proc/stat), rounded, at least 1, at most the usable cores. Where
    /proc/stat is not there, the last minute's load average subtracted from the usable cores
    (it lags: right after a two-thread run on an idle 2-core machine it still counts that run)."""
    cores = usable_cores()
    idle = idle_cpus()
    if idle is None:
        try:
            idle = cores - os.getloadavg()[0]
        except (AttributeError, OSError):
            return cores
    return max(1, min(cores, int(round(idle))))


def choose(tokens: int, requested: int | None = None, width: int | None = None) -> int:
    """The thread count for inputs of at most ``tokens`` tokens of a model ``width`` wide
    (its hidden size; None: counted as REFERENCE_WIDTH) (``requested``: as given; None inside
    a run given a count, :func:`on_threads`: that count)."""
    if requested is None:
        requested = _GIVEN.get()
    if requested is not None:
        return int(requested)
    work = tokens if not width else tokens * width / REFERENCE_WIDTH
    if work < MIN_TOKENS_PER_THREAD:
        return 1
    return max(1, min(free_cores(), int(work // MIN_TOKENS_PER_THREAD)))


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


_GIVEN = contextvars.ContextVar("attattr_threads", default=None)  # the count a whole run was given


def on_threads(fn):
    """A library function that runs a model on its ``threads=`` keyword (None: as before, each
    scoring inside chooses its own count and the rest runs on torch's): torch's count set for
    the call and restored after, and every scoring inside (:func:`choose`) given it too."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        requested = kwargs.get("threads")
        if requested is None:
            return fn(*args, **kwargs)
        token = _GIVEN.set(int(requested))
        try:
            with using(int(requested)):
                return fn(*args, **kwargs)
        finally:
            _GIVEN.reset(token)

    return run
