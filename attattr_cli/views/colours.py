"""The colour scales of every view, in one place (view.js and report.js write the same in
JavaScript): tokens green/red by |v| / top, map cells blue-white-red (attribution) or
white-black (attention) in ``LEVELS`` steps per sign."""

from __future__ import annotations

from typing import Sequence

import numpy as np

TOKEN_POS, TOKEN_NEG = (41, 158, 61), (214, 48, 39)  # the highlighted text's green and red (0..255)
ATTR_NEG, ATTR_POS, ATT_HI = (33, 102, 172), (178, 24, 43), (34, 34, 34)  # view.js colour(), mix()
LEVELS = 40  # colour steps per sign: cells of one step share one <path>


def token_rgb(v: float, top: float) -> tuple[float, float, float]:
    """A token's background as 0..1 RGB: green (positive) or red (negative), by |v| / top."""
    f = 0.0 if top <= 0 else min(abs(v) / top, 1.0)
    base = TOKEN_POS if v >= 0 else TOKEN_NEG
    return tuple(1 - f * (1 - c / 255) for c in base)


def token_colour(v: float, top: float) -> str:
    """:func:`token_rgb` as ``#rrggbb``."""
    return "#" + "".join(f"{round(255 * c):02x}" for c in token_rgb(v, top))


def mix(c: Sequence[int], f: float) -> str:
    """White mixed with ``c`` by ``f`` (0..1), as ``#rrggbb``."""
    f = max(0.0, min(1.0, f))
    r, g, b = (round(255 + (x - 255) * f) for x in c)
    return f"#{r:02x}{g:02x}{b:02x}"


def _step(f: float) -> float:
    return round(max(0.0, min(1.0, f)) * LEVELS) / LEVELS


def cell_colour(kind: str, v: float, top: float) -> str:
    """A cell's colour as view.js draws it, in one of ``LEVELS`` steps per sign."""
    if not (top > 0) or not np.isfinite(v):
        return "#ffffff"
    if kind == "attr":
        return mix(ATTR_POS, _step(v / top)) if v >= 0 else mix(ATTR_NEG, _step(-v / top))
    return mix(ATT_HI, _step(v / top))
