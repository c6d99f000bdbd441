"""Every text model type transformers maps to a classifier or a causal LM, checked:
``python tests/arch_catalog.py`` builds each as a tiny random model (tests/arch_matrix.py),
scores it in float64 and compares every layer with the independent reference (verified to
1e-6 relative), or records the one line attattr refuses it with, or why the tiny model could
not be built. It writes ``tests/arch_states.json`` (what tests/test_architectures.py checks)
and the table of docs/models.md between its ``catalog`` markers. Run it after a transformers
upgrade: the test that compares the catalog with transformers' mappings names what is new."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
STATES = HERE / "arch_states.json"
DOCS = HERE.parent / "docs" / "models.md"
START, END = "<!-- catalog:start -->", "<!-- catalog:end -->"


def survey(types, tokenizer, seconds: int = 60) -> dict:
    """{type: {"state": verified | refused | not built, "detail": ...}}."""
    import torch

    from attattr_cli.errors import AttattrError
    from test_architectures import check, group_difference, tol_for

    torch.set_num_threads(1)

    class Slow(Exception):
        pass

    def alarm(*_):
        raise Slow()

    signal.signal(signal.SIGALRM, alarm)
    out = {}
    for mt in types:
        t0 = time.process_time()
        signal.alarm(seconds)
        try:
            worst = max(check(mt, tokenizer).values())
            state = {"state": "verified" if worst < tol_for(mt) else "DISAGREES",
                     "detail": f"max rel {worst:.1e}" + (" (float32)" if tol_for(mt) > 1e-6 else "")}
            grouped = group_difference(mt, tokenizer)  # scored in groups: the same numbers as one at a time
            state["groupable"] = grouped is not None
            if grouped is not None and grouped > 1e-9:
                state = {"state": "DISAGREES", "detail": f"a group differs from one at a time by {grouped:.1e}",
                         "groupable": True}
        except AttattrError as exc:
            state = {"state": "refused", "detail": str(exc)}
        except Slow:
            state = {"state": "not built", "detail": f"the tiny model took over {seconds} s"}
        except Exception as exc:  # noqa: BLE001  (the tiny config: a field the generic builder does not set)
            state = {"state": "not built", "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                     if str(exc) else type(exc).__name__}
        finally:
            signal.alarm(0)
        state["cpu_s"] = round(time.process_time() - t0, 2)
        out[mt] = state
        print(f"{mt:26s} {state['state']:10s} {state['detail'][:150]}", flush=True)
    return out


def _reason(detail: str) -> str:
    """The refusal line without the model's name and the pointer to this document."""
    text = detail.split(": ", 1)[1] if "is not supported: " in detail else detail
    text = text.replace("; see docs/models.md for the supported architectures", "").replace(" (see docs/models.md)", "")
    return text.replace("|", "/")


def table(states: dict) -> str:
    count = {s: sum(v["state"] == s for v in states.values()) for s in ("verified", "refused", "not built")}
    lines = [START, "",
             f"{len(states)} text model types (transformers {_version()}): {count['verified']} verified,"
             f" {count['refused']} refused with one line, {count['not built']} not built by the generic tiny"
             " config (not checked).", "",
             "| model type | state | detail |", "| --- | --- | --- |"]
    for mt, v in sorted(states.items()):
        detail = v["detail"] if v["state"] != "refused" else _reason(v["detail"])
        lines.append(f"| `{mt}` | {v['state']} | {detail} |")
    return "\n".join(lines + ["", END])


def _version() -> str:
    import transformers

    return transformers.__version__


def main(argv) -> None:
    from transformers import BertTokenizerFast

    from attattr_cli.models.catalog import text_types

    d = Path(tempfile.mkdtemp())
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                            *[f"w{i}" for i in range(40)]]) + "\n")
    tokenizer = BertTokenizerFast(str(d / "vocab.txt"), model_max_length=48)
    types = argv or text_types()
    states = json.loads(STATES.read_text()) if STATES.exists() and argv else {}
    states.update(survey(types, tokenizer))
    STATES.write_text(json.dumps(dict(sorted(states.items())), indent=1) + "\n")
    docs = DOCS.read_text()
    if START in docs:
        docs = docs[:docs.index(START)] + table(states) + docs[docs.index(END) + len(END):]
        DOCS.write_text(docs)


if __name__ == "__main__":
    main(sys.argv[1:])
