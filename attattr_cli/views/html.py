"""The package's own HTML: an interactive view of one example (a standalone page or a
notebook fragment). The CSS and JavaScript are package data (``views/static``) inlined into
every page: nothing is fetched from the network."""

from __future__ import annotations

import html
import re
import uuid
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from typing import Sequence

import numpy as np

from ..fileio import dumps as strict_dumps
from .data import View, ViewSpec, build_view, pack
from .still import view_still

MAX_HTML_VALUES = 2_000_000  # above this many map values a page keeps the head sums only


@lru_cache(maxsize=None)
def static(name: str) -> str:
    """The text of a file shipped in attattr_cli/views/static."""
    return resources.files("attattr_cli.views").joinpath("static", name).read_text(encoding="utf-8")


def script_json(obj) -> str:
    """JSON that is safe inside a <script> element ("<" only occurs inside JSON strings) and
    that JSON.parse reads: NaN and infinities (an example flagged non-finite) become null."""
    return strict_dumps(obj, separators=(",", ":")).replace("<", "\\u003c")


def view_data(example, labels: Sequence[str] | None = None, spec: ViewSpec | None = None,
              token_importance: dict | None = None, tree_svg: str | None = None, per_head: bool = True,
              view: View | None = None, digits: int = 4) -> dict:
    """The JSON the interactive view draws: the head sum of every chosen layer and, when the
    example keeps per-head maps (and the page stays small), every head, so the page can switch."""
    spec = spec or ViewSpec()
    base = view or build_view(example, labels, replace(spec, heads="sum"), token_importance)
    data = base.to_json(digits)
    initial_head = 0
    n_heads = int(np.shape(example.attribution)[1]) if example.attribution is not None and np.ndim(example.attribution) == 4 else 0
    if per_head and n_heads and base.maps:
        size = sum(v.size for v in base.maps.values()) * (n_heads + 1)
        if size <= MAX_HTML_VALUES:
            every = build_view(example, labels, replace(spec, heads="all"), token_importance).to_json(digits)
            for kind in data["maps"]:
                data["maps"][kind] = [s + e for s, e in zip(data["maps"][kind], every["maps"][kind])]
            data["heads"] = ["sum", *every["heads"]]
            if spec.heads not in (None, "sum", "all"):
                initial_head = data["heads"].index(str(int(spec.heads)))
        else:
            data["notes"].append(f"per-head maps are left out of this page ({size:,} values); choose a head"
                                 " with --heads H to see one")
    shows = [s for s in spec.show if s in data["maps"]]
    layer = 0
    if "attr" in base.maps and base.maps["attr"].size:  # open on the layer with the strongest attribution
        layer = int(np.argmax(np.abs(base.maps["attr"]).reshape(len(base.layers), -1).max(axis=1)))
    data["initial"] = {"layer": layer, "head": initial_head,
                       "kind": "both" if len(shows) > 1 else (shows[0] if shows else "attr")}
    if tree_svg:  # drawn once, in the page's still part (see tree_html), never inside the JSON
        data["tree_svg"] = _strip_xml_prolog(tree_svg)
    data["maps"] = {kind: pack(m) for kind, m in data["maps"].items()}  # float16 in base64 (still.pack)
    return data


def _strip_xml_prolog(svg: str) -> str:
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def tree_html(svg: str | None, uid: str) -> str:
    """The attribution tree below a view: static in both the page and the notebook (it needs no
    script), its SVG ids prefixed with ``uid`` so two displays never share an element id."""
    if not svg:
        return ""
    svg = re.sub(r'(\bid="|url\(#|href="#)', lambda m: f"{m.group(1)}{uid}-", svg)
    return (f'<div class="aa-view aa-tree-box" style="font:13px/1.4 system-ui,sans-serif;max-width:100%;overflow:auto">'
            f'<div style="margin:2px 0">attribution tree</div><div class="aa-tree">{svg}</div></div>')


def _parts(data: dict, uid: str) -> tuple[str, str, str]:
    """(still picture, tree, JSON) of a view's data: the tree travels outside the JSON."""
    data = dict(data)
    tree = data.pop("tree_svg", None)
    return view_still(data), tree_html(tree, uid), script_json(data)


def page_html(data: dict, title: str = "attattr view") -> str:
    """A standalone, offline HTML page of one example's view: a still picture inside the element
    the script draws into (what a browser with scripts off shows), the data, the script."""
    still, tree, payload = _parts(data, "aa")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{static("view.css")}</style></head>
<body><div id="aa-root">{still}</div>{tree}
<script type="application/json" id="aa-data">{payload}</script>
<script>{static("view.js")}</script>
<script>AttattrView.render(document.getElementById("aa-root"), JSON.parse(document.getElementById("aa-data").textContent));</script>
</body></html>
"""


def fragment_html(data: dict) -> str:
    """An HTML fragment for a notebook cell output: the page's view under element ids made fresh
    on every call; its script finds the view beside itself first (docs/views.md, on notebook
    fragments), so even one fragment shown twice draws each copy."""
    uid = "aa-" + uuid.uuid4().hex[:12]
    still, tree, payload = _parts(data, uid)
    return (f'<div id="{uid}">{still}</div>{tree}<style>{static("view.css")}</style>'
            f'<script type="application/json" id="{uid}-data">{payload}</script>'
            f'<script>{static("view.js")}\n(function (s) {{ var box = s && s.parentNode;'
            f' function find(id) {{ return (box && box.querySelector("#" + id)) || document.getElementById(id); }}'
            f' AttattrView.render(find("{uid}"), JSON.parse(find("{uid}-data").textContent)); }})(document.currentScript);</script>')
