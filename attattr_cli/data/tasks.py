"""Task presets and the loading of examples for a task (docs/cli.md, "Data files and labels").

A :class:`Task` says which columns of a data file hold the text (one segment, or a pair) and the
gold label, and what the labels are called. ``TASKS`` holds the presets; :data:`GENERIC` is the
fallback for a data file given without a task. A label cell is an index into the task's label
names or a name (case-insensitive; ``_``, ``-`` and spaces ignored); an empty cell, ``-1`` or ``-``
gives ``label=None`` (gold unknown). Given the model's ``label_names``, gold labels index *those*
names, so that they line up with the model's outputs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from attattr_cli.data.readers import Table, read_table, shown
from attattr_cli.data.types import Example
from attattr_cli.errors import DataError, OptionError, first_line
from attattr_cli.registry import Registry
from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity


@dataclass(frozen=True)
class HubSpec:
    """A split of a dataset on the Hugging Face hub: ``load_dataset(path, config, split=split)``."""

    path: str
    config: str | None
    split: str

    def __str__(self) -> str:
        parts = [self.path] + ([self.config] if self.config else []) + [self.split]
        return "hub:" + "/".join(parts)


@dataclass(frozen=True)
class Task:
    """A task preset.

    name:           the name given to ``--task``
    text_a_columns: candidate columns of the first segment, the first present wins
    text_b_columns: candidate columns of the second segment; empty for one-segment tasks
    label_columns:  candidate columns of the gold label (the column is optional)
    labels:         the label names; integer labels in files index this tuple
    hub:            where the dev split lives on the hub, or None
    default_model:  a hub model id used when no model is given, or None
    description:    one line for listings
    builtin:        the data is built in (the synthetic set), no file or hub needed
    """

    name: str
    text_a_columns: tuple[str, ...]
    text_b_columns: tuple[str, ...] = ()
    label_columns: tuple[str, ...] = ("label",)
    labels: tuple[str, ...] = ()
    hub: HubSpec | None = None
    default_model: str | None = None
    description: str = ""
    builtin: bool = False

    @property
    def is_pair(self) -> bool:
        return bool(self.text_b_columns)

    @property
    def is_generic(self) -> bool:
        return self.name == GENERIC_NAME


_NLI3 = ("entailment", "neutral", "contradiction")
_NLI2 = ("entailment", "not_entailment")


def _glue(name: str, split: str = "validation") -> HubSpec:
    return HubSpec("nyu-mll/glue", name, split)


# the columns and labels MNLI and SNLI share
_NLI = dict(text_a_columns=("premise", "sentence1"), text_b_columns=("hypothesis", "sentence2"),
            label_columns=("label", "gold_label"), labels=_NLI3)

TASKS = Registry("classification task", units="examples", command="score --task")
for _task in (
        Task("sst2", ("sentence",), labels=("negative", "positive"), hub=_glue("sst2"),
             default_model="distilbert/distilbert-base-uncased-finetuned-sst-2-english",
             description="SST-2 sentiment of movie-review sentences (GLUE)"),
        Task("mnli", **_NLI, hub=_glue("mnli", "validation_matched"), default_model="FacebookAI/roberta-large-mnli",
             description="MultiNLI natural-language inference, matched dev set (GLUE)"),
        Task("rte", ("sentence1",), ("sentence2",), labels=_NLI2, hub=_glue("rte"),
             description="RTE recognising textual entailment (GLUE)"),
        Task("mrpc", ("sentence1", "#1 String"), ("sentence2", "#2 String"), ("label", "Quality"),
             ("not_equivalent", "equivalent"), _glue("mrpc"), description="MRPC paraphrase detection (GLUE)"),
        Task("snli", **_NLI, hub=HubSpec("stanfordnlp/snli", None, "validation"),
             description="SNLI natural-language inference"),
        Task("qnli", ("question",), ("sentence",), labels=_NLI2, hub=_glue("qnli"),
             description="QNLI question/sentence entailment (GLUE)"),
        Task("synthetic", ("premise",), ("hypothesis",), labels=_NLI3,
             description="built-in synthetic NLI held-out set (no download needed)", builtin=True),
):
    TASKS.register(_task)

GENERIC_NAME = "generic"

#: The fallback for a data file given without a task: text columns guessed from
#: common names, label column ``label`` if present, label names from the caller.
GENERIC = Task(
    name=GENERIC_NAME,
    text_a_columns=("sentence", "text"),
    label_columns=("label",),
    description="columns guessed from common names; labels from the data or the model",
)

#: Column pairs tried, in order, for a generic file; then the single columns.
GENERIC_PAIRS: tuple[tuple[str, str], ...] = (
    ("premise", "hypothesis"),
    ("sentence1", "sentence2"),
    ("question", "sentence"),
    ("text_a", "text_b"),
)
GENERIC_SINGLES: tuple[str, ...] = ("sentence", "text")

_UNNAMED = re.compile(r"label_?\d+", re.IGNORECASE)
_INTEGER = re.compile(r"[+-]?\d+(?:\.0*)?")
_MISSING_LABELS = ("", "-", "-1")


def get_task(name: str) -> Task:
    """The preset called ``name`` (case-insensitive); OptionError listing the presets if none."""
    key = name.strip().lower()
    if key in TASKS:
        return TASKS[key]
    raise OptionError(f"unknown task '{name}'; available tasks: {', '.join(TASKS)}")


def resolve_model_for_task(task: Task | None, model: str | None) -> str | None:
    """``model`` if given, else the task's default hub model (None if it has none)."""
    if model:
        return model
    return task.default_model if task is not None else None


def normalize_label(name: str) -> str:
    """The form in which label names are compared: lower case, no ``_``, ``-`` or spaces."""
    return re.sub(r"[\s_\-]+", "", str(name).strip().lower())


# ----------------------------------------------------------------------------- labels


class _LabelSpace:
    """Turns label cells into indices into the output label names.

    source: the names integer labels in the data index (None: not known yet)
    target: the names returned (None: derived from the integer labels seen)
    mapping: source index -> target index, None for the identity
    """

    def __init__(self, task: Task, label_names: Sequence[str] | None):
        self.task = task
        self.max_seen = -1
        self.mapping: list[int] | None = None
        if task.is_generic:
            names = tuple(str(n) for n in label_names) if label_names else None
            self.source = self.target = names
            return
        self.source = task.labels
        if not label_names:
            self.target = task.labels
            return
        names = tuple(str(n) for n in label_names)
        if all(_UNNAMED.fullmatch(n) for n in names):
            if len(names) != len(task.labels):
                raise OptionError(
                    f"the model has {len(names)} labels but task '{task.name}' has "
                    f"{len(task.labels)} ({', '.join(task.labels)})"
                )
            self.target = task.labels
            return
        index = {normalize_label(n): i for i, n in enumerate(names)}
        missing = [lab for lab in task.labels if normalize_label(lab) not in index]
        if missing:
            raise OptionError(
                f"the model's labels ({', '.join(names)}) do not include "
                f"{', '.join(repr(m) for m in missing)} of task '{task.name}' "
                f"({', '.join(task.labels)})"
            )
        self.target = names
        mapping = [index[normalize_label(lab)] for lab in task.labels]
        self.mapping = None if mapping == list(range(len(mapping))) else mapping

    def _unknown(self, value: Any, where: str) -> DataError:
        names = self.source
        valid = f"{', '.join(names)} (or 0..{len(names) - 1})" if names else "none known"
        return DataError(f"{where}: unknown label '{shown(value)}'; valid labels: {valid}")

    def parse(self, value: Any, where: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool):
            raise self._unknown(value, where)
        if isinstance(value, float):
            if not value.is_integer():
                raise self._unknown(value, where)
            value = int(value)
        if isinstance(value, int):
            idx = value
        else:
            text = str(value).strip()
            if text in _MISSING_LABELS:
                return None
            if _INTEGER.fullmatch(text):
                idx = int(text.split(".")[0])
            else:
                return self._by_name(value, text, where)
        if idx == -1:
            return None
        if idx < 0 or (self.source is not None and idx >= len(self.source)):
            raise self._unknown(value, where)
        self.max_seen = max(self.max_seen, idx)
        return self.mapping[idx] if self.mapping is not None else idx

    def _by_name(self, value: Any, text: str, where: str) -> int:
        if self.source is None:
            raise DataError(
                f"{where}: label '{shown(value)}' is a name, but no label names are known; "
                f"pass --task NAME or use a model whose config names its labels"
            )
        key = normalize_label(text)
        for i, name in enumerate(self.source):
            if normalize_label(name) == key:
                return self.mapping[i] if self.mapping is not None else i
        raise self._unknown(value, where)

    def names(self) -> tuple[str, ...]:
        if self.target is not None:
            return tuple(self.target)
        return tuple(f"LABEL_{i}" for i in range(self.max_seen + 1))


# ----------------------------------------------------------------------------- columns


def _find_column(columns: Sequence[str], candidates: Iterable[str]) -> str | None:
    for cand in candidates:
        if cand in columns:
            return cand
    lowered = {c.lower(): c for c in columns}
    for cand in candidates:
        if cand.lower() in lowered:
            return lowered[cand.lower()]
    return None


def _alternatives(cands: Sequence[str]) -> str:
    return cands[0] + (f" (or {' or '.join(cands[1:])})" if len(cands) > 1 else "")


def _resolve_columns(table: Table, task: Task) -> tuple[str, str | None, str | None]:
    cols = table.columns
    found = ", ".join(shown(c) for c in cols) if cols else "none"
    label_col = _find_column(cols, task.label_columns)
    if task.is_generic:
        for a, b in GENERIC_PAIRS:
            ca, cb = _find_column(cols, (a,)), _find_column(cols, (b,))
            if ca and cb:
                return ca, cb, label_col
        for a in GENERIC_SINGLES:
            ca = _find_column(cols, (a,))
            if ca:
                return ca, None, label_col
        pairs = ", ".join(f"{a}/{b}" for a, b in GENERIC_PAIRS)
        raise DataError(
            f"{table.path}: cannot tell which columns hold the text; expected "
            f"{' or '.join(GENERIC_SINGLES)}, or a pair {pairs} (or pass --task NAME); "
            f"columns found: {found}"
        )
    col_a = _find_column(cols, task.text_a_columns)
    col_b = _find_column(cols, task.text_b_columns) if task.is_pair else None
    if col_a is None or (task.is_pair and col_b is None):
        wanted = [_alternatives(task.text_a_columns)]
        if task.is_pair:
            wanted.append(_alternatives(task.text_b_columns))
        raise DataError(
            f"{table.path}: task '{task.name}' expects columns {', '.join(wanted)}"
            f" and optionally {_alternatives(task.label_columns)}; columns found: {found}"
        )
    return col_a, col_b, label_col


def _meta_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return strict_dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _text(row: dict, col: str, where: str) -> str:
    value = row.get(col)
    if value is None:
        raise DataError(f"{where}: no value in column '{shown(col)}'")
    text = value if isinstance(value, str) else _meta_value(value)
    check_text(text, f"{where}, column '{shown(col)}'")
    return text


def check_text(text: str, where: str) -> None:
    """Refuse a text the store cannot keep (HDF5 strings end at a NUL character) with one line."""
    if "\x00" in text:
        raise DataError(f"{where}: the text holds a NUL character (\\x00), which no store can keep;"
                        " remove it from the data")


def _convert(table: Table, task: Task, space: _LabelSpace) -> list[Example]:
    col_a, col_b, label_col = _resolve_columns(table, task)
    used = {col_a, col_b, label_col}
    examples = []
    for i, row in enumerate(table.rows):
        where = table.where(i)
        label = space.parse(row.get(label_col), where) if label_col else None
        examples.append(
            Example(
                index=i,
                text_a=_text(row, col_a, where),
                text_b=_text(row, col_b, where) if col_b else None,
                label=label,
                meta={k: _meta_value(v) for k, v in row.items() if k not in used},
            )
        )
    return examples


# ----------------------------------------------------------------------------- sources


def _hub_columns(task: Task) -> str:
    return ", ".join([task.text_a_columns[0], *task.text_b_columns[:1], task.label_columns[0]])


def _hub_table(task: Task) -> Table:
    assert task.hub is not None
    spec = task.hub
    fix = f"pass --data PATH to a TSV, CSV or JSONL file with columns {_hub_columns(task)}"
    try:
        import datasets  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise DataError(
            f"no local data for task '{task.name}': its hub dev split needs the 'datasets' package, which is not "
            f"installed (pip install 'attattr[hub]'); or {fix}"
        ) from None
    try:
        quiet = getattr(datasets, "disable_progress_bars", None)
        if quiet is not None:
            quiet()  # the library never prints
        args = (spec.path, spec.config) if spec.config else (spec.path,)
        dataset = datasets.load_dataset(*args, split=spec.split)
        columns = list(dataset.column_names)
        rows = [dict(row) for row in dataset]
    except Exception as exc:  # network, missing cache, hub errors: all mean "no data here"
        from attattr_cli.hub import hub_reachable  # noqa: PLC0415 - only on this error path

        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
        cause = ("the hub is switched off here (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)" if offline
                 else "the hub is unreachable from this machine" if not hub_reachable()
                 else f"the hub could not provide {spec.path} ({first_line(exc)})")
        raise DataError(f"no local data for task '{task.name}': {cause}; {fix}") from exc
    return Table(str(spec), columns, rows, [None] * len(rows))


def _synthetic_examples(task: Task, space: _LabelSpace) -> list[Example]:
    from attattr_cli.data import synthetic  # noqa: PLC0415 - built lazily, optional at import

    source = tuple(synthetic.LABELS)
    out = []
    for ex in synthetic.heldout():
        name = source[ex.label] if ex.label is not None else None
        label = space.parse(name, f"synthetic example {ex.index}") if name is not None else None
        out.append(Example(ex.index, ex.text_a, ex.text_b, label, dict(ex.meta)))
    return out


def load_examples(
    path: str | None,
    task: Task | None,
    label_names: Sequence[str] | None = None,
) -> tuple[list[Example], tuple[str, ...]]:
    """The examples of a data file (or of the task's built-in / hub data) and the label names.

    ``path``: a .tsv, .csv, .jsonl or .json (JSON lines) file, or None for the task's own data (the
    synthetic held-out set for ``synthetic``, the hub dev split of the GLUE/SNLI presets, which needs
    ``datasets``); ``task``: a preset from :func:`get_task`, or None for :data:`GENERIC`;
    ``label_names``: the model's label names, if known, which the gold labels returned then index.
    Returns the examples (``index`` = 0-based data row) and the label names their ``label`` indexes.
    Raises DataError for data problems, OptionError when there is nothing to load or the model's
    labels do not fit the task."""
    task = task or GENERIC
    space = _LabelSpace(task, label_names)
    if path is None:
        if task.builtin:
            examples = _synthetic_examples(task, space)
        elif task.hub is not None:
            examples = _convert(_hub_table(task), task, space)
        elif task.is_generic:
            raise OptionError(
                f"no data to load: pass --data PATH, or --task NAME for a preset ({', '.join(TASKS)})"
            )
        else:
            raise OptionError(f"task '{task.name}' has no built-in data: pass --data PATH")
    else:
        examples = _convert(read_table(path), task, space)
    return examples, space.names()
