"""Attribution trees: hand-built matrices with known trees, both modes, JSON, DOT through Graphviz, the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess

import networkx as nx
import numpy as np
import pytest

from attattr_cli.analysis.tree import (
    DOT_MISSING,
    GraphvizError,
    build_tree,
    has_path,
    render,
    tree_edges,
    tree_from_json,
    tree_to_dot,
    tree_to_json,
)
from attattr_cli.errors import OptionError
from conftest import one_error_line, run_cli

HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="Graphviz's dot is not installed")

TOKENS = ["[CLS]", "a", "b", "[SEP]", "c", "[SEP]"]
SEGMENTS = [-1, 0, 0, -1, 1, -1]


def known() -> np.ndarray:
    """Head-summed [3 layers, 6, 6] whose paper tree is 2 -> 4 (L2), 4 -> 1 (L1), 4 -> 0, 1 -> 5 (L0)."""
    a = np.zeros((3, 6, 6))
    a[2, 2, 4] = 1.0
    a[2, 2, 1] = 0.3  # below tau
    a[1, 4, 1] = 1.0
    a[1, 2, 1] = 0.5  # 1 already has a better parent at this layer
    a[0, 1, 5] = 1.0
    a[0, 4, 0] = 0.6
    a[0, 0, 3] = 9.0  # the [CLS] row: not in the normaliser, never a parent
    return a


def quirks() -> np.ndarray:
    """[3, 6, 6] where the 2021 procedure and the paper mode differ in every way documented."""
    a = np.zeros((3, 6, 6))
    a[2, 1, 3] = 1.0  # last layer: the reference never uses it
    a[1, 1, 2] = 1.0
    a[1, 1, 4] = 0.5
    a[1, 3, 4] = 0.9  # paper: 4 takes its best parent 3; reference: only the top node is a parent here
    a[0, 2, 5] = 0.5  # reference: first passing entry by position wins (2 -> 5)
    a[0, 4, 5] = 1.0  # paper: the best score wins (4 -> 5)
    a[0, 5, 0] = 0.8  # reference: 5, added in layer 0, takes a child in layer 0 too
    a[0, 5, 3] = 0.7  # reference: a second child of 5, drawn at min(height)
    return a


def check_tree(g: nx.DiGraph, threshold: float) -> None:
    top = g.graph["top"]
    assert top != 0 and top in g
    assert g.in_degree(top) == 0
    assert all(g.in_degree(p) == 1 for p in g if p != top)  # one parent each
    assert nx.is_directed_acyclic_graph(g)
    if g.number_of_edges():
        assert nx.is_arborescence(g)
    for i, j, d in g.edges(data=True):
        assert d["score"] > threshold
        assert i != 0  # the first query row is never a parent


def test_known_tree_paper_mode():
    g = build_tree(known(), TOKENS, segments=SEGMENTS)
    assert g.graph["top"] == 2 and g.graph["mode"] == "paper"
    assert tree_edges(g) == [(2, 4, 2), (4, 1, 1), (4, 0, 0), (1, 5, 0)]
    assert 3 not in g  # reached only from the [CLS] row
    assert g.nodes[2]["top"] and g.nodes[2]["layer"] == 2 and g.nodes[2]["depth"] == 0
    assert g.nodes[5]["layer"] == 0 and g.nodes[5]["depth"] == 3 and g.nodes[5]["token"] == "[SEP]"
    assert g.nodes[4]["segment"] == 1
    assert g.edges[4, 0]["score"] == pytest.approx(0.6) and g.edges[4, 0]["raw"] == pytest.approx(0.6)
    check_tree(g, 0.4)
    assert has_path(g, 5, 2) and not has_path(g, 5, 0)


def test_chosen_top_node():
    g = build_tree(known(), TOKENS, top=4)
    assert g.graph["top"] == 4 and g.graph["top_chosen"]
    # from 4: layer 2 has nothing above tau in row 4; layer 1 gives 4 -> 1; layer 0 gives 4 -> 0, 1 -> 5
    assert tree_edges(g) == [(4, 1, 1), (4, 0, 0), (1, 5, 0)]
    check_tree(g, 0.4)
    assert tree_edges(build_tree(known(), TOKENS, top=-2)) == tree_edges(g)
    assert tree_from_json(tree_to_json(g)).graph["top_chosen"]
    assert "top node chosen" in tree_to_dot(g)
    ref = build_tree(known(), TOKENS, top=4, compat="reference")
    # layer L-2 = 1 gives the top node's children; in layer 0 queries are scanned in position order
    assert ref.graph["top"] == 4 and tree_edges(ref) == [(4, 1, 1), (1, 5, 0), (4, 0, 0)]
    for bad in (0, 6, -7, 2.5):
        with pytest.raises(OptionError, match="root (must be|cannot be)"):
            build_tree(known(), TOKENS, top=bad)


def test_heads_are_summed_and_layers_are_labels():
    a = known()
    split = np.stack([a * 0.25, a * 0.75], axis=1)  # [L, 2 heads, n, n]
    g4 = build_tree(split, TOKENS)
    assert tree_edges(g4) == tree_edges(build_tree(a, TOKENS))
    # the same maps labelled as layers 3, 7, 9 of a deeper model, given in another order
    g = build_tree(a[[1, 0, 2]], TOKENS, layers=[7, 3, 9])
    assert tree_edges(g) == [(2, 4, 9), (4, 1, 7), (4, 0, 3), (1, 5, 3)]


def test_tau_and_lambda():
    g = build_tree(known(), TOKENS, tau=0.7)
    assert (4, 0, 0) not in tree_edges(g)
    check_tree(g, 0.7)
    g = build_tree(known(), TOKENS, tau=0.2)
    assert (2, 1, 2) in tree_edges(g)  # 0.3 now passes at the top layer
    g = build_tree(known(), TOKENS, tau=0.2, lam=0.65)
    assert (2, 1, 2) not in tree_edges(g) and (4, 0, 0) not in tree_edges(g)
    check_tree(g, 0.65)
    assert g.graph["lam"] == 0.65


def test_reference_mode_quirks():
    a = quirks()
    paper = build_tree(a, TOKENS)
    ref = build_tree(a, TOKENS, compat="reference")
    assert paper.graph["top"] == ref.graph["top"] == 1
    assert tree_edges(paper) == [(1, 3, 2), (1, 2, 1), (3, 4, 1), (4, 5, 0)]
    # the last layer is never walked; first passing entry by position; a same-layer chain 2 -> 5 -> 0
    assert tree_edges(ref) == [(1, 2, 1), (1, 4, 1), (2, 5, 0), (5, 0, 0), (5, 3, 0)]
    check_tree(paper, 0.4)
    check_tree(ref, 0.4)
    h = {p: d["ref_height"] for p, d in ref.nodes(data=True)}
    assert h[1] == pytest.approx(2 / 3)  # (L-1)/L, 11/12 with 12 layers
    assert h[2] == h[4] == 0  # the top node's children keep height 0
    assert h[5] == pytest.approx(-1 / 3) and h[0] == pytest.approx(-2 / 3)  # one layer below the expanded node
    assert h[3] == pytest.approx(-2 / 3)  # a second child sits at min(height)
    assert "ref_height" not in paper.nodes[1]


def test_reference_mode_literal_threshold_and_ties():
    a = quirks()
    # tau = 0: masked entries are 0 and "0 < tau" is false, so the 2021 loop adds zero-score edges
    ref = build_tree(a, TOKENS, tau=0.0, compat="reference")
    assert any(d["score"] <= 0 for _, _, d in ref.edges(data=True))
    assert all(d["score"] > 0 for _, _, d in build_tree(a, TOKENS, tau=0.0).edges(data=True))
    # all row sums equal (zero): the paper mode takes the lowest position, the reference the highest
    flat = np.zeros((2, 5, 5))
    assert build_tree(flat, TOKENS[:5]).graph["top"] == 1
    assert build_tree(flat, TOKENS[:5], compat="reference").graph["top"] == 4


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("compat", ["paper", "reference"])
def test_random_maps_give_trees(seed, compat):
    rng = np.random.default_rng(seed)
    n = 12
    a = rng.normal(size=(4, 3, n, n)) ** 3
    g = build_tree(a, [f"w{i}" for i in range(n)], tau=0.3, compat=compat)
    check_tree(g, 0.3)
    if compat == "paper":  # layers fall strictly along every path down from the top
        for i, j, d in g.edges(data=True):
            assert g.nodes[j]["layer"] == d["layer"]
            if not g.nodes[i]["top"]:
                assert d["layer"] < g.nodes[i]["layer"]


def test_bad_options():
    a = known()
    with pytest.raises(OptionError, match="--tau must be a number >= 0"):
        build_tree(a, TOKENS, tau=-0.1)
    with pytest.raises(OptionError, match="not part of the 2021 procedure"):
        build_tree(a, TOKENS, lam=0.5, compat="reference")
    with pytest.raises(OptionError, match="unknown --compat 'paperish'; available: paper, reference"):
        build_tree(a, TOKENS, compat="paperish")
    with pytest.raises(OptionError, match="needs at least 2 layers"):
        build_tree(a[:1], TOKENS, compat="reference")
    with pytest.raises(OptionError, match="5 tokens for an attribution of 6 x 6"):
        build_tree(a, TOKENS[:5])


def test_json_round_trip():
    g = build_tree(quirks(), TOKENS, compat="reference", segments=SEGMENTS)
    data = json.loads(json.dumps(tree_to_json(g)))
    assert data["top"] == 1 and data["mode"] == "reference" and data["tokens"] == TOKENS
    assert data["edges"][0] == {"source": 1, "target": 2, "layer": 1, "score": 1.0, "raw": 1.0}
    back = tree_from_json(data)
    assert tree_edges(back) == tree_edges(g)
    assert dict(back.nodes(data=True)) == dict(g.nodes(data=True))
    assert back.graph == g.graph
    with pytest.raises(OptionError, match="not an attribution tree"):
        tree_from_json({"nodes": []})


def _parse_dot(dot: str) -> tuple[dict, list]:
    """Graphviz reads the DOT back: (node name -> label, [(tail, head, label)]) of the token nodes."""
    out = subprocess.run(["dot", "-Tjson"], input=dot.encode(), capture_output=True, check=True).stdout
    d = json.loads(out)
    names = {k: o["name"] for k, o in enumerate(d["objects"])}
    nodes = {o["name"]: o.get("label") for o in d["objects"] if o["name"].startswith("t")}
    edges = [(names[e["tail"]], names[e["head"]], e.get("label", "").strip()) for e in d.get("edges", [])]
    return nodes, [e for e in edges if e[0].startswith("t")]


@needs_dot
def test_dot_is_read_back_by_graphviz():
    g = build_tree(known(), ['q"uote', "a\\b", "b", "[SEP]", "c", "[SEP]"], segments=SEGMENTS)
    dot = tree_to_dot(g)
    assert "rank=same" in dot and '"rank_L2"' in dot
    nodes, edges = _parse_dot(dot)
    assert nodes["t2"] == "b (2)" and nodes["t0"] == 'q"uote (0)' and nodes["t1"] == "a\\\\b (1)"
    assert set(nodes) == {f"t{p}" for p in g}
    assert edges == [("t2", "t4", "L2 1.00"), ("t4", "t1", "L1 1.00"), ("t4", "t0", "L0 0.60"), ("t1", "t5", "L0 1.00")]
    png = render(dot, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in render(dot, "svg")


def test_missing_dot_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GraphvizError) as info:
        render(tree_to_dot(build_tree(known(), TOKENS)), "png")
    assert str(info.value) == DOT_MISSING
    assert "apt-get install graphviz" in DOT_MISSING and "brew install graphviz" in DOT_MISSING


# -- the command -------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from attattr_cli.engine.run import ScoreRequest, score_to_store
    from attattr_cli.engine.options import ScoreOptions

    p = tmp_path_factory.mktemp("tree") / "s.h5"
    score_to_store(ScoreRequest(out=str(p), examples="0:5", options=ScoreOptions(steps=4), command=["test"]))
    return p


@needs_dot
def test_cli_dot_on_stdout(store):
    result = run_cli("tree", store, "--example", 3)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("digraph attribution_tree {")
    assert "example 3:" in result.stderr and "top node" in result.stderr
    nodes, edges = _parse_dot(result.stdout)
    assert nodes and len(edges) == len(nodes) - 1


def test_cli_files_and_formats(store, tmp_path):
    js = tmp_path / "t.json"
    assert run_cli("tree", store, "-e", 1, "-o", js, "-q").exit_code == 0
    data = json.loads(js.read_text())
    assert data["example"] == 1 and data["layers"] == [0, 1, 2] and data["nodes"]
    ref = run_cli("tree", store, "-e", 1, "--compat", "reference", "--format", "json", "--layers", "0,1,2")
    assert ref.exit_code == 0 and json.loads(ref.stdout)["mode"] == "reference"
    one = run_cli("tree", store, "-e", 1, "--format", "json", "--layers", "-1")
    assert one.exit_code == 0 and json.loads(one.stdout)["layers"] == [2]


@needs_dot
def test_cli_png(store, tmp_path):
    png = tmp_path / "tree.png"
    result = run_cli("tree", store, "-e", 0, "-o", png)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stdout == ""
    piped = run_cli("tree", store, "-e", 0, "--format", "svg", "-q")  # stdout is not a terminal here
    assert piped.exit_code == 0 and "<svg" in piped.stdout


def test_cli_errors(store, tmp_path):
    one_error_line(run_cli("tree", store, "--example", 7), "example 7 is not in")
    one_error_line(run_cli("tree", store, "--example", 7), "(it holds 5 examples: 0..4)")
    one_error_line(run_cli("tree", store, "-e", 0, "-o", tmp_path / "t.pdf"), "cannot tell the format from")
    one_error_line(run_cli("tree", store, "-e", 0, "--format", "gif"), "unknown --format 'gif'")
    one_error_line(run_cli("tree", store, "-e", 0, "--top", 0), "root cannot be position 0")
    one_error_line(run_cli("tree", store, "-e", 0, "--top", 999), "root must be a token position")
    one_error_line(run_cli("tree", store, "-e", 0, "--layers", "5"), "layer 5 was not scored for example 0; scored layers: 0, 1, 2")
    one_error_line(run_cli("tree", store, "-e", 0, "--compat", "2020"), "unknown --compat '2020'")
    one_error_line(run_cli("tree", store, "-e", 0, "--compat", "reference", "--lambda", "0.5"), "not part of the 2021")
    one_error_line(run_cli("tree", tmp_path / "none.h5", "-e", 0), "no such store")
