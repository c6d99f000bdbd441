"""Merging shard stores written with the same fingerprint into one."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import StoreError
from .fingerprint import fingerprint_difference
from .opening import check_schema, check_store_path, open_file, read_attr, utc_now
from .reader import Store
from .schema import EXAMPLES, PARTIAL_PREFIX, PROVENANCE, SHARD_EXAMPLES, example_name
from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity


def _check_mergeable(a: Path, b: Path, fa: dict, fb: dict, verb: str = "with") -> None:
    """Refuse to merge store ``b`` (fingerprint ``fb``) with (or into) store ``a``."""
    difference = fingerprint_difference(fb, fa)
    if difference is not None:
        raise StoreError(f"cannot merge {b.name} {verb} {a.name}: they were made "
                         f"{difference.explain(f'in {b.name}', f'in {a.name}', plural=True)}")


# an HDF5 attribute in the default (earliest) file format holds at most 64 KiB
_ATTR_LIMIT = 60_000


def _fit_attr(items: list[dict], shrink) -> str:
    """JSON of ``items``, condensed by ``shrink`` when hundreds of shards would overflow an attribute."""
    text = strict_dumps(items)
    if len(text) > _ATTR_LIMIT:
        text = strict_dumps(shrink(items))
    while len(text) > _ATTR_LIMIT and len(items) > 1:  # last resort: keep the newest
        items = items[len(items) // 2:]
        text = strict_dumps(shrink(items))
    return text


def _group_runs(runs: list[dict]) -> list[dict]:
    """One entry per launch instead of one per rank: the runs of a torchrun launch share
    command and world size; counts are summed, ranks and hosts listed."""
    out: list[dict] = []
    index: dict[str, dict] = {}
    for run in runs:
        if "rank" not in run:
            out.append(run)
            continue
        key = strict_dumps([run.get("command"), run.get("world_size"), run.get("kernel")])
        g = index.get(key)
        if g is None:
            g = {k: v for k, v in run.items() if k not in ("rank", "host", "shard", "requested", "to_score", "device")}
            g.update(ranks=0, hosts=[], requested=0, to_score=0, devices=[])
            index[key] = g
            out.append(g)
        g["ranks"] += 1
        g["requested"] += int(run.get("requested", 0))
        g["to_score"] += int(run.get("to_score", 0))
        g["started"] = min(g.get("started", run.get("started", "")), run.get("started", ""))
        for field_, value in (("hosts", run.get("host")), ("devices", run.get("device"))):
            if value is not None and value not in g[field_]:
                g[field_].append(value)
    return out


def _group_merges(merges: list[dict]) -> list[dict]:
    return [dict({k: v for k, v in m.items() if k != "shards"}, shards=len(m.get("shards", []))) for m in merges]


def _span(indices: list[int], limit: int = 8) -> str:
    shown = ", ".join(str(i) for i in indices[:limit])
    return shown + (f", … ({len(indices)} in all)" if len(indices) > limit else "")


@dataclass
class ShardCheck:
    """What :func:`inspect_shards` found: problems that stop a merge, and notes that do not."""

    fingerprint: dict
    indices: dict[str, list[int]]  # shard path -> complete examples in it
    overlap: list[int]  # examples present in more than one shard
    incomplete: dict[str, list[int]]  # shard path -> assigned examples it lacks
    missing_ranks: list[str]  # "k/n" of distributed shards not given

    def problems(self) -> list[str]:
        out = []
        for path, lacking in self.incomplete.items():
            out.append(f"{Path(path).name} lacks {len(lacking)} of the examples its process was given ({_span(lacking)}):"
                       " it was interrupted; run the same command again to finish it")
        if self.missing_ranks:
            out.append(f"the shards of {', '.join(self.missing_ranks)} are missing"
                       " (copy them here from the machines that wrote them)")
        return out

    def notes(self) -> list[str]:
        if not self.overlap:
            return []
        return [f"{len(self.overlap)} example{'s' if len(self.overlap) != 1 else ''} ({_span(self.overlap)})"
                " in more than one shard; each is taken once, from the first shard that holds it"]


def inspect_shards(shards: list[str | os.PathLike]) -> ShardCheck:
    """Check that shards can be merged: same fingerprint (else StoreError), and report
    overlapping examples, shards that lack examples they were given, and missing ranks."""
    if not shards:
        raise StoreError("merge needs at least one shard")
    paths = [Path(p) for p in shards]
    seen_paths: set[Path] = set()
    for p in paths:
        if p.resolve() in seen_paths:
            raise StoreError(f"{p} is given twice")
        seen_paths.add(p.resolve())
    base_fp = None
    indices: dict[str, list[int]] = {}
    incomplete: dict[str, list[int]] = {}
    ranks: dict[int, set[int]] = {}
    owner: dict[int, str] = {}
    overlap: set[int] = set()
    for p in paths:
        with Store(p) as r:
            fp = r.fingerprint
            base_fp = fp if base_fp is None else base_fp
            _check_mergeable(paths[0], p, base_fp, fp)
            have = r.indices()
            indices[str(p)] = have
            for i in have:
                if i in owner:
                    overlap.add(i)
                else:
                    owner[i] = str(p)
            shard = str(read_attr(r.f, "shard", "") or "")
            if shard and SHARD_EXAMPLES in r.f:
                lacking = sorted(set(int(x) for x in r.f[SHARD_EXAMPLES][()]) - set(have))
                if lacking:
                    incomplete[str(p)] = lacking
            if "/" in shard:
                k, n = (int(x) for x in shard.split("/"))
                ranks.setdefault(n, set()).add(k)
    missing = [f"rank {k} of {n}" for n, ks in sorted(ranks.items()) for k in range(n) if k not in ks]
    return ShardCheck(base_fp, indices, sorted(overlap), incomplete, missing)


def merge(shards: list[str | os.PathLike], out: str | os.PathLike, partial: bool = True) -> dict:
    """Join shards written with the same fingerprint into ``out`` (created whole, or extended
    example by example); examples already in ``out`` are kept, one in two shards is taken once.
    With ``partial=False`` the problems of :func:`inspect_shards` are a StoreError. Returns
    {"added": n, "skipped": n, "shards": [{"file", "shard", "examples", "added"} per shard]}.
    """
    check = inspect_shards(shards)
    if not partial and check.problems():
        raise StoreError("cannot merge: " + "; ".join(check.problems()) + " (or merge what is there with --partial)")
    from ..fileio import same_file

    out = Path(out)
    check_store_path(out)
    if any(out.resolve() == Path(p).resolve() or same_file(out, p) for p in shards):
        raise StoreError(f"{out} is one of the shards: choose another file")
    readers = [Store(p) for p in shards]
    tmp_path: Path | None = None
    try:
        base = readers[0]
        if not (out.exists() and out.stat().st_size > 0):
            tmp_path = out.with_name(f".{out.name}.merging-{os.getpid()}")
        target = open_file(out, "r+") if tmp_path is None else open_file(tmp_path, "w")
        try:
            if tmp_path is None:
                check_schema(target, out)
                _check_mergeable(out, base.path, json.loads(read_attr(target, "fingerprint", "{}")),
                                 base.fingerprint, verb="into")
            else:
                target.attrs.update(dict(base.f.attrs))
                target.attrs["shard"] = ""
                target.attrs["created"] = utc_now()
                target.create_group(EXAMPLES)
                base.f.copy(base.f[PROVENANCE], target, PROVENANCE)
                target[PROVENANCE].attrs["runs"] = "[]"
            dest = target[EXAMPLES]
            for name in list(dest):
                if name.startswith(PARTIAL_PREFIX):
                    del dest[name]
            prov = target[PROVENANCE]
            runs = json.loads(read_attr(prov, "runs", "[]"))
            entry = {"time": utc_now(), "shards": []}
            for r in readers:
                indices = r.indices()
                fresh = [name for name in map(example_name, indices) if name not in dest]
                for name in fresh:  # copied under a partial name, then renamed: a killed merge leaves no half example
                    r.f.copy(r.f[EXAMPLES][name], dest, PARTIAL_PREFIX + name)
                    target.flush()
                    dest.move(PARTIAL_PREFIX + name, name)
                shard = str(read_attr(r.f, "shard", "") or "")
                for run in json.loads(read_attr(r.f[PROVENANCE], "runs", "[]")):
                    run = dict(run, shard=shard or r.path.name)
                    if run not in runs:
                        runs.append(run)
                entry["shards"].append({"file": r.path.name, "shard": shard, "examples": len(indices),
                                        "added": len(fresh)})
            added = sum(d["added"] for d in entry["shards"])
            skipped = sum(d["examples"] for d in entry["shards"]) - added
            entry.update(added=added, skipped=skipped)
            merges = json.loads(read_attr(prov, "merges", "[]"))
            merges.append(entry)
            prov.attrs["runs"] = _fit_attr(runs, _group_runs)
            prov.attrs["merges"] = _fit_attr(merges, _group_merges)
            target.flush()
        finally:
            target.close()
        if tmp_path is not None:
            os.replace(tmp_path, out)
            tmp_path = None
        return {"added": added, "skipped": skipped, "shards": entry["shards"]}
    finally:
        for r in readers:
            r.close()
        if tmp_path is not None and tmp_path.exists():
            tmp_path.unlink()
