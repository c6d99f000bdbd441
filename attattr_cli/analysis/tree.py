"""Attribution trees (Hao et al. 2021), as networkx graphs, JSON and DOT.

For one example: a^l = sum_h Attr_h (n x n, query x key), each layer normalised by its
largest entry outside the first query row, s^l = a^l / |max_{i>=1, j} a^l_ij|; the top node
is the query token with the largest row sum of the summed, normalised attribution; a walk
from the top layer down adds edges i -> j (query i, key j) with s^l_ij > tau, i in the tree
and j not. Modes ``paper`` (default) and ``reference`` (the 2021 code step for step) differ
as docs/tree.md, "Differences, side by side" lists; docs/method.md section 3.

Edges point from parent (query) to child (key): information flows from the child up to
the parent. The graph holds only the tokens in the tree. Nothing here prints or exits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import AttattrError, OptionError, StoreError

if TYPE_CHECKING:  # networkx is imported where a graph is made, so importing this module stays quick
    import networkx as nx

MODES = ("paper", "reference")
DEFAULT_TAU = 0.4
RENDER_FORMATS = ("png", "svg")
JSON_FORMAT = "attattr.tree"
JSON_VERSION = 1

DOT_MISSING = (
    "the 'dot' program of Graphviz is not installed: apt-get install graphviz (Debian/Ubuntu) "
    "or brew install graphviz (macOS), or write DOT (the default) and render it elsewhere"
)


class GraphvizError(AttattrError):
    """Graphviz's ``dot`` is missing or failed to render."""

    exit_code = 5


# -- the numbers -------------------------------------------------------------------


def head_sum(attribution) -> np.ndarray:
    """[L, H, n, n] or [L, n, n] -> the per-layer head sum [L, n, n], float64."""
    a = np.asarray(attribution, dtype=np.float64)
    if a.ndim == 4:
        a = a.sum(axis=1)
    if a.ndim != 3 or a.shape[1] != a.shape[2]:
        raise OptionError(
            f"attribution must be [layers, heads, n, n] or [layers, n, n], got shape {list(np.shape(attribution))}"
        )
    if not np.isfinite(a).all():
        raise StoreError("the attribution holds NaN or infinite values")
    return a


def normalise_layers(summed: np.ndarray) -> np.ndarray:
    """Each layer divided by |its largest entry outside the first query row| (0 where that is 0)."""
    denom = np.abs(summed[:, 1:, :].max(axis=(1, 2)))
    out = np.zeros_like(summed)
    ok = denom > 0
    out[ok] = summed[ok] / denom[ok, None, None]
    return out


def top_node_scores(summed: np.ndarray) -> np.ndarray:
    """Per query token: the row sum of the summed attribution over the layers, normalised by
    |its max|, with the diagonal, negative entries and the first query row set to 0."""
    total = summed.sum(axis=0)
    m = abs(total.max())
    c = total / m if m > 0 else np.zeros_like(total)
    c = c * (1 - np.eye(len(c))) * (c > 0)
    c[0] = 0
    return c.sum(axis=-1)


# -- the tree ----------------------------------------------------------------------


def build_tree(
    attribution,
    tokens: Sequence[str],
    layers: Sequence[int] | None = None,
    tau: float = DEFAULT_TAU,
    lam: float | None = None,
    compat: str = "paper",
    segments: Sequence[int] | None = None,
    top: int | None = None,
) -> nx.DiGraph:
    """The attribution tree of one example.

    attribution: [L, H, n, n] (heads are summed) or [L, n, n] (already summed), axis 0 in
    the order of ``layers`` (the layer numbers, default 0..L-1). tokens: the n tokens.
    segments: optional per-token segment ids (0, 1, -1 for special tokens), kept on nodes.
    top: root the tree at this position instead of the top-node rule (1..n-1; negative
    numbers count from the end), to ask where one token's information comes from.

    Returns a DiGraph with graph attributes ``top``, ``tau``, ``lam``, ``mode``, ``layers``,
    ``tokens``; node attributes ``token``, ``position``, ``layer`` (the layer of the edge
    that brought the token into the tree; for the top node the highest layer), ``depth``,
    ``top``, ``segment`` (and ``ref_height``, the 2021 drawing's height, in reference mode);
    edge attributes ``layer``, ``score`` (normalised), ``raw`` (head-summed attribution)
    and ``order`` (the order in which edges were added).
    """
    if compat not in MODES:
        raise OptionError(f"unknown --compat '{compat}'; available: {', '.join(MODES)}")
    if not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau < 0:
        raise OptionError(f"--tau must be a number >= 0, got {tau}")
    if lam is not None and compat == "reference":
        raise OptionError("--lambda is not part of the 2021 procedure: drop it or use --compat paper")
    if lam is not None and not math.isfinite(lam):
        raise OptionError(f"--lambda must be a finite number, got {lam}")
    summed = head_sum(attribution)
    n_layers, n = summed.shape[0], summed.shape[1]
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise OptionError(f"{len(tokens)} tokens for an attribution of {n} x {n}")
    if n < 2:
        raise OptionError("a tree needs at least 2 tokens (the first query row takes no part)")
    labels = list(range(n_layers)) if layers is None else [int(x) for x in layers]
    if len(labels) != n_layers or len(set(labels)) != n_layers:
        raise OptionError(f"{n_layers} attribution layers but layer numbers {labels}")
    if n_layers == 0:
        raise OptionError("no layers to build a tree from")
    order = np.argsort(labels, kind="stable")
    summed = summed[order]
    labels = [labels[i] for i in order]
    if compat == "reference" and n_layers < 2:
        raise OptionError(
            "--compat reference needs at least 2 layers: the 2021 code takes the top node's children "
            "from the second-to-last layer and never uses the last one"
        )
    seg = None if segments is None else [int(s) for s in segments]
    if seg is not None and len(seg) != n:
        raise OptionError(f"{len(seg)} segment ids for {n} tokens")

    chosen = top is not None
    if chosen:
        if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or not -n < int(top) < n:
            raise OptionError(f"root must be a token position between 1 and {n - 1}, got {top}")
        top = int(top) % n
        if top == 0:
            raise OptionError("root cannot be position 0: the first query row takes no part in the tree "
                              "(its scores are not normalised with the others)")
    scores = normalise_layers(summed)
    row = top_node_scores(summed)
    if compat == "paper":
        if not chosen:
            top = 1 + int(np.argmax(row[1:]))  # ties: the lowest position
        edges, height = _walk_paper(scores, top, tau if lam is None else max(tau, lam))
    else:
        if not chosen:
            ranked = np.argsort(row, kind="stable")[::-1]  # ties: the highest position, as a stable sort gives
            top = int(ranked[0]) if ranked[0] != 0 else int(ranked[1])
        edges, height = _walk_reference(scores, top, tau)

    import networkx as nx

    g = nx.DiGraph(top=top, tau=float(tau), lam=None if lam is None else float(lam), mode=compat,
                   layers=labels, tokens=tokens, top_chosen=chosen)
    depth = {top: 0}  # the tokens in the tree
    layer = {top: labels[-1]}  # the layer of the edge that brought a token in
    for i, j, li in edges:
        depth[j] = depth[i] + 1
        layer[j] = labels[li]
    for p in sorted(depth):
        g.add_node(p, token=tokens[p], position=p, layer=layer[p], depth=depth[p],
                   top=p == top, segment=None if seg is None else seg[p],
                   **({} if height is None else {"ref_height": height[p]}))
    for k, (i, j, li) in enumerate(edges):
        g.add_edge(i, j, layer=labels[li], score=float(scores[li, i, j]), raw=float(summed[li, i, j]), order=k)
    return g


def _walk_paper(scores, top, threshold):
    """Layer-synchronous greedy walk from the top layer down (see module docstring): the
    edges (parent, child, layer row), and no heights."""
    n = scores.shape[1]
    in_tree = {top}
    edges: list[tuple[int, int, int]] = []
    for li in range(len(scores) - 1, -1, -1):
        parents = sorted(p for p in in_tree if p != 0)
        if not parents:
            continue
        s = scores[li][parents]  # [parents, n]
        added = []
        for j in range(n):
            if j in in_tree:
                continue
            col = s[:, j]
            k = int(np.argmax(col))  # first max: the lowest position among ties
            if col[k] > threshold and parents[k] != j:
                added.append((parents[k], j))
        for i, j in added:
            edges.append((i, j, li))
            in_tree.add(j)
    return edges, None


def _walk_reference(scores, top, tau):
    """examples/attribution_tree.py of the 2021 code, generalised from 12 layers to L:
    its layer 10 is L-2, its walk over 9..0 is L-3..0, its 11/12 and 1/12 are (L-1)/L, 1/L.
    The edges (parent, child, layer row) and the drawing's heights."""
    n_layers, n = scores.shape[0], scores.shape[1]
    prop = scores * (scores > tau)  # entries not above tau become 0
    height = [0.0] * n
    fixed = [-1] * n  # -1: not in the tree; 0: in it, no child yet; 1: has had a child
    edges: list[tuple[int, int, int]] = []
    height[top] = (n_layers - 1) / n_layers
    fixed[top] = 0
    first = n_layers - 2
    for i in range(n):
        if i != top and prop[first][top][i] > tau:
            fixed[i] = 0
            fixed[top] = 1
            edges.append((top, i, first))
    # the 2021 code's cases of (fixed[i], fixed[j]), and its set of edges seen, come to this: an
    # edge needs i in the tree and j not (every edge seen has its j in the tree already)
    for li in range(n_layers - 3, -1, -1):
        for i in range(1, n):
            for j in range(n):
                if prop[li][i][j] < tau or fixed[i] == -1 or fixed[j] != -1:
                    continue
                if fixed[i] == 0:
                    fixed[i] = 1
                    height[j] = (height[i] * n_layers - 1) / n_layers
                else:
                    height[j] = min(height)
                fixed[j] = 0
                edges.append((i, j, li))
    return edges, height


def tree_for_example(example, layers: Sequence[int] | None = None, tau: float = DEFAULT_TAU,
                     lam: float | None = None, compat: str = "paper", num_layers: int | None = None,
                     top: int | None = None) -> nx.DiGraph:
    """The tree of a ``StoredExample``; ``layers`` picks among its scored layers (negative
    numbers count from ``num_layers``, the model's layer count). Default: all scored layers."""
    scored = list(example.layers)
    attribution = np.asarray(example.attribution)
    if layers is None:
        chosen = scored
    else:
        total = num_layers if num_layers else (max(scored) + 1 if scored else 0)
        chosen = []
        for layer in layers:
            actual = layer + total if layer < 0 else layer
            if actual not in scored:
                raise OptionError(
                    f"layer {layer} was not scored for example {example.index}; scored layers: "
                    + ", ".join(map(str, scored))
                )
            if actual not in chosen:
                chosen.append(actual)
    rows = [scored.index(layer) for layer in chosen]
    from ..labels import example_labels

    g = build_tree(attribution[rows], example_labels(example)[0], layers=chosen, tau=tau, lam=lam, compat=compat,
                   segments=example.segment_ids, top=top)
    g.graph["example"] = int(example.index)
    return g


def tree_edges(g: nx.DiGraph) -> list[tuple[int, int, int]]:
    """(parent, child, layer) in the order the edges were added."""
    data = sorted(g.edges(data=True), key=lambda e: e[2].get("order", 0))
    return [(int(i), int(j), int(d["layer"])) for i, j, d in data]


def has_path(g: nx.DiGraph, a: int, b: int) -> bool:
    """Whether one of the two tokens is an ancestor of the other in the tree."""
    if a not in g or b not in g:
        return False
    import networkx as nx

    return nx.has_path(g, a, b) or nx.has_path(g, b, a)


# -- JSON --------------------------------------------------------------------------


def tree_to_json(g: nx.DiGraph) -> dict:
    """Nodes, edges (layer, score, raw) and the top node, as plain JSON values."""
    gr = g.graph
    nodes = []
    for p, d in sorted(g.nodes(data=True)):
        node = {"position": int(p), "token": d["token"], "layer": d["layer"], "depth": d["depth"],
                "top": bool(d["top"]), "segment": d.get("segment")}
        if "ref_height" in d:
            node["ref_height"] = d["ref_height"]
        nodes.append(node)
    edges = [{"source": int(i), "target": int(j), "layer": int(d["layer"]), "score": d["score"], "raw": d["raw"]}
             for i, j, d in sorted(g.edges(data=True), key=lambda e: e[2].get("order", 0))]
    out = {
        "format": JSON_FORMAT, "version": JSON_VERSION,
        "mode": gr["mode"], "tau": gr["tau"], "lambda": gr.get("lam"),
        "layers": list(gr["layers"]), "top": int(gr["top"]), "top_chosen": bool(gr.get("top_chosen", False)),
        "tokens": list(gr["tokens"]),
        "nodes": nodes, "edges": edges,
    }
    if "example" in gr:
        out["example"] = gr["example"]
    return out


def tree_from_json(data: dict) -> nx.DiGraph:
    """The inverse of :func:`tree_to_json`."""
    if not isinstance(data, dict) or data.get("format") != JSON_FORMAT:
        raise OptionError(f"not an attribution tree (expected \"format\": \"{JSON_FORMAT}\")")
    import networkx as nx

    g = nx.DiGraph(top=data["top"], tau=data["tau"], lam=data.get("lambda"), mode=data["mode"],
                   layers=list(data["layers"]), tokens=list(data["tokens"]), top_chosen=bool(data.get("top_chosen", False)))
    if "example" in data:
        g.graph["example"] = data["example"]
    for node in data["nodes"]:
        g.add_node(node["position"], **node)
    for k, e in enumerate(data["edges"]):
        g.add_edge(e["source"], e["target"], layer=e["layer"], score=e["score"], raw=e["raw"], order=k)
    return g


# -- DOT ---------------------------------------------------------------------------

_LIGHT = (158, 202, 225)  # edge colour at the threshold
_DARK = (8, 48, 107)  # edge colour at score 1
_FILL = {0: "#fff2cc", 1: "#d9ead3", -1: "#eeeeee", None: "#f5f5f5"}


def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _strength(score: float, tau: float) -> float:
    lo = min(max(tau, 0.0), 0.99)
    return float(np.clip((score - lo) / (1.0 - lo), 0.0, 1.0))


def _colour(f: float) -> str:
    r, g, b = (round(a + (z - a) * f) for a, z in zip(_LIGHT, _DARK))
    return f"#{r:02x}{g:02x}{b:02x}"


def node_label(g: nx.DiGraph, p: int) -> str:
    return f"{g.nodes[p]['token']} ({p})"


def tree_to_dot(g: nx.DiGraph, title: str | None = None, show_input: bool = True,
                prediction: str | None = None, legend: bool = True) -> str:
    """DOT text: one row per layer (rank=same), the top node alone at the top, a column of
    layer names on the left; edges drawn with the arrow at the parent (information flows up),
    width and colour by score, labelled with their layer and score; with ``show_input`` the
    whole input, as token:position, at the foot. ``prediction`` (default: the graph's
    "prediction" attribute, if any) goes under the title; ``legend`` adds a key to the
    node colours, the top node's frame and the edges' width, colour and label."""
    gr = g.graph
    top = gr["top"]
    threshold = gr["tau"] if gr.get("lam") is None else max(gr["tau"], gr["lam"])
    if title is None:
        title = f"attribution tree, top node {node_label(g, top)}"
    prediction = prediction if prediction is not None else gr.get("prediction")
    if prediction:  # a line of its own ("prediction ... · attributed F = ..."), wrapped at its dots
        title = f"{title}\n" + "\n".join(_wrap_dots(str(prediction)))
    title = f"{title}\n{gr['mode']} mode, tau {gr['tau']:g}"
    title += ", top node chosen" if gr.get("top_chosen") else ""
    title += "" if gr.get("lam") is None else f", lambda {gr['lam']:g}"
    used = {d["layer"] for _, _, d in g.edges(data=True)}
    bare = [layer for layer in gr["layers"] if layer not in used]
    if bare:
        from ..labels import ranges

        title += f"\nlayers with no edge above tau (no row): {ranges(bare)}"
    lines = [
        "digraph attribution_tree {",
        f"  graph [label={_q(title)}, labelloc=t, fontname=\"Helvetica\", "
        "fontsize=14, ranksep=0.55, nodesep=0.3, newrank=true];",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=12, color="#555555"];',
        '  edge [dir=back, arrowtail=normal, fontname="Helvetica", fontsize=9, fontcolor="#333333"];',
    ]
    # the ladder of layer names: top, then the walked layers from the highest down
    # layers without an edge get no row: the title names them
    walked = [layer for layer in sorted(gr["layers"], reverse=True) if layer in used]
    rungs = ["rank_top"] + [f"rank_L{layer}" for layer in walked]
    lines += ['  node [shape=plaintext, style="", fontcolor="#777777", fontsize=11];',
              '  "rank_top" [label="top node"];',
              *(f'  "rank_L{layer}" [label="layer {layer}"];' for layer in walked),
              "  " + " -> ".join(f'"{r}"' for r in rungs) + " [style=invis];",
              '  node [shape=box, style="rounded,filled", fontcolor="#000000", fontsize=12];']
    # one row per layer (the tokens its edges brought in), the top node alone on the first
    for rung, layer in zip(rungs, [None, *walked]):
        members = [top] if layer is None else sorted(
            p for p, d in g.nodes(data=True) if p != top and d["layer"] == layer)
        lines.append("  { rank=same; " + " ".join(f'"{r}";' for r in [rung] + [f"t{p}" for p in members]) + " }")
    for p, d in sorted(g.nodes(data=True)):
        extra = ', penwidth=2.5, peripheries=2, color="#b30000"' if p == top else ""
        lines.append(f"  \"t{p}\" [label={_q(node_label(g, p))}, fillcolor=\"{_FILL.get(d.get('segment'), _FILL[None])}\"{extra}];")
    for i, j, d in sorted(g.edges(data=True), key=lambda e: e[2].get("order", 0)):
        f = _strength(d["score"], threshold)
        lines.append(
            f"  \"t{i}\" -> \"t{j}\" [label=\"   L{d['layer']} {d['score']:.2f}\", penwidth={1 + 4 * f:.2f}, "
            f"color=\"{_colour(f)}\"];"
        )
    feet = []  # under the ladder, each below the one before: the input, the legend; the last sinks to the foot
    if show_input:
        feet.append(("input", f'fontsize=10, fontcolor="#444444", label={_q(_wrap_tokens(gr["tokens"]))}'))
    if legend:
        feet.append(("legend", f"fontsize=9, label={_legend(g, threshold)}"))
    for above, (name, attrs) in zip([rungs[-1]] + [name for name, _ in feet], feet):
        lines += [f'  "{name}" [shape=plaintext, style="", {attrs}];', f'  "{above}" -> "{name}" [style=invis];']
    if feet:
        lines.append(f'  {{ rank=sink; "{feet[-1][0]}"; }}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _wrap_dots(line: str, width: int = 90) -> list[str]:
    """A " · "-separated line cut into lines of at most about ``width`` characters."""
    out, cur = [], ""
    for part in line.split(" · "):
        if cur and len(cur) + 3 + len(part) > width:
            out.append(cur)
            cur = part
        else:
            cur = f"{cur} · {part}" if cur else part
    return out + [cur] if cur else out


def _legend(g: nx.DiGraph, threshold: float) -> str:
    """An HTML-like DOT label: what the node colours, the top node's frame and the edges mean."""
    segments = {d.get("segment") for _, d in g.nodes(data=True)}
    names = {0: "first text", 1: "second text", -1: "special token", None: "token"}
    cells = "".join(
        f'<TD BGCOLOR="{_FILL.get(s, _FILL[None])}" BORDER="1">{names.get(s, "token")}</TD>'
        for s in sorted(segments, key=lambda s: (s is None, s if s is not None else 0)))
    lo, hi = _colour(0.0), _colour(1.0)
    return (
        '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">'
        '<TR><TD><TABLE BORDER="0" CELLBORDER="0" CELLSPACING="3" CELLPADDING="2">'
        f'<TR><TD>node colour:</TD>{cells}<TD BORDER="2" COLOR="#b30000">top node</TD></TR></TABLE></TD></TR>'
        '<TR><TD>edge: the child (below) feeds the parent (arrow); label L&lt;layer&gt; &lt;score&gt;,'
        " score = attribution / the layer's largest;"
        f' width and colour from <FONT COLOR="{lo}">{threshold:g}</FONT> to <FONT COLOR="{hi}">1</FONT></TD></TR>'
        "</TABLE>>"
    )


def _wrap_tokens(tokens: Sequence[str], width: int = 72) -> str:
    """The input as "token:position" words, wrapped, for the foot of the drawing."""
    out, line = [], "input:"
    for p, t in enumerate(tokens):
        word = f"{t}:{p}"
        if len(line) + 1 + len(word) > width:
            out.append(line)
            line = "  " + word
        else:
            line += " " + word
    out.append(line)
    return "\n".join(out)


# -- rendering ---------------------------------------------------------------------


def render(dot_text: str, fmt: str) -> bytes:
    """PNG or SVG bytes from DOT text, through Graphviz's ``dot`` program."""
    if fmt not in RENDER_FORMATS:
        raise OptionError(f"cannot render '{fmt}'; available: {', '.join(RENDER_FORMATS)}")
    import graphviz

    try:
        return graphviz.Source(dot_text).pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise GraphvizError(DOT_MISSING) from None
    except graphviz.CalledProcessError as exc:
        detail = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
        first = next((line for line in detail.splitlines() if line.strip()), f"exit status {exc.returncode}")
        raise GraphvizError(f"Graphviz's dot failed: {first.strip()}") from None
