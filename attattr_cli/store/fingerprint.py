"""How two run fingerprints differ, in words. A fingerprint (docs/store.md, "Root attributes")
holds ``weights_sha256``, ``data``, ``data_sha256``, ``options`` (a dict) and a few more fields;
resuming a store, merging shards and checking a torchrun launch's ranks refuse fingerprints that
differ and say how with :func:`fingerprint_difference`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import StoreError


def _short(value) -> str:
    text = str(value)
    return text[:12] + "…" if len(text) > 12 else text


@dataclass(frozen=True)
class FingerprintDifference:
    """The most telling difference between two fingerprints.

    ``kind`` is "model" (other weights), "data" (another file or other contents), "options"
    (``keys`` lists the options that differ) or "field" (``keys`` lists other fields that differ,
    such as ``store_dtype``).
    ``first``/``second`` hold the differing values of each fingerprint, by key.
    """

    kind: str
    keys: tuple[str, ...]
    first: dict
    second: dict

    def explain(self, first: str = "there", second: str = "here", plural: bool = False) -> str:
        """A phrase that completes "... was made " / "... were made ", naming each value with its
        label: ``with other options (steps=4 there, 8 here)``. ``plural`` for two things at once
        ("with other models" instead of "with another model")."""
        a, b = self.first, self.second

        def pair(key: str, show=repr) -> str:
            return f"{key}={show(a.get(key))} {first}, {show(b.get(key))} {second}"

        if self.kind == "model":
            what = "other models" if plural else "another model"
            return (f"with {what} (weights sha256 {_short(a.get('weights_sha256'))} {first},"
                    f" {_short(b.get('weights_sha256'))} {second})")
        if self.kind == "data":
            def data(d: dict) -> str:
                return f"{d.get('data')}, sha256 {_short(d.get('data_sha256'))}" if "data_sha256" in self.keys \
                    else str(d.get("data"))
            return f"from other data ({data(a)} {first}; {data(b)} {second})"
        if self.kind == "options":
            return f"with other options ({'; '.join(pair(k) for k in self.keys)})"
        return f"with other settings ({'; '.join(pair(k) for k in self.keys)})"


def fingerprint_difference(first: dict, second: dict) -> FingerprintDifference | None:
    """How ``second`` differs from ``first``, or None if they are equal. One kind is reported, in
    this order: the model, the data, the options (all differing options), any other field.
    ``steps`` beside ``tol`` (unused by an error-controlled run; some stores record it) is not compared."""
    first, second = _without_unused_steps(first), _without_unused_steps(second)
    if first == second:
        return None

    def differ(a: dict, b: dict, keys=None) -> tuple[str, ...]:
        keys = sorted(set(a) | set(b)) if keys is None else keys
        return tuple(k for k in keys if a.get(k) != b.get(k))

    if differ(first, second, ["weights_sha256"]):
        return FingerprintDifference("model", ("weights_sha256",), _pick(first, ["weights_sha256"]),
                                     _pick(second, ["weights_sha256"]))
    keys = differ(first, second, ["data", "data_sha256"])
    if keys:
        both = ["data", "data_sha256"]
        return FingerprintDifference("data", keys, _pick(first, both), _pick(second, both))
    oa, ob = first.get("options") or {}, second.get("options") or {}
    keys = differ(oa, ob)
    if keys:
        return FingerprintDifference("options", keys, _pick(oa, keys), _pick(ob, keys))
    keys = differ(first, second)
    return FingerprintDifference("field", keys, _pick(first, keys), _pick(second, keys))


def _without_unused_steps(fp: dict) -> dict:
    options = fp.get("options")
    if not isinstance(options, dict) or options.get("tol") is None or "steps" not in options:
        return fp
    return {**fp, "options": {k: v for k, v in options.items() if k != "steps"}}


def _pick(d: dict, keys) -> dict:
    return {k: d.get(k) for k in keys}


_HINTS = {"options": "use the same options or another output store"}


def check_fingerprint(path: Path, there: dict, here: dict) -> None:
    """Refuse to add to the store at ``path`` (fingerprint ``there``) a run with fingerprint ``here``."""
    difference = fingerprint_difference(there, here)
    if difference is not None:
        hint = _HINTS.get(difference.kind, "use another output store")
        old, new = there.get("options", {}), here.get("options", {})
        if difference.kind == "options" and old.get("tol") is None and new.get("tol") is not None:
            hint = (f"it was integrated with a fixed rule (rule={old.get('rule')!r}, steps={old.get('steps')}), and this"
                    f" run integrates to tol={new.get('tol'):g} (the default when neither --rule nor --steps is given):"
                    " give that rule and steps to extend it, or use another output store")
        raise StoreError(f"{path} was made {difference.explain('there', 'here')}: {hint}")
