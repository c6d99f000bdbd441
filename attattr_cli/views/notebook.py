"""What results need to show themselves in a notebook, without a GUI or global state: HTML
and dicts that print short, tables, DataFrames, figures made without pyplot (docs/api.md,
"Notebooks")."""

from __future__ import annotations

import html as html_escape
from typing import Any, Sequence

from ..analysis.plots import new_figure  # noqa: F401  (one maker of figures, re-exported)
from ..errors import OptionError

PANDAS_HINT = "to_pandas() needs pandas: pip install 'attattr[notebook]' (or pip install pandas)"


class Html(str):
    """HTML text that a notebook shows rendered (``_repr_html_``, inline styles only, so it works
    untrusted); ``str()`` is the HTML itself, for files; ``repr()`` one short line."""

    def __new__(cls, text: str, summary: str = "HTML"):
        obj = super().__new__(cls, text)
        obj.summary = summary
        return obj

    def _repr_html_(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"<{self.summary}: {len(self):,} characters of HTML>"


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return html_escape.escape(" ".join(map(str, v)))
    return html_escape.escape(str(v))


def table_html(rows: Sequence[Sequence[Any]], columns: Sequence[str], title: str = "", limit: int = 20) -> str:
    """A plain HTML table of the first ``limit`` rows (a note says how many are left out)."""
    head = "".join(f'<th style="text-align:left;padding:2px 8px">{html_escape.escape(str(c))}</th>' for c in columns)
    body = "".join("<tr>" + "".join(f'<td style="padding:2px 8px">{_cell(v)}</td>' for v in r) + "</tr>"
                   for r in list(rows)[:limit])
    more = len(rows) - limit
    note = (f'<div style="font-size:smaller">{more} more row{"s" if more != 1 else ""}; '
            f"to_pandas() has them all</div>" if more > 0 else "")
    cap = f"<b>{html_escape.escape(title)}</b>" if title else ""
    return f'<div class="aa-table">{cap}<table style="border-collapse:collapse"><thead><tr>{head}</tr></thead>' \
           f"<tbody>{body}</tbody></table>{note}</div>"


def data_frame(rows, columns: Sequence[str] | None = None):
    """``rows`` (a list of dicts or of sequences with ``columns``) as a pandas DataFrame."""
    try:
        import pandas as pd
    except ImportError:
        raise OptionError(PANDAS_HINT) from None
    return pd.DataFrame(list(rows), columns=None if columns is None else list(columns))


def display(obj) -> None:
    """Show ``obj`` in a notebook (IPython's display), once; nothing is returned to show again."""
    try:
        from IPython.display import display as ipython_display
    except ImportError:
        raise OptionError("show() displays in a notebook and needs IPython; elsewhere use save(path)") from None
    ipython_display(obj)


class Summary(dict):
    """A dict (what a command prints as JSON) that shows itself short: ``repr()`` the scalar
    entries on a few lines, a notebook a two-column table; the dict itself is unchanged."""

    title = "summary"
    shown = 12  # entries in the repr

    def __init__(self, data=(), title: str | None = None):
        super().__init__(data)
        if title is not None:
            self.title = title

    def _scalars(self) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in self.items() if v is None or isinstance(v, (str, int, float, bool))]

    def __repr__(self) -> str:
        items = self._scalars()
        body = ", ".join(f"{k}={(v[:60] + '…') if isinstance(v, str) and len(v) > 60 else v!r}"
                         for k, v in items[:self.shown])
        more = len(self) - min(len(items), self.shown)
        return f"{self.title}({body}" + (f", +{more} more keys" if more > 0 else "") + ")"

    def _repr_html_(self) -> str:
        rows = self._scalars()
        rows += [(k, f"({type(v).__name__}, {len(v)} entries)") for k, v in self.items()
                 if isinstance(v, (dict, list, tuple))]
        return table_html(rows, ["key", "value"], title=self.title, limit=40)
