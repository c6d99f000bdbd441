"""Readers for tabular example files (docs/cli.md, "Data files and labels"), chosen by the file's
extension (case-insensitive): ``.tsv`` tab-separated with a header row and no quoting
(``csv.QUOTE_NONE``: GLUE TSVs hold stray ``"`` characters that are part of the text), ``.csv``
comma-separated with standard ``"`` quoting, ``.jsonl``, ``.ndjson`` and ``.json`` one JSON object
per line (a ``.json`` whose first character is ``[``: one JSON array of objects). UTF-8, a leading
byte-order mark dropped; blank lines are no rows. Every problem is a one-line
:class:`~attattr_cli.errors.DataError` naming the file and, where there is one, the line.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any

from attattr_cli.errors import DataError

FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json"}
# how a message names a JSON value that is not an object (bool before int: True is an int too)
_JSON_KINDS = ((list, "an array"), (str, "a string"), (bool, "a boolean"), ((int, float), "a number"),
               (type(None), "null"))


@dataclass
class Table:
    """The rows of one data file, with the file line on which each row starts."""

    path: str
    columns: list[str]
    rows: list[dict[str, Any]]
    lines: list[int | None] = field(default_factory=list)

    def where(self, i: int) -> str:
        """``'PATH, line N'`` for row ``i`` (``'PATH, item i'`` inside a JSON array)."""
        line = self.lines[i] if i < len(self.lines) else None
        return f"{self.path}, line {line}" if line is not None else f"{self.path}, item {i}"


def detect_format(path: str | os.PathLike) -> str:
    """``'tsv'``, ``'csv'``, ``'jsonl'`` or ``'json'`` from the extension, else DataError."""
    name = os.fspath(path)
    ext = os.path.splitext(name)[1].lower()
    if ext not in FORMATS:
        shown = f"'{ext}'" if ext else "no extension"
        raise DataError(
            f"{name}: unsupported file type ({shown}); use a .tsv, .csv, .jsonl or .json (JSON lines) file"
        )
    return FORMATS[ext]


def _read_text(name: str) -> str:
    if not os.path.exists(name):
        raise DataError(f"{name}: no such file")
    if os.path.isdir(name):
        raise DataError(f"{name}: is a directory, not a data file")
    try:
        with open(name, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise DataError(f"{name}: cannot read the file ({reason})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{name}, line {line}: not valid UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    if not text.strip():
        raise DataError(f"{name}: the file is empty")
    return text


def _read_delimited(name: str, text: str, fmt: str) -> Table:
    # a field may be as long as the file (a 1 MB sentence is a long text, not a broken file;
    # --truncate or the too-long check deals with it after tokenisation)
    csv.field_size_limit(max(csv.field_size_limit(), len(text) + 1))
    if fmt == "tsv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
    columns: list[str] | None = None
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    previous_end = 0
    try:
        for record in reader:
            start = previous_end + 1
            previous_end = reader.line_num
            if not record or all(not cell.strip() for cell in record):
                continue
            if columns is None:
                columns = [cell.strip() for cell in record]
                seen: set[str] = set()
                for col in columns:
                    if col == "":
                        raise DataError(f"{name}, line {start}: the header has an empty column name")
                    if col in seen:
                        raise DataError(f"{name}, line {start}: the header names column '{shown(col)}' twice")
                    seen.add(col)
                continue
            if len(record) != len(columns):
                raise DataError(
                    f"{name}, line {start}: {len(record)} fields, but the header has {len(columns)}"
                )
            rows.append(dict(zip(columns, record)))
            lines.append(start)
    except csv.Error as exc:
        raise DataError(f"{name}, line {reader.line_num}: cannot parse the row ({exc})") from None
    if columns is None:  # text, but every row empty (",\n")
        raise DataError(f"{name}: the file holds only empty rows, no header")
    if not rows:
        raise DataError(f"{name}: the file has a header but no data rows")
    return Table(name, columns, rows, lines)


def shown(value: Any) -> str:
    """``value`` as text for a one-line message: line breaks, tabs and other control
    characters escaped (``\\n``), so a column name or label from the file cannot split it."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def json_problem(exc: Exception) -> str:
    """What made ``json.loads`` fail, in a few words: its own message for a syntax error,
    else the limit that was hit (nesting too deep for the parser, a number too long)."""
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "arrays or objects nested too deeply"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _add_json_row(table: Table, obj: Any, line: int | None, where: str) -> None:
    if not isinstance(obj, dict):
        kind = next((name for types, name in _JSON_KINDS if isinstance(obj, types)), type(obj).__name__)
        raise DataError(f"{where}: expected a JSON object, got {kind}")
    for key in obj:
        if key not in table.columns:
            table.columns.append(key)
    table.rows.append(obj)
    table.lines.append(line)


def _read_json_lines(name: str, text: str) -> Table:
    table = Table(name, [], [], [])
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise DataError(f"{name}, line {number}: not valid JSON ({json_problem(exc)})") from None
        _add_json_row(table, obj, number, f"{name}, line {number}")
    return table


def _read_json_array(name: str, text: str) -> Table:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{name}, line {exc.lineno}: not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{name}: not valid JSON ({json_problem(exc)})") from None
    if not isinstance(data, list):
        raise DataError(f"{name}: expected JSON lines or an array of objects")
    table = Table(name, [], [], [])
    for i, obj in enumerate(data):
        # Line numbers are not known inside one JSON document; report the item instead.
        _add_json_row(table, obj, None, f"{name}, item {i}")
    return table


def read_table(path: str | os.PathLike) -> Table:
    """Read a TSV, CSV or JSON-lines file into a :class:`Table` (raises DataError)."""
    name = os.fspath(path)
    fmt = detect_format(name)
    text = _read_text(name)
    if fmt in ("tsv", "csv"):
        return _read_delimited(name, text, fmt)
    if fmt == "json" and text.lstrip().startswith("["):
        table = _read_json_array(name, text)
    else:
        table = _read_json_lines(name, text)
    if not table.rows:
        raise DataError(f"{name}: the file holds no JSON objects")
    return table


def read_rows(path: str | os.PathLike) -> tuple[list[str], list[dict]]:
    """The column names and the rows (dicts column -> value) of a data file. TSV and CSV values are
    strings; JSON-lines values are as decoded (the columns: every key in order of first appearance,
    and a row may lack some)."""
    table = read_table(path)
    return table.columns, table.rows
