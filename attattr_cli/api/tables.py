"""What the API's results share: a table (``to_pandas()``, a notebook's table), JSON, figures."""

from __future__ import annotations

from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity


def saved(fig, path):
    """``fig`` (a matplotlib ``Figure``), also written to ``path`` (.png, .svg, .pdf; whole or
    not at all) when given."""
    if path is not None:
        fig.save(path)
    return fig


class Table:
    """A result whose ``_rows()`` (dicts) over ``COLUMNS`` are its ``to_pandas()`` and the table
    a notebook shows (its first ``LIMIT`` rows), and whose ``to_dict()`` dumped with ``JSON``
    (json.dumps's keywords) is its ``to_json()``."""

    COLUMNS: list | None = None
    LIMIT = 20
    JSON: dict = {"indent": 2}

    def to_pandas(self):
        """A pandas DataFrame, one row per row of the result's table (its columns: docs/api.md, "Tables")."""
        from ..views.notebook import data_frame

        return data_frame(self._rows(), self.COLUMNS)

    def _repr_html_(self) -> str:
        from ..views.notebook import table_html

        return table_html([[r[c] for c in self.COLUMNS] for r in self._rows()], self.COLUMNS, title=repr(self),
                          limit=self.LIMIT)

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return strict_dumps(self.to_dict(), **self.JSON)
