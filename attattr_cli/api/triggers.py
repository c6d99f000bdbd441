"""``triggers`` from attention attribution, and the ``attack`` that inserts them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import OptionError
from .checks import Tolerance, Examples, File, Inputs, Instance, Int, Number, OneOf, Out, Progress, Source, Str, Texts, Threads, checked
from ..engine.threads import on_threads
from ..fileio import dumps as strict_dumps, write_atomic  # strict JSON: no NaN or Infinity
from .inputs import check_outputs, command_of, open_source, model_and_data
from .model import ModelArg, progress_for, using
from .results import TemporaryStore
from .scoring import score
from .tables import Table


# ----------------------------------------------------------------------------- triggers

TRIGGER_COLUMNS = ["rank", "class", "class_rank", "tokens", "segments", "relative", "count", "mean_strength",
                   "total_strength"]
ATTACK_COLUMNS = ["class", "n", "before", "trigger_mean", "trigger_drop", "control_mean", "control_drop",
                  "control_sd", "worst_control", "p", "p_holm", "beats_controls"]


@dataclass
class TriggersResult(Table):
    """Adversarial triggers: ``triggers`` (ranked ``Trigger`` objects: tokens, segments,
    relative positions, count, strength, the class they push towards), ``patterns`` (the
    per-example top entries they come from), ``document`` (the triggers JSON).
    ``to_pandas()``: one row per trigger, ranked (``tokens`` space-separated, ``relative`` the
    positions in their segment, 0..1)."""

    COLUMNS, JSON = TRIGGER_COLUMNS, {"indent": 2, "ensure_ascii": False}
    triggers: list
    patterns: list
    document: dict
    distinct: int = 0  # distinct triggers before top_k

    def to_dict(self) -> dict:
        """The triggers JSON document (what ``attattr triggers`` writes)."""
        return self.document

    def to_csv(self) -> str:
        """One CSV row per trigger."""
        from ..analysis.triggers import triggers_csv

        return triggers_csv(self.triggers)

    @checked(path=Out())
    def save_csv(self, path) -> None:
        """:meth:`to_csv` written to ``path`` (whole or not at all)."""
        write_atomic(Path(path), self.to_csv())

    def _rows(self) -> list[dict]:
        rows = []
        for t in self.triggers:
            d = t.to_json()
            rows.append({"rank": d["rank"], "class": d["class"], "class_rank": d["class_rank"],
                         "tokens": " ".join(d["tokens"]), "segments": list(d["segments"]),
                         "relative": list(d["relative"]), "count": d["count"],
                         "mean_strength": d["mean_strength"], "total_strength": d["total_strength"]})
        return rows

    def __repr__(self) -> str:
        top = "; ".join(f"{' '.join(t.tokens)!r} -> {t.label} ({t.count}x)" for t in self.triggers[:3])
        return (f"TriggersResult({len(self.triggers)} triggers of {self.distinct} distinct"
                + (f", top: {top}" if top else "") + (" …" if len(self.triggers) > 3 else "") + ")")


@checked(source=Source(), model=ModelArg(), data=File(), task=Str(), examples=Examples(), inputs=Inputs(), steps=Int(min=1),
         top_k=Int(min=1), min_tokens=Int(min=0), limit=Int(min=1), store=Out(), tol=Tolerance(), out=Out(), progress=Progress(),
         command=Texts(), threads=Threads())
@on_threads
def triggers(source=None, *, model=None, data=None, task=None, examples=None, inputs=None, steps: int | None = None,
             tol: float | None = None, top_k: int | None = None, per_class: bool = False, rank_by: str = "count", special: bool = False,
             min_tokens: int = 0, limit: int | None = None, store=None, device: str = "auto", out=None,
             progress=False, command=None, aggregate: str | None = None, threads: int | None = None) -> TriggersResult:
    """Adversarial triggers from attention attribution (Hao et al. 2021, section 4). From
    ``source`` (a store path, an open store, or results of :func:`score`), or scored on the fly
    from model and data/inputs (into ``store`` when given, else a temporary one). ``top_k``
    keeps the k best (of each class with ``per_class``); ``rank_by`` count, total or mean.
    ``out``: write JSON (or CSV when it ends in .csv). On the fly the examples are scored as
    :func:`score` scores them (``tol`` 0.1 unless ``steps`` or ``tol`` is given).
    ``aggregate="words"``: triggers are words, each example's maps merged into words before
    its top entries are taken (analysis/aggregate.py; such triggers are for reading, attack
    inserts tokens). Returns :class:`TriggersResult`."""
    from ..analysis.aggregate import words_asked
    from ..analysis.triggers import (RANKINGS, aggregate as rank_triggers, patterns_from_store, select, select_by_length,
                                     triggers_csv, triggers_document)

    if rank_by not in RANKINGS:
        raise OptionError(f"unknown rank_by '{rank_by}'; available: {', '.join(RANKINGS)}")
    words = words_asked(aggregate)
    if source is not None and any(x is not None for x in (model, data, task, examples, inputs, store, limit)):
        raise OptionError("give either a store or model/data/task/examples to score on the fly, not both")
    check_outputs({"out": out}, [source, model, data, store])
    if tol is not None:  # before anything loads
        from ..engine.options import api_names, integration

        with api_names():
            integration(steps, None, tol)
    tmp = TemporaryStore("attattr-triggers-") if source is None and store is None else None
    wanted = None
    try:
        if source is None:  # scored on the fly
            m, _task, picked, _map, rows, _ = model_and_data(model, data, task, examples, inputs, device=device,
                                                             check_words=False)  # score says it
            positions = {id(e): k for k, e in enumerate(rows)}
            chosen = select_by_length(m.tokenizer, rows, [positions[id(e)] for e in picked], min_tokens, limit)
            wanted = [rows[i].index for i in chosen]
            source = tmp.path if tmp is not None else Path(store)
            score(m, inputs if inputs is None else rows, data=data, task=task, examples=chosen, out=source,
                  steps=steps, tol=tol, device=device, progress=progress, command=command)
        st, close = open_source(source)
        counts = {}  # patterns_from_store's: skipped_nonfinite, unconverged, used
        try:
            prov = st.provenance
            with progress_for(progress, "triggers") as bar:
                patterns = patterns_from_store(st, progress=bar, min_tokens=min_tokens, special=special, indices=wanted,
                                               counts=counts, words=words)
        finally:
            close()
    finally:
        if tmp is not None:
            tmp.remove()
    labels = prov.get("label_names") or []
    ranked = rank_triggers(patterns, labels, rank_by=rank_by)
    chosen_t = select(ranked, top_k, per_class, labels)
    src = {"store": None if (tmp is not None or not isinstance(source, (str, Path))) else str(source),
           **{k: prov.get(k) for k in ("model", "weights_sha256", "task", "data", "options")}, **counts,
           "min_tokens": min_tokens, "special": special, "aggregate": "words" if words else "tokens",
           "command": command_of(command)}
    doc = triggers_document(chosen_t, label_names=labels, per_class=per_class, top=top_k, rank_by=rank_by,
                            source=src, patterns=patterns)
    res = TriggersResult(chosen_t, patterns, doc, len(ranked))
    if out is not None:
        p = Path(out)
        write_atomic(p, triggers_csv(chosen_t) if p.suffix.lower() == ".csv" else res.to_json() + "\n")
    return res


# ----------------------------------------------------------------------------- attack


@dataclass
class AttackResult(Table):
    """The attack's outcome: ``document`` (the ``attattr attack`` JSON: per gold class the
    accuracy before and under each trigger and control, flips), with shortcuts ``table`` (the
    paper's Table 2 rows), ``before`` (overall accuracy before), ``rows`` (one per trigger
    and control), ``texts`` (the attacked examples, when ``keep_texts``). ``to_pandas()``: the
    paper's Table 2, one row per gold class (``worst_control`` its tokens)."""

    COLUMNS, JSON = ATTACK_COLUMNS, {"indent": 2, "ensure_ascii": False}
    document: dict
    texts: list | None = None

    @property
    def table(self) -> list[dict]:
        """Per gold class: n, accuracy before, under each trigger, their mean, the controls' mean."""
        return self.document["table"]

    @property
    def before(self) -> float | None:
        """Overall accuracy before any insertion."""
        return self.document["overall_before"]

    @property
    def rows(self) -> list[dict]:
        """One row per trigger, then per control: tokens, accuracy per class, flipped, ..."""
        return self.document["triggers"] + self.document["controls"]

    def _rows(self) -> list[dict]:
        rows = []
        for r in self.table:
            worst = r.get("worst_control") or {}
            rows.append({**{c: r.get(c) for c in ATTACK_COLUMNS},
                         "worst_control": " ".join(worst.get("tokens", [])) or None})
        return rows

    def __repr__(self) -> str:
        t = self.document.get("triggers", [])
        return (f"AttackResult({len(t)} triggers, {len(self.document.get('controls', []))} controls, "
                f"{len(self.table)} classes, accuracy before {self.before if self.before is None else round(self.before, 4)}"
                + "; drops " + ", ".join(f"{r['class']} {r.get('trigger_drop', 0):+.3f}" for r in self.table[:4]) + ")")

    def to_dict(self) -> dict:
        """The JSON document."""
        return self.document


def _insertions(triggers, top_k):
    from ..analysis.attack import Insertion, from_document
    from ..analysis.triggers import load_triggers

    if isinstance(triggers, TriggersResult):
        return from_document(triggers.document, top_k), None
    if isinstance(triggers, dict):
        return from_document(triggers, top_k), None
    if isinstance(triggers, (str, Path)):
        return from_document(load_triggers(triggers), top_k), str(triggers)
    if isinstance(triggers, (list, tuple)) and all(isinstance(t, Insertion) for t in triggers):
        return list(triggers), None
    raise OptionError("triggers must be a triggers file, its JSON as a dict, a TriggersResult or a list of Insertion")


@checked(model=ModelArg(), triggers=OneOf(File(), Instance(TriggersResult, dict, list, tuple, what="a TriggersResult, its dict or a list of Insertion")),
         data=File(), task=Str(), examples=Examples(), inputs=Inputs(), top_k=Int(min=1), controls=Int(min=0),
         position=OneOf(Str(), Number(0, 1)), alpha=Number(above=0, below=1), batch_size=Int(min=1), out=Out(),
         save_texts=Out(), progress=Progress(), threads=Threads())
@on_threads
def attack(model=None, triggers=None, *, data=None, task=None, examples=None, inputs=None, top_k: int | None = 3,
           controls: int | None = None, seed: int = 0, position="relative", alpha: float = 0.05, batch_size: int = 64,
           keep_texts: bool = False, device: str = "auto", out=None, save_texts=None, progress=False,
           threads: int | None = None) -> AttackResult:
    """Insert triggers (a :class:`TriggersResult`, a triggers file or its dict; the ``top_k``
    best, of each class when made per class) into every example at their relative position
    in their segment, classify again, and compare per gold class with the accuracy before and
    with random-token ``controls`` per trigger layout (size and segments; default 20): per
    trigger its drop, percentile and exact permutation p-value among the controls, per class
    a permutation test of the triggers' drops against the controls' (Holm-adjusted) and the
    verdict at ``alpha``. ``out``: write the JSON; ``save_texts``: write the attacked examples
    as JSON lines (implies ``keep_texts``). Returns :class:`AttackResult`."""
    from ..analysis.attack import run_attack

    if triggers is None:
        raise OptionError("triggers is required: a TriggersResult, a triggers file or its dict")
    keep_texts = keep_texts or save_texts is not None
    check_outputs({"out": out, "save_texts": save_texts}, [triggers, model, data])
    chosen, path = _insertions(triggers, top_k)
    m, task_obj, picked, _map, _rows, labels = model_and_data(model, data, task, examples, inputs, device=device)
    with using(m) as m, progress_for(progress, "attack") as bar:
        doc = run_attack(m.loaded, picked, labels, chosen, controls=controls, seed=seed, position=position,
                         alpha=alpha, batch_size=batch_size, keep_texts=keep_texts, progress=bar)
    doc["data"] = data or ("memory" if inputs is not None else "builtin")
    doc["task"] = task_obj.name if task_obj else ""
    doc["triggers_file"] = path
    texts = doc.pop("texts", None)
    res = AttackResult(doc, texts)
    if save_texts is not None:
        write_atomic(Path(save_texts), "".join(strict_dumps(t, ensure_ascii=False) + "\n" for t in texts or []))
    if out is not None:
        write_atomic(Path(out), res.to_json() + "\n")
    return res
