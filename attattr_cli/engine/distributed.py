"""Scoring across processes, GPUs and machines, launched by torchrun. No printing here.

Every process loads the model and the data and computes the same split of the examples (by token
count, :func:`balance`: a pure function of the chosen examples, those already in --out, and the
number of processes); rank k writes its share into the shard ``OUT.rank{k}-of-{n}.h5`` next to
--out (so a restarted rank resumes it), then rank 0 merges the shards it can see into --out,
checks that every requested example is there, and deletes the shards. The processes talk over
gloo (a few bytes: status, the examples already in --out, the fingerprint); the scoring runs on
``cuda:LOCAL_RANK`` or the CPU. docs/distributed.md, "What happens".
"""

from __future__ import annotations

import datetime as _dt
import heapq
import os
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..errors import AttattrError, DistributedError, OptionError, StoreError, first_line
from ..store.fingerprint import fingerprint_difference
from .run import PreparedRun, Progress, ScoreReport, ScoreRequest, prepare_run, score_into

DEFAULT_TIMEOUT = 3600


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in a torchrun launch."""

    rank: int
    world_size: int
    local_rank: int
    master: str

    @property
    def shard(self) -> str:
        return f"{self.rank}/{self.world_size}"


def detect(environ: dict | None = None) -> DistEnv | None:
    """The torchrun environment of this process, or None when it was not started by torchrun."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        raise DistributedError(
            f"RANK={env.get('RANK')!r}, WORLD_SIZE={env.get('WORLD_SIZE')!r}, LOCAL_RANK={env.get('LOCAL_RANK')!r}"
            " are not numbers: start attattr with torchrun, or unset them"
        ) from None
    if world < 1 or not 0 <= rank < world:
        raise DistributedError(f"RANK={rank} does not fit WORLD_SIZE={world}")
    master = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
    return DistEnv(rank, world, local, master)


def balance(tokens: dict[int, int], world_size: int) -> list[list[int]]:
    """Split examples (index -> token count) over ``world_size`` ranks with equal token sums.

    Greedy longest-processing-time: the longest example first onto the rank with the fewest
    tokens so far (ties: lower rank; equal lengths: lower index first). Deterministic, so
    every rank computes the same split. Each rank's list is sorted by index.
    """
    if world_size < 1:
        raise OptionError(f"cannot split work over {world_size} processes")
    parts: list[list[int]] = [[] for _ in range(world_size)]
    heap = [(0, r) for r in range(world_size)]
    for i in sorted(tokens, key=lambda i: (-tokens[i], i)):
        load, r = heapq.heappop(heap)
        parts[r].append(i)
        heapq.heappush(heap, (load + tokens[i], r))
    return [sorted(p) for p in parts]


def imbalance(tokens: dict[int, int], parts: list[list[int]]) -> float:
    """Largest rank's token sum over the mean (1.0 is perfect)."""
    loads = [sum(tokens[i] for i in p) for p in parts]
    mean = sum(loads) / len(loads) if loads else 0
    return max(loads) / mean if mean else 1.0


def shard_path(out: str | os.PathLike, rank: int, world_size: int) -> Path:
    """``scores.h5`` -> ``scores.rank1-of-4.h5`` beside it."""
    out = Path(out)
    return out.with_name(f"{out.stem}.rank{rank}-of-{world_size}{out.suffix}")


def rank_device(device: str, env: DistEnv) -> str:
    """The device of this rank: ``auto`` and ``cuda`` become ``cuda:LOCAL_RANK`` (modulo the
    GPUs present, so several processes may share one); ``cpu`` and ``cuda:N`` stay."""
    if device in ("auto", "cuda"):
        if torch.cuda.is_available():
            return f"cuda:{env.local_rank % torch.cuda.device_count()}"
        return "cpu" if device == "auto" else device
    return device


@dataclass
class DistReport:
    """What one rank did, and on rank 0 what the merge did."""

    rank: int
    world_size: int
    out: str
    shard: str
    own: ScoreReport
    reports: list[dict] = field(default_factory=list)  # every rank's counts (rank 0 only)
    tokens_per_rank: list[int] = field(default_factory=list)
    imbalance: float = 1.0
    already: int = 0  # examples in --out before the run
    merged: dict | None = None  # {"added", "skipped"} on rank 0
    complete: bool = True  # every requested example is in --out (rank 0)
    shards_deleted: bool = False
    shards_elsewhere: list[str] = field(default_factory=list)  # shards rank 0 could not see
    seconds: float = 0.0

    @property
    def scored(self) -> int:
        return sum(r["scored"] for r in self.reports) if self.reports else self.own.scored

    @property
    def shard_names(self) -> list[str]:
        """Every rank's shard beside --out."""
        return [str(shard_path(self.out, k, self.world_size)) for k in range(self.world_size)]

    @property
    def skipped(self) -> int:
        return sum(r["skipped"] for r in self.reports) if self.reports else self.own.skipped


class _Group:
    """The process group and the collective steps the ranks take together."""

    def __init__(self, env: DistEnv, timeout: float):
        import torch.distributed as dist

        self.dist = dist
        self.env = env
        self.host = socket.gethostname()
        self.owned = False
        if not dist.is_available():
            raise DistributedError("this PyTorch build has no torch.distributed")
        if not dist.is_initialized():
            if "?" in env.master:
                raise DistributedError(
                    f"RANK and WORLD_SIZE are set but not MASTER_ADDR and MASTER_PORT ({env.master}):"
                    " start attattr with torchrun, or set all four"
                )
            try:
                wait = _dt.timedelta(seconds=timeout)
                store, _, _ = next(dist.rendezvous("env://", env.rank, env.world_size, timeout=wait))
                # torchrun keeps its store across restarts (--max-restarts): keys of an earlier
                # attempt would point the ranks at processes that are gone
                attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
                store = dist.PrefixStore(f"attattr/attempt-{attempt}", store)
                dist.init_process_group("gloo", store=store, timeout=wait, rank=env.rank,
                                        world_size=env.world_size)
            except (RuntimeError, ValueError) as exc:
                raise DistributedError(
                    f"rank {env.rank} of {env.world_size} could not join the others at {env.master}"
                    f" (--dist-timeout {timeout:g} s): {first_line(exc)}"
                ) from exc
            self.owned = True

    def gather(self, obj):
        out = [None] * self.env.world_size
        try:
            self.dist.all_gather_object(out, obj)
        except RuntimeError as exc:
            raise DistributedError(
                f"rank {self.env.rank} lost the other processes (one failed, was killed, or took longer than"
                f" --dist-timeout): {first_line(exc)}"
            ) from exc
        return out

    def broadcast(self, obj):
        box = [obj]
        try:
            self.dist.broadcast_object_list(box, src=0)
        except RuntimeError as exc:
            raise DistributedError(f"rank {self.env.rank} lost rank 0: {first_line(exc)}") from exc
        return box[0]

    def together(self, step: Callable[[], object]):
        """Run ``step`` on every rank; if any rank fails, every rank raises the lowest failing
        rank's error (marked ``collective``, so only rank 0 needs to print it)."""
        failure = value = own = None
        try:
            value = step()
        except AttattrError as exc:
            own = exc
            failure = (exc.exit_code, str(exc))
        except Exception as exc:  # a bug: keep its traceback on this rank, tell the others
            own = exc
            failure = (1, f"{type(exc).__name__}: {exc}")
        statuses = self.gather((failure, self.host))
        failed = [(k, s) for k, s in enumerate(statuses) if s[0] is not None]
        if failed:
            k, ((code, message), host) = failed[0]
            if own is not None and not isinstance(own, AttattrError):
                raise own
            if k != 0:
                message = f"rank {k} of {self.env.world_size} (on {host}) failed: {message}"
            exc = DistributedError(message)
            exc.exit_code = code
            exc.collective = True
            raise exc from own
        return value

    def close(self) -> None:
        if self.owned and self.dist.is_initialized():
            self.dist.destroy_process_group()


def _already_in(out: Path, fingerprint: dict) -> list[int]:
    """Examples in an existing --out (rank 0 reads it; a mismatched store is refused)."""
    from ..store import Store, check_fingerprint

    if not out.exists() or out.stat().st_size == 0:
        return []
    with Store(out) as s:
        check_fingerprint(out, s.fingerprint, fingerprint)
        return s.indices()


def score_distributed(req: ScoreRequest, env: DistEnv, progress: Progress | None = None,
                      warn: Callable[[str], None] | None = None, keep_shards: bool = False,
                      timeout: float = DEFAULT_TIMEOUT, loaded=None) -> DistReport:
    """This rank's part of a torchrun launch: score its share into its shard; rank 0 merges."""
    from ..store import Store, merge

    t0 = time.perf_counter()
    out = Path(req.out)
    group = _Group(env, timeout)
    try:
        req = replace(req, device=rank_device(req.device, env))
        prep: PreparedRun = group.together(lambda: prepare_run(req, loaded))
        prep.scorer.warn = warn
        fingerprint = dict(prep.fingerprint, store_dtype=req.store_dtype)

        fps = group.gather(fingerprint)

        def same_inputs():
            if fps[env.rank] != fps[0]:
                how = fingerprint_difference(fps[0], fps[env.rank]).explain("on rank 0", f"on rank {env.rank}")
                raise DistributedError(
                    f"rank {env.rank} loaded other inputs than rank 0, {how}: give every machine the same model,"
                    " data and options"
                )

        group.together(same_inputs)
        already = group.together(lambda: _already_in(out, fingerprint) if env.rank == 0 else None)
        already = set(group.broadcast(already))
        tokens = prep.tokens()
        todo = {e.index: tokens[e.index] for e in prep.picked if e.index not in already}
        parts = balance(todo, env.world_size)
        mine = shard_path(out, env.rank, env.world_size)
        info = {"rank": env.rank, "world_size": env.world_size, "host": group.host}
        own = group.together(lambda: score_into(prep, str(mine), parts[env.rank], progress=progress,
                                                shard=env.shard, run_info=info))
        counts = group.gather({"rank": env.rank, "host": group.host, "scored": own.scored,
                               "skipped": own.skipped, "total": own.total, "shard": str(mine)})
        report = DistReport(
            rank=env.rank, world_size=env.world_size, out=str(out), shard=str(mine), own=own, reports=counts,
            tokens_per_rank=[sum(todo[i] for i in p) for p in parts], imbalance=imbalance(todo, parts),
            already=len(already),
        )
        if env.rank == 0:
            visible, elsewhere = [], []
            for k, part in enumerate(parts):
                path = shard_path(out, k, env.world_size)
                try:
                    with Store(path) as s:
                        here = set(s.indices())
                except StoreError:  # not on this machine (or not readable from it)
                    if part:
                        elsewhere.append(path)
                    continue
                (visible if set(part) <= here else elsewhere).append(path)
            report.merged = merge([str(p) for p in visible], str(out)) if visible else {"added": 0, "skipped": 0}
            present: set[int] = set()
            if out.exists():  # not when every shard is on another machine and --out is new
                with Store(out) as s:
                    present = set(s.indices())
            wanted = {e.index for e in prep.picked}
            lacking = sorted(wanted - present)
            report.shards_elsewhere = [str(p) for p in elsewhere]
            report.complete = not lacking
            if lacking and not elsewhere:
                raise StoreError(f"{out} lacks {len(lacking)} requested examples after the merge"
                                 f" ({', '.join(map(str, lacking[:8]))}); the shards were kept")
            if report.complete and not keep_shards:
                for p in visible:
                    p.unlink(missing_ok=True)
                report.shards_deleted = True
        report.seconds = time.perf_counter() - t0
        return report
    finally:
        group.close()
