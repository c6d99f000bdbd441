"""Store-only commands start without torch or transformers (so shell pipelines stay quick).

Each command runs in a fresh interpreter that imports the CLI and runs it, then reports
which heavy modules were imported; the store is written by hand, without a model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from attattr_cli.store import Store, StoreWriter

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers")

# runs the app as `attattr ARGS...` and prints, as the last line on stderr, the exit code and
# which of HEAVY were imported
RUNNER = """
import json, sys
sys.argv = ["attattr", *json.loads(sys.argv[1])]
from attattr_cli.cli import app
try:
    app()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}), file=sys.stderr)
""" % (HEAVY,)


def _run(*args, cwd) -> tuple[dict, subprocess.CompletedProcess]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", RUNNER, json.dumps([str(a) for a in args])], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return report, result


def _example(index: int, rng: np.random.Generator, layers: int = 2, heads: int = 2):
    tokens = ["[CLS]", "a", "good", "film", "[SEP]"]
    n = len(tokens)
    attribution = rng.random((layers, heads, n, n)).astype(np.float32)
    return SimpleNamespace(
        index=index, tokens=tokens, input_ids=np.arange(n), segment_ids=np.zeros(n, np.int64),
        logits=np.array([0.2, -0.1]), probs=np.array([0.57, 0.43]), layers=list(range(layers)),
        attribution=attribution, attention=rng.random((layers, heads, n, n)).astype(np.float32),
        head_max=attribution.max(axis=(2, 3)), f_baseline=np.full(layers, 0.5), residual=np.full(layers, 1e-4),
        gold=index % 2, pred=0, target=0, f_full=0.57, kernel="torch", truncated=False,
        text_a="a good film", text_b=None, meta={},
    )


@pytest.fixture
def small_store(tmp_path) -> Path:
    """Two examples of a 2-layer, 2-head model, written without any model."""
    path = tmp_path / "small.h5"
    rng = np.random.default_rng(0)
    fingerprint = {"weights_sha256": "0" * 64, "data": "hand.tsv", "data_sha256": "1" * 64, "options": {"steps": 4}}
    provenance = {"model": "hand-made", "num_layers": 2, "num_heads": 2, "label_names": ["negative", "positive"]}
    with StoreWriter(path, fingerprint, provenance) as w:
        for i in range(2):
            w.write(_example(i, rng))
    return path


@pytest.mark.parametrize("args", [
    ["--help"],
    ["--version"],
    ["info", "{store}"],
    ["info", "{store}", "--json"],
    ["tree", "{store}", "--example", "1", "--format", "json", "-q"],
    ["merge", "{store}", "--out", "{dir}/merged.h5", "--json"],
    ["triggers", "{store}", "--out", "{dir}/triggers.json"],
], ids=["help", "version", "info", "info-json", "tree", "merge", "triggers"])
def test_store_only_commands_import_neither_torch_nor_transformers(small_store, tmp_path, args):
    args = [a.format(store=small_store, dir=tmp_path) for a in args]
    report, result = _run(*args, cwd=tmp_path)
    assert report["code"] == 0, result.stderr
    assert report["heavy"] == [], f"attattr {' '.join(args)} imported {report['heavy']}"
    assert result.stdout.strip()  # each of them prints something on stdout
    if args[0] == "info" and "--json" in args:
        assert json.loads(result.stdout)["examples"] == 2
    if args[0] == "merge":
        with Store(tmp_path / "merged.h5") as s:
            assert s.indices() == [0, 1]


def test_help_constants_agree_with_the_library():
    """The quadrature rules and token importance methods named in help are written out in the
    command modules (importing the library's would import torch); they must match it."""
    import importlib

    from attattr_cli.analysis.token_importance import METHODS
    from attattr_cli.engine.integrate import RULES

    # (attattr_cli.cli.score is the command function; the module is reached by its full name)
    assert importlib.import_module("attattr_cli.cli.score").RULES == RULES
    assert importlib.import_module("attattr_cli.cli.faithfulness").METHODS == tuple(METHODS)
