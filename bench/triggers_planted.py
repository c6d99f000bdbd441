"""Triggers on the built-in default: are the extracted triggers the planted pairs, and do
they flip the other classes while random-token controls do not?

Triggers come from 600 synthetic examples written with another seed than the held-out
set (`attattr demo data --seed 1`); the attack runs on the 200 held-out examples.
Prints the top triggers with their planted relation and the per-class table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attattr_cli.data import synthetic  # noqa: E402

TOP = int(os.environ.get("TOP", "12"))


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "attattr_cli", *args], check=True, stdout=subprocess.DEVNULL)


def relation(tokens: list[str], segments: list[int]) -> str | None:
    """The label the planted pair decides, or None when the trigger is not a key-word pair."""
    if len(tokens) != 2 or segments != [0, 1]:
        return None
    p, q = tokens
    if p not in synthetic.PREMISE_WORDS or q not in synthetic.HYPOTHESIS_WORDS:
        return None
    return synthetic.LABELS[synthetic.label_of(synthetic.PREMISE_WORDS.index(p), synthetic.HYPOTHESIS_WORDS.index(q))]


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        cli("demo", "data", "--out", str(d / "train.tsv"), "--count", "600", "--seed", "1")
        cli("triggers", "--data", str(d / "train.tsv"), "--task", "synthetic", "--out", str(d / "t.json"),
            "--top-k", str(TOP), "-q")
        cli("attack", "--triggers", str(d / "t.json"), "--top-k", str(TOP), "--out", str(d / "a.json"), "-q")
        trig = json.loads((d / "t.json").read_text())
        att = json.loads((d / "a.json").read_text())
    pairs = same_class = 0
    for t in trig["triggers"]:
        rel = relation(t["tokens"], t["segments"])
        pairs += rel is not None
        same_class += rel == t["class"]
        print(f"#{t['rank']:<3} {' '.join(t['tokens']):<16} -> {t['class']:<14} count {t['count']:<4} "
              f"planted pair: {'yes, decides ' + rel if rel else 'no'}")
    print(f"top {len(trig['triggers'])}: {pairs} planted key-word pairs, {same_class} pushing towards the class "
          f"their pair decides")
    for row in att["table"]:
        w = row["worst_control"]
        print(f"{row['class']:<14} before {100 * row['before']:.1f}  with the other classes' triggers "
              f"{100 * row['trigger_mean']:.1f} (mean of {row['trigger_count']})  controls "
              f"{100 * row['control_mean']:.1f} ± {100 * row['control_sd']:.1f} (mean ± sd of {row['control_count']}; "
              f"the most damaging {' '.join(w['tokens'])} {100 * w['accuracy']:.1f})  p {row['p']:.1e}, "
              f"Holm {row['p_holm']:.1e}: {'beats' if row['beats_controls'] else 'does not beat'} the controls "
              f"at {att['alpha']:g}")
    ps = [t["p"] for t in att["triggers"]]
    pct = ", ".join(f"{t['percentile']:.0f}" for t in att["triggers"])
    print(f"per trigger: exact permutation p among the {att['controls_per_layout']} controls of its layout "
          f"from {min(ps):.3f} to {max(ps):.3f}; percentiles {pct}")


if __name__ == "__main__":
    main()
