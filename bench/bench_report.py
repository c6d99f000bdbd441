"""How `attattr report` scales: a store of N examples (10,000 by default) synthesised by
copying the examples of a small store of the built-in default with the store writer, the
report written as a folder, then the page measured in headless Chromium: load time, DOM
size, and the time to sort, filter, turn a page and open an example.

Run: `just bench-report` (or python bench/bench_report.py [--examples N] [--keep DIR]).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from attattr_cli.store import Store, StoreWriter  # noqa: E402
from attattr_cli.views.report import build_report  # noqa: E402


def synthesise(source: Path, out: Path, n: int) -> float:
    """Write ``n`` examples into ``out``, cycling through the examples of ``source``."""
    t = time.perf_counter()
    with Store(source) as s:
        fp, prov = s.fingerprint, s.provenance
        base = [s.get(i) for i in s.indices()]
    fp.pop("store_dtype", None)
    with StoreWriter(out, fp, {k: v for k, v in prov.items() if k != "runs"}) as w:
        for i in range(n):
            e = base[i % len(base)]
            w.write(SimpleNamespace(
                index=i, tokens=e.tokens, input_ids=e.input_ids, segment_ids=e.segment_ids, logits=e.logits,
                probs=e.probs, gold=(e.gold + (i % 7 == 0)) % 3, pred=e.pred, target=e.target, f_full=e.f_full,
                kernel=e.kernel, truncated=e.truncated, text_a=f"{e.text_a} #{i}", text_b=e.text_b, meta=e.meta,
                layers=e.layers, attribution=e.attribution, attention=e.attention, head_max=e.head_max,
                f_baseline=e.f_baseline, residual=e.residual, families=None, step_batch=0))
    return time.perf_counter() - t


def measure_page(index: Path) -> dict:
    from browser import Chromium

    with Chromium() as b:
        t = time.perf_counter()
        page = b.open(index.as_uri())
        load = time.perf_counter() - t

        def timed(js: str) -> float:
            return page.eval(f"(function(){{var t=performance.now(); {js}; return performance.now()-t;}})()")

        out = {
            "load_s": round(load, 3),
            "dom_elements": page.eval("document.getElementsByTagName('*').length"),
            "rows_in_dom": page.eval("document.querySelectorAll('tr.aa-row').length"),
            "sort_ms": round(timed("document.querySelectorAll('table.aa-rows th')[4].click()"), 1),
            "sort_again_ms": round(timed("document.querySelectorAll('table.aa-rows th')[4].click()"), 1),
            "next_page_ms": round(timed("document.querySelector('.aa-next').click()"), 1),
        }
        page.eval("var f=document.querySelector('.aa-filter'); f.value='#123'; f.dispatchEvent(new Event('input')); 1")
        time.sleep(0.3)
        out["filter_rows"] = page.eval("document.querySelectorAll('tr.aa-row').length")
        out["filter_ms"] = round(timed("document.querySelector('.aa-flag-filter').dispatchEvent(new Event('change'))"), 1)
        t = time.perf_counter()
        page.eval("document.querySelector('tr.aa-row').click(); 1")
        while not page.eval("document.querySelectorAll('.aa-overlay .aa-cell').length"):
            time.sleep(0.02)
        out["open_example_s"] = round(time.perf_counter() - t, 3)
        out["console_errors"] = page.errors()
        out["non_file_requests"] = [u for u in page.requests() if not u.startswith("file:")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--keep", type=Path, default=None, help="Work in this folder (kept) instead of a temporary one.")
    ap.add_argument("--reuse", action="store_true", help="With --keep: use the big store already there.")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="attattr-bench-report-"))
    work.mkdir(parents=True, exist_ok=True)
    small, big = work / "small.h5", work / "big.h5"
    if not small.exists():
        subprocess.run([sys.executable, "-m", "attattr_cli", "score", "--out", str(small), "--examples", "0:8",
                        "--steps", "4", "-q"], check=True, stdout=subprocess.DEVNULL)
    result = {"examples": args.examples}
    if args.reuse and big.exists() and len(Store(big)) == args.examples:
        result["synthesise_s"] = "reused"
    else:
        big.unlink(missing_ok=True)
        result["synthesise_s"] = round(synthesise(small, big, args.examples), 1)
    result["store_mb"] = round(big.stat().st_size / 1e6, 1)
    t, cpu = time.perf_counter(), time.process_time()
    with Store(big) as s:
        r = build_report(s, work / "report")
    result.update(report_s=round(time.perf_counter() - t, 1), report_cpu_s=round(time.process_time() - cpu, 1), report_mb=round(r.bytes / 1e6, 1),
                  index_html_mb=round((work / "report" / "index.html").stat().st_size / 1e6, 2))
    result.update(measure_page(work / "report" / "index.html"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
