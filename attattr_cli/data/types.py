"""Data types shared by the readers, the task presets and the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Example:
    """One input to score.

    index:  the example's position in its source (0-based row of the data file,
            or of the built-in synthetic set); stores key examples by it.
    text_a: the first (or only) segment.
    text_b: the second segment of a pair task, else None.
    label:  the gold label as an index into the task's label names, or None.
    meta:   any other columns of the row, JSON-serialisable (kept in the store).
    """

    index: int
    text_a: str
    text_b: str | None = None
    label: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
