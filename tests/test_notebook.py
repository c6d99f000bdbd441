"""attattr in Jupyter: progress in a kernel (a text line updated in place, no widgets), and
examples/quickstart.ipynb executed with nbclient, its outputs checked, its nbconvert HTML
opened in headless Chromium with and without scripts."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra (pip install -e .[test])")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the test extra (pip install -e .[test])")


def execute(nb, cwd: Path, timeout: int = 300):
    """Run every cell of ``nb`` in a fresh python3 kernel (this interpreter, this environment)
    with ``cwd`` as its working folder; raises on the first cell that fails."""
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def outputs_text(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            parts.append(o["text"])
        elif "data" in o:
            parts.append(str(o["data"].get("text/plain", "")))
        elif o["output_type"] == "error":
            parts.append("\n".join(o["traceback"]))
    return "".join(parts)


# -- progress ------------------------------------------------------------------------------
def test_progress_in_a_kernel_is_one_text_line_without_widgets(tmp_path):
    """``progress=True`` in a notebook: one text/plain output updated in place through a display
    handle, ending as ``work 40/40 in … s``; nothing on stderr (rich's ipywidgets warning was)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import time\n"
        "from attattr_cli.api.model import in_notebook, progress_for\n"
        "assert in_notebook()\n"
        "with progress_for(True, 'work') as bar:\n"
        "    for i in range(40):\n"
        "        time.sleep(0.02)\n"
        "        bar(i + 1, 40, f'item {i}')\n")]
    cell = execute(nb, tmp_path).cells[0]
    kinds = [o["output_type"] for o in cell.outputs]
    assert kinds == ["display_data"], cell.outputs  # no stream (stderr) output, one display
    out = cell.outputs[0]
    assert set(out["data"]) == {"text/plain"} and "application/vnd.jupyter.widget-view+json" not in out["data"]
    line = out["data"]["text/plain"]
    assert line.startswith("work 40/40 in ") and line.endswith(" s") and "\n" not in line
    # the first display said "work …": the line in the saved notebook is the last update, made in place


def test_progress_line_text():
    """The in-place line: a bar of the done share, done/total, the label and the time left."""
    from attattr_cli.api.model import NotebookLine

    line = NotebookLine.__new__(NotebookLine)
    line.description, line.start = "score", __import__("time").monotonic() - 10.0
    text = line.line(6, 24, "example 5")
    assert text.startswith("score " + "█" * 6 + "░" * 18 + " 6/24 example 5  10.0 s, ") and text.endswith(" s left")
    assert float(text.split(", ")[-1].split()[0]) == pytest.approx(30, abs=1)  # 10 s for 6 of 24: 30 s left
    assert line.line(24, 24, "", final=True).startswith("score 24/24 in 10.")


def test_progress_is_off_where_stderr_is_not_a_terminal(capsys):
    """Outside a notebook and without a terminal (a script's log, CI) ``progress=True`` draws
    nothing: the library gets no callback."""
    from attattr_cli.api.model import in_notebook, progress_for

    assert not in_notebook() and not sys.stderr.isatty()
    with progress_for(True, "work") as bar:
        assert bar is None
    assert capsys.readouterr() == ("", "")
    calls = []
    with progress_for(lambda *a: calls.append(a), "work") as bar:
        bar(1, 2, "x")
    assert calls == [(1, 2, "x")]


# -- examples/quickstart.ipynb ---------------------------------------------------------------
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
MAX_TEXT = 20_000  # characters of text (text/plain and streams) one cell may print
MAX_NOTEBOOK = 340_000  # bytes of the executed notebook: 10 % of the 3.4 MB the same walk made before (measured 283 KB)
MAX_CELL = 150_000  # bytes of one cell's outputs: a view or a figure, never megabytes of PNG as text
RICH = ("image/png", "image/svg+xml", "text/html")


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """examples/quickstart.ipynb run top to bottom in a fresh kernel (a failing cell fails here)."""
    work = tmp_path_factory.mktemp("quickstart")
    nb = execute(nbformat.read(NOTEBOOK, as_version=4), work)
    path = work / "executed.ipynb"
    nbformat.write(nb, path)
    return nb, path


def test_quickstart_runs_clean_and_shows_rich_results(quickstart):
    nb, path = quickstart
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)
    for c in code:
        where = c.source.splitlines()[0]
        assert not [o for o in c.outputs if o["output_type"] == "error"], where
        text = outputs_text(c)
        size = len(nbformat.writes(nbformat.v4.new_notebook(cells=[c])))
        assert size <= MAX_CELL, f"{where}: {size:,} bytes"
        assert len(text) <= MAX_TEXT, f"{where}: {len(text):,} characters of text"
        assert not [o for o in c.outputs if o.get("name") == "stderr"], f"{where}: {outputs_text(c)[:500]}"
        if "rich" in c.metadata.get("tags", []) and (shutil.which("dot") or "aa.tree(" not in c.source):
            # (a tree is drawn by Graphviz's dot: without it the Tree shows its one-line repr)
            kinds = {k for o in c.outputs for k in o.get("data", {})}
            assert kinds & set(RICH), f"{where}: no rich display, only {sorted(kinds)}"
    scored = next(c for c in code if "progress=True" in c.source)  # the progress line, finished in place
    lines = [o["data"]["text/plain"] for o in scored.outputs if o["output_type"] == "display_data"]
    assert len(lines) == 1 and re.fullmatch(r"score \d+/\d+ in \d+\.\d s", lines[0]), lines
    tagged = [c for c in code if "rich" in c.metadata.get("tags", [])]
    assert len(tagged) >= 12
    assert path.stat().st_size <= MAX_NOTEBOOK, f"the executed notebook is {path.stat().st_size:,} bytes"


def test_quickstart_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")


CELLS = "svg.aa-still-map g[shape-rendering]"  # the cells of a view's still heatmaps
OFFLINE = "net::ERR_"  # nbconvert's page loads require.js and MathJax from a CDN: offline, those fail


@pytest.mark.skipif(__import__("browser").find_chromium() is None, reason="chromium is not installed")
def test_quickstart_html_shows_the_heatmaps_with_and_without_scripts(quickstart, tmp_path):
    """The notebook rendered by nbconvert, in headless Chromium: with scripts every view is drawn
    by its script; with every <script> removed (GitHub's preview, an untrusted notebook) every
    view shows its still heatmaps; the pictures (PNG, SVG) show in both."""
    exporter = pytest.importorskip("nbconvert").HTMLExporter()
    from browser import Chromium, painted_colours, strip_scripts

    nb, _ = quickstart
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    views = sum("AttattrView.render" in str(o.get("data", {}).get("text/html", "")) for o in outputs)
    pictures = sum("image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {}) for o in outputs)
    assert views >= 1 and pictures >= 5
    body, _ = exporter.from_notebook_node(nb)
    (tmp_path / "nb.html").write_text(body)
    (tmp_path / "bare.html").write_text(strip_scripts(body))
    loaded = "Array.from(document.querySelectorAll('img')).filter(i => i.complete && i.naturalWidth > 0).length"
    with Chromium() as b:
        p = b.open((tmp_path / "nb.html").as_uri())
        assert p.eval("document.querySelectorAll('.aa-grid').length") == 2 * views  # attribution and attention
        assert p.eval("document.querySelectorAll('.aa-still').length") == 0
        png = p.screenshot()
        assert painted_colours(p, png, ".aa-grid") > 10
        assert p.eval(loaded) >= pictures
        assert [e for e in p.errors() if OFFLINE not in e] == []
        q = b.open((tmp_path / "bare.html").as_uri())
        assert q.eval("document.querySelectorAll('.aa-grid').length") == 0  # no script ran
        assert q.eval("document.querySelectorAll('svg.aa-still-map').length") == 2 * views
        png = q.screenshot()
        assert painted_colours(q, png, CELLS) > 10
        assert q.eval(loaded) >= pictures
        assert q.errors() == []
