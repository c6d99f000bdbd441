"""Long contexts: sources, keep sources (maps reduced layer by layer), the memory estimate and
its refusal, the thread choice, and the source-removal check (docs/long-context.md)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

import attattr_cli as aa
from attattr_cli.data import sources as src
from attattr_cli.engine import budget, threads
from attattr_cli.engine.layer_integral import judged_dims, map_measures, map_spread
from attattr_cli.errors import DataError, OptionError, ResourceError
from attattr_cli.models.loading import prepare
from conftest import build_model, run_cli

TEXT = "w1 w2 w3\n\nw4 w5 w6 w7\n\nw8 w9 w10 w11\n\nw14 w15"  # three passages and a question
ANSWER = "w12 w13"


@pytest.fixture
def lm(tokenizer):
    model = build_model("llama", torch.float64, num_labels=2, layers=2, lm=True)
    return aa.Model(prepare(model, tokenizer, "tiny-llama", lm=True))


@pytest.fixture
def llama_dir(tmp_path, tokenizer):
    model = build_model("llama", torch.float32, num_labels=2, layers=2, lm=True)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    return tmp_path / "m"


# -- spans: passages only -------------------------------------------------------------------
def test_char_spans_paragraphs_sentences_and_passages(tmp_path):
    text = "One two. Three four!\n\n  Five six?\n \nSeven. Who eight?"
    para = [text[a:b] for a, b in src.char_spans(text, "paragraphs")]
    assert para == ["One two. Three four!", "Five six?"]  # the question block after the last blank line is none
    sent = [text[a:b] for a, b in src.char_spans(text, "sentences")]
    assert sent == ["One two.", "Three four!", "Five six?"]
    one = "Ana lives in Rome. Ben lives in Oslo. Ben lives in"  # one paragraph: its last sentence is the question
    assert [one[a:b] for a, b in src.char_spans(one, "sentences")] == ["Ana lives in Rome.", "Ben lives in Oslo."]
    assert src.char_spans(one, "paragraphs") == []
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"body": "Three four!"}) + "\n" + json.dumps({"body": "Seven."}) + "\n")
    given = [text[a:b] for a, b in src.char_spans(text, f"{f}:body")]
    assert given == ["Three four!", "Seven."]
    f.write_text(json.dumps({"text": "not there"}) + "\n")
    with pytest.raises(DataError, match="passage 0"):
        src.char_spans(text, str(f))
    with pytest.raises(DataError, match="no such file"):
        src.check_spec(str(tmp_path / "missing.jsonl"))


def test_token_spans_follow_offsets():
    text = "ab cd\n\nef\n\ngh"
    offsets = [(0, 0), (0, 2), (3, 5), (7, 9), (11, 13), (0, 0)]  # [CLS] ab cd ef gh [SEP]
    spans = src.token_spans(text, offsets, "paragraphs")
    assert [(s["start"], s["end"], s["text"]) for s in spans] == [(1, 3, "ab cd"), (3, 4, "ef")]


class ChatTokenizer:
    """A ChatML template's text, as SmolLM2's: a default system message, role lines, special tokens."""

    chat_template = "chatml"
    all_special_tokens = ["<|im_start|>", "<|im_end|>"]

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        text = "<|im_start|>system\nYou are a helpful assistant.\n\nBe brief.<|im_end|>\n"
        for m in messages:
            text += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


CHAT_CONTENT = "Arden lies on the Elm. Its mayor is Ana.\n\nBelmar lies on the Ash.\n\nQuestion: who is Arden's mayor?"


@pytest.mark.parametrize("spec", ["paragraphs", "sentences", "jsonl"])
def test_template_and_question_are_never_sources(spec, tmp_path):
    """A prompt in a chat template: the passages of the user's message are the sources; the
    template (its system message, role lines, special tokens), the question and the answer's
    start after the template are not, nor folded into the first passage."""
    tok = ChatTokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": CHAT_CONTENT}]) + "The mayor of Arden is"
    if spec == "jsonl":
        spec = str(tmp_path / "p.jsonl")
        (tmp_path / "p.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in
                                                  ["Arden lies on the Elm. Its mayor is Ana.", "Belmar lies on the Ash."]))
    bounds = src.content_bounds(text, src.template_around(tok), src.special_strings(tok))
    assert text[slice(*bounds)] == CHAT_CONTENT
    got = [text[a:b] for a, b in src.char_spans(text, spec, bounds)]
    want = (["Arden lies on the Elm.", "Its mayor is Ana.", "Belmar lies on the Ash."] if spec == "sentences"
            else ["Arden lies on the Elm. Its mayor is Ana.", "Belmar lies on the Ash."])
    assert got == want
    # not rendered by this template (another system message): the longest stretch between the
    # special tokens, less its role line
    other = text.replace("You are a helpful assistant.\n\nBe brief.", "Be kind.")
    bounds = src.content_bounds(other, src.template_around(tok), src.special_strings(tok))
    assert other[slice(*bounds)] == CHAT_CONTENT
    assert src.content_bounds("plain text", None, ["<|im_start|>"]) == (0, 10)


def test_smollm2_prompt_spans_leave_out_template_and_question():
    """SmolLM2's own tokenizer and template (where the model folder is given): the passages'
    tokens only, the first one not holding the template's."""
    import os
    from pathlib import Path

    folder = os.environ.get("ATTATTR_SMOLLM2", "")
    if not Path(folder, "tokenizer.json").exists():
        pytest.skip("no SmolLM2 folder (ATTATTR_SMOLLM2)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template([{"role": "user", "content": CHAT_CONTENT}], tokenize=False,
                                   add_generation_prompt=True) + "The mayor of Arden is"
    spans = src.prompt_spans(tok, text, "paragraphs")
    assert [s["text"] for s in spans] == ["Arden lies on the Elm. Its mayor is Ana.", "Belmar lies on the Ash."]
    ids = tok(text)["input_ids"]
    assert tok.decode(ids[spans[0]["start"]:spans[0]["end"]]).strip() == spans[0]["text"]


def test_no_passages_is_one_clear_error(lm):
    with pytest.raises(DataError, match="no paragraphs found in the prompt: the passages are the paragraphs before"):
        aa.score(lm, prompts=["w1 w2 w3"], continuation=ANSWER, sources="paragraphs", steps=2)


# -- keep sources equals the maps reduced ----------------------------------------------------
def test_source_scores_equal_the_maps_key_columns(lm):
    full = aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="paragraphs", keep="maps", steps=4,
                    dtype="float64")[0]
    kept = aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="paragraphs", steps=4, dtype="float64")[0]
    assert kept.keep == "sources" and kept.attribution is None and kept.head_sum is None
    assert kept.key_sum.shape == (len(kept.layers), len(kept.tokens))
    # per layer: every head's and query's attribution to each key
    reduced = np.asarray(full.attribution, np.float64).sum(axis=(1, 2))
    np.testing.assert_allclose(kept.key_sum, reduced, rtol=1e-5, atol=1e-7 * np.abs(reduced).max())
    table = kept.to_pandas("sources")
    assert list(table.columns) == ["source", "start", "end", "text", "score"]
    assert list(table.text) == ["w1 w2 w3", "w4 w5 w6 w7", "w8 w9 w10 w11"]
    # a source's score: the attribution of the query rows that read the passages (from the end
    # of the last one on: the question and the answer's rows), not of the passages reading each other
    read = int(table.end.max())
    rows = np.asarray(full.attribution, np.float64)[:, :, read:, :].sum(axis=(1, 2))
    assert read < len(kept.tokens) - 2
    np.testing.assert_allclose(kept.read_sum, rows, rtol=1e-5, atol=1e-7 * np.abs(rows).max())
    for row in table.itertuples():
        assert row.score == pytest.approx(rows[:, row.start:row.end].sum(), rel=1e-5, abs=1e-9)
    assert table.score.tolist() != pytest.approx([reduced[:, r.start:r.end].sum() for r in table.itertuples()], rel=1e-3)
    np.testing.assert_allclose(full.to_pandas("sources").score, table.score, rtol=1e-5,
                               atol=1e-6 * np.abs(table.score).max())
    # completeness still holds per layer: the key sums add up to F(A) - F(0)
    np.testing.assert_allclose(kept.key_sum.sum(1), kept.f_full - np.asarray(kept.f_baseline) + kept.residual,
                               rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("sweep", [True, False])
def test_tolerance_is_judged_on_the_key_sums_kept(lm, sweep, monkeypatch):
    """With keep sources the error is judged on the per-key sums kept, not on every entry of
    the per-head maps, and on the example's scale (the largest key sum of any layer): the key
    sums are within the tolerance of a converged reference, measured on that scale."""
    from attattr_cli.engine.layer_integral import Integration

    monkeypatch.setattr(Integration, "sweep", sweep)  # the layers in one Refinement, or one after another
    tol = 0.02
    ref = aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="paragraphs", tol=1e-7, dtype="float64")[0]
    maps = aa.score(lm, prompts=[TEXT], continuation=ANSWER, keep="maps", tol=tol, dtype="float64")[0]
    kept = aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="paragraphs", tol=tol, dtype="float64")[0]
    assert kept.keep == "sources" and (np.asarray(kept.convergence) == 0).all()
    err = np.abs(kept.key_sum - ref.key_sum).max(1)
    assert (err <= 2 * tol * np.abs(ref.key_sum).max()).all()
    # what is judged: the map [head, query, key] summed to what each --keep keeps
    gen = torch.Generator().manual_seed(0)
    a, v, g = (torch.rand(3, 5, 5, generator=gen, dtype=torch.float64), torch.randn(3, 5, 4, generator=gen, dtype=torch.float64),
               torch.randn(2, 3, 5, 4, generator=gen, dtype=torch.float64))
    attr = a * (g @ v.transpose(-1, -2))
    for keep, kept in (("maps", attr.flatten(1)), ("sum", attr.sum(1).flatten(1)), ("sources", attr.sum((1, 2)))):
        got = map_measures(a, v, g, judged_dims(keep))
        want = torch.stack([kept.abs().amax(1), kept.abs().sum(1), kept.sum(1)], 1)
        torch.testing.assert_close(got, want)
        assert float(map_spread(a, v, g, judged_dims(keep))) == pytest.approx(float(kept.abs().sum(0).max()))
    # the maps' own entries, judged per entry, are as close
    full = np.asarray(maps.attribution, np.float64).sum(axis=(1, 2))
    assert (np.abs(full - ref.key_sum).max(1) <= 2 * tol * np.abs(ref.key_sum).max(1)).all()


def test_map_measures_of_many_g_go_a_chunk_of_maps_at_a_time(monkeypatch):
    """Many G measured at once (every new leaf of every step) are made a chunk of maps at a
    time: the same numbers, with A and V shared ([head, ...] or [1, head, ...]) or one per G,
    whatever the chunk."""
    from attattr_cli.engine import layer_integral

    gen = torch.Generator().manual_seed(1)
    a, v = torch.rand(3, 6, 6, generator=gen, dtype=torch.float64), torch.randn(3, 6, 4, generator=gen, dtype=torch.float64)
    g = torch.randn(7, 3, 6, 4, generator=gen, dtype=torch.float64)
    own_a, own_v = torch.rand(7, 3, 6, 6, generator=gen, dtype=torch.float64), torch.randn(7, 3, 6, 4, generator=gen,
                                                                                         dtype=torch.float64)
    for keep in ("maps", "sources"):
        dims = judged_dims(keep)
        whole = [map_measures(a, v, g, dims), map_measures(own_a, own_v, g, dims)]
        made = []
        original = layer_integral._kept
        monkeypatch.setattr(layer_integral, "_kept", lambda attr, d: made.append(attr.shape[0]) or original(attr, d))
        for entries in (1, 3 * 36 * 2, 3 * 36 * 5):  # one map, two, five at a time
            monkeypatch.setattr(layer_integral, "SPREAD_CHUNK", entries)
            made.clear()
            torch.testing.assert_close(map_measures(a, v, g, dims), whole[0], rtol=0, atol=0)
            torch.testing.assert_close(map_measures(a[None], v[None], g, dims), whole[0], rtol=0, atol=0)  # [1, ...]
            torch.testing.assert_close(map_measures(own_a, own_v, g, dims), whole[1], rtol=0, atol=0)
            assert max(made) == max(1, entries // (3 * 36)) and sum(made) == 3 * len(g)
        monkeypatch.setattr(layer_integral, "_kept", original)


def test_generation_sources_per_step(lm):
    maps = aa.score(lm, prompts=[TEXT], generate=3, sources="paragraphs", keep="maps", steps=3, dtype="float64")[0]
    kept = aa.score(lm, prompts=[TEXT], generate=3, sources="paragraphs", steps=3, dtype="float64")[0]
    table = kept.to_pandas("sources")
    assert list(table.columns) == ["source", "start", "end", "text", "score", "step_0", "step_1", "step_2"]
    np.testing.assert_allclose(table.score, table[["step_0", "step_1", "step_2"]].sum(axis=1), rtol=1e-5, atol=1e-12)
    for t, st in enumerate(kept.steps):
        ref = np.asarray(maps.steps[t].attribution, np.float64).sum(axis=(1, 2))
        np.testing.assert_allclose(st.key_sum, ref, rtol=1e-5, atol=1e-7 * np.abs(ref).max())
        read = int(table.end.max())  # the rows that read the passages: the question's and the step's rows
        rows = np.asarray(maps.steps[t].attribution, np.float64)[:, :, read:, :].sum(axis=(1, 2))
        np.testing.assert_allclose(st.read_sum, rows, rtol=1e-5, atol=1e-7 * np.abs(rows).max())
        for row in table.itertuples():
            assert getattr(row, f"step_{t}") == pytest.approx(rows[:, row.start:row.end].sum(), rel=1e-5, abs=1e-9)


def test_generation_sources_judges_each_step_on_its_kept_table(lm, monkeypatch):
    """keep sources, per step: the layers run from the top down and each step's integral is
    judged against that step's largest key sum of the layers above (its own kept table)."""
    from attattr_cli.engine import generation

    seen = []
    original = generation.StepScorer.integrate

    def spy(self, site, clean, grad_at_one, f_full, floors=None):
        seen.append((site[1], list(floors)))
        return original(self, site, clean, grad_at_one, f_full, floors)

    monkeypatch.setattr(generation.StepScorer, "integrate", spy)
    monkeypatch.setattr(generation.sweep, "usable", lambda *a, **k: False)  # the per-layer path (long inputs)
    res = aa.score(lm, prompts=[TEXT], generate=2, sources="paragraphs", keep="sources", dtype="float64",
                   tol=0.1)[0]
    assert [layer for layer, _ in seen] == [1, 0]
    assert seen[0][1] == [0.0, 0.0]
    assert seen[1][1] == pytest.approx([float(np.abs(st.key_sum[1]).max()) for st in res.steps])


def test_store_keeps_key_sums_and_sources(lm, tmp_path):
    out = tmp_path / "s.h5"
    aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="sentences", steps=3, out=out)
    import h5py

    with h5py.File(out, "r") as f:
        assert f.attrs["schema_version"] == "1.6"
    store = aa.open_store(out)
    e = store[0]
    assert e.keep == "sources" and e.key_sum is not None and e.read_sum is not None and e.attribution is None
    assert e.meta["sources"]["how"] == "sentences"
    assert len(e.to_pandas("sources")) == 3
    assert store.to_pandas("sources").example.tolist() == [0, 0, 0]


def test_sources_default_to_the_fast_rule_and_tol_to_the_tolerance(lm, llama_dir, tmp_path):
    """--sources given none of --steps, --rule, --tol integrates with the fixed fast rule
    (resolved in one place, engine/options.integration); --tol keeps the error-controlled run;
    the store records which ran."""
    from attattr_cli.engine.options import DEFAULT_TOL, SOURCES_RULE, SOURCES_STEPS, integration

    fast = {"steps": SOURCES_STEPS, "rule": SOURCES_RULE, "tol": None}
    assert (SOURCES_STEPS, SOURCES_RULE) == (2, "right")
    assert integration(None, None, None, "paragraphs") == fast
    assert integration(None, None, None) == {"steps": None, "rule": "clenshaw-curtis", "tol": DEFAULT_TOL}
    assert integration(None, None, 0.1, "paragraphs") == {"steps": None, "rule": "clenshaw-curtis", "tol": 0.1}
    assert integration(3, None, None, "paragraphs") == {"steps": 3, "rule": "right", "tol": None}
    assert integration(None, "gauss", None, "paragraphs") == {"steps": 20, "rule": "gauss", "tol": None}
    res = aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="paragraphs", dtype="float64")[0]
    same = aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="paragraphs", dtype="float64", steps=2)[0]
    np.testing.assert_allclose(res.to_pandas("sources").score, same.to_pandas("sources").score)
    prompt = tmp_path / "p.txt"
    prompt.write_text(TEXT)
    for extra, want in (((), (SOURCES_STEPS, SOURCES_RULE, None)), (("--tol", "0.1"), (None, "clenshaw-curtis", 0.1))):
        out = tmp_path / f"s{len(extra)}.h5"
        r = run_cli("score", "--lm", "--model", llama_dir, "--prompt-file", prompt, "--continuation", ANSWER,
                    "--sources", "paragraphs", *extra, "--out", out, "-q")
        assert r.exit_code == 0, r.output
        store = aa.open_store(out)
        for opts in (store.provenance["options"], store.fingerprint["options"]):
            assert (opts.get("steps"), opts["rule"], opts.get("tol")) == want


def test_sources_need_a_language_model_and_spans(lm):
    with pytest.raises(OptionError, match="language model"):
        aa.score(prompts=None, inputs=["w1 w2"], sources="paragraphs", steps=2)
    plain = aa.score(lm, prompts=[TEXT], continuation=ANSWER, steps=2)[0]
    with pytest.raises(OptionError, match="no sources"):
        plain.to_pandas("sources")


# -- memory: the estimate and the refusal ----------------------------------------------------
def test_memory_refusal_names_the_keep_that_fits(lm):
    from attattr_cli.data.types import Example
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer

    scorer = Scorer(lm.loaded, ScoreOptions(steps=2, lm=True, continuation=ANSWER, keep="maps", dtype="float64"))
    enc = scorer.encode(Example(0, TEXT))
    peaks = {k: budget.estimate(scorer, enc, 0, k).peak for k in ("maps", "sum", "sources")}
    assert peaks["maps"] > peaks["sum"] > peaks["sources"]
    stores = {k: budget.estimate(scorer, enc, 0, k).store for k in ("maps", "sum", "sources")}
    assert stores["maps"] > stores["sum"] > stores["sources"]
    between = (peaks["maps"] + peaks["sum"]) // 2
    with pytest.raises(ResourceError, match=r"keep maps\) needs about .* over memory .*: keep sum fits"):
        aa.score(lm, prompts=[TEXT], continuation=ANSWER, keep="maps", steps=2, dtype="float64", memory=between)
    with pytest.raises(ResourceError, match="no keep fits"):
        aa.score(lm, prompts=[TEXT], continuation=ANSWER, steps=2, memory="1kB")
    heard = []
    res = aa.score(lm, prompts=[TEXT], continuation=ANSWER, keep="maps", steps=2, dtype="float64",
                   memory=peaks["maps"] + 1, notify=heard.append)
    assert len(res) == 1 and heard == []  # a short input: nothing to say
    with pytest.raises(OptionError, match="memory"):
        aa.score(lm, prompts=[TEXT], continuation=ANSWER, memory="lots")


def test_estimate_counts_the_refinements_arrays_at_the_node_cap(lm):
    """--tol holds every node's dF/dO of the layer being refined (and a leaf's arrays), for
    each step refined in lock-step: counted at the node cap, a bound; a fixed rule holds none."""
    from attattr_cli.data.types import Example
    from attattr_cli.engine.generation import StepwiseScorer
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer

    cfg = lm.loaded.model.config
    per_token = cfg.num_attention_heads * cfg.head_dim  # one dF/dO: [H, n, head dim]

    def held(cap):  # float64: every node's dF/dO, and a leaf's (one per four nodes) two float64 arrays and a copy
        return (cap * 8 + cap // 4 * (16 + 8)) * per_token

    def peak(steps=None, **kw):
        opts = ScoreOptions(lm=True, continuation=ANSWER, keep="sources", dtype="float64", steps=steps, **kw)
        scorer = (StepwiseScorer if kw.get("per_step") else Scorer)(lm.loaded, opts)
        enc = scorer.encode(Example(0, TEXT))
        return budget.estimate(scorer, enc, 0).peak, len(enc.input_ids), len(enc.lm_positions)

    fixed, n, _ = peak(steps=2)
    for cap in (9, 33):
        tol, _, _ = peak(tol=0.1, max_nodes=cap)
        assert tol - fixed == held(cap) * n
        stepwise, _, s = peak(tol=0.1, max_nodes=cap, per_step=True)
        stepwise_fixed, _, _ = peak(steps=2, per_step=True)
        assert s > 1 and stepwise - stepwise_fixed == s * held(cap) * n


def test_cli_refuses_in_one_line(llama_dir, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text(TEXT)
    out = tmp_path / "s.h5"
    r = run_cli("score", "--lm", "--model", str(llama_dir), "--prompt-file", str(prompt), "--continuation", ANSWER,
                "--sources", "paragraphs", "--steps", "2", "--memory", "1kB", "--out", str(out))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 5 and len(lines) == 1 and lines[0].startswith("Error: ") and "--memory" in lines[0]
    assert not out.exists()
    r = run_cli("score", "--lm", "--model", str(llama_dir), "--prompt-file", str(prompt), "--continuation", ANSWER,
                "--sources", "paragraphs", "--steps", "2", "--threads", "1", "--out", str(out), "-q")
    assert r.exit_code == 0, r.output
    assert len(aa.open_store(out)[0].to_pandas("sources")) == 3


def test_parse_size():
    assert budget.parse_size("4GB") == 4_000_000_000 and budget.parse_size("2GiB") == 2 << 30
    assert budget.parse_size(1234) == 1234 and budget.parse_size(None) is None
    for bad in ("0", "-1GB", "four", True):
        with pytest.raises(OptionError):
            budget.parse_size(bad)


# -- threads ---------------------------------------------------------------------------------
def test_thread_choice():
    assert threads.choose(5) == 1
    assert threads.choose(5, requested=3) == 3
    assert 1 <= threads.choose(4096) <= threads.usable_cores()
    before = torch.get_num_threads()
    with threads.using(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_free_cores_read_the_idle_time_now_not_the_load_average(monkeypatch):
    """Free cores come from the machine's idle time over a short sample: one other busy core
    out of two leaves one; none leaves two even when the last minute's load average still
    counts a run that just ended (which made the default one thread, 1.86x slower)."""
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.9, 1.5, 1.0))
    monkeypatch.setattr(threads, "SAMPLE_S", 0.0)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)

    def ticks(idle_per_sample):  # (idle, total) readings: 2 CPUs, 100 ticks each per sample
        readings = itertools.cycle([(0, 0), (idle_per_sample, 200)])
        return lambda path="/proc/stat": next(readings)

    monkeypatch.setattr(threads, "_cpu_times", ticks(200))  # both idle
    assert threads.free_cores() == 2 and threads.choose(1063) == 2
    monkeypatch.setattr(threads, "_cpu_times", ticks(100))  # one busy
    assert threads.free_cores() == 1 and threads.choose(1063) == 1
    monkeypatch.setattr(threads, "_cpu_times", ticks(0))  # both busy: still one
    assert threads.free_cores() == 1
    assert threads.choose(300) == 1  # one per 256 tokens, whatever is free
    assert threads.choose(1063, width=576) == 1  # still both busy
    monkeypatch.setattr(threads, "_cpu_times", ticks(200))
    assert threads.choose(1063, width=576) == 2 and threads.choose(1063) == 2
    assert threads.choose(1063, width=64) == 1  # a narrow model's pass: 1063 x 64 / 576 = 118 tokens' worth
    assert threads.choose(16 * 40, width=64) == 1  # 16 short examples of the built-in default grouped

    def unreadable(path="/proc/stat"):
        raise OSError("no /proc/stat")

    monkeypatch.setattr(threads, "_cpu_times", unreadable)  # the fallback: cores - load average
    assert threads.idle_cpus() is None and threads.free_cores() == 1
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert threads.free_cores() == 2


def test_cpu_times_parse_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 20 0 3 2 7 0\ncpu0 50 2 25 400 10 0 1 1 3 0\n")
    assert threads._cpu_times(str(stat)) == (820, 980)  # idle + iowait; user..steal (guest is in user)


# -- is it right? source removal ---------------------------------------------------------------
def test_source_removal_check(lm):
    from attattr_cli.analysis.context_check import _answer_logprob, _without

    check = aa.source_removal(lm, TEXT, ANSWER, sources="paragraphs", ks=[1, 3], steps=4)
    assert set(check.scores) == {"attattr", "attention", "input_x_gradient", "loo"}
    assert all(len(v) == 3 for v in check.scores.values())
    model = lm.loaded.model
    ids = list(lm.loaded.tokenizer(TEXT)["input_ids"])
    answer = list(lm.loaded.tokenizer(ANSWER, add_special_tokens=False)["input_ids"])
    assert check.f_full == pytest.approx(_answer_logprob(model, ids, answer))
    # leave-one-out is exact: F minus F without the source
    for s, v in enumerate(check.scores["loo"]):
        assert v == pytest.approx(check.f_full - _answer_logprob(model, _without(ids, check.sources, {s}), answer))
    # k = 3 removes every source: the same drop for every method; LOO's top 1 is the best single removal
    assert len({round(d[3], 12) for d in check.drops.values()}) == 1
    assert all(check.drops["loo"][1] >= d[1] - 1e-12 for d in check.drops.values())
    assert check.agreement["loo"] == pytest.approx(1.0)
    # the attattr scores are those of score(..., keep="sources")
    kept = aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="paragraphs", output="logprob", steps=4)[0]
    np.testing.assert_allclose(check.scores["attattr"], kept.to_pandas("sources").score, rtol=1e-6)
    rows = check.rows()
    assert {r["method"] for r in rows} == set(check.scores) and all(r["k"] in (1, 3) for r in rows)
    with pytest.raises(OptionError, match="unknown source-removal method"):
        aa.source_removal(lm, TEXT, ANSWER, methods=["nope"])


# -- attattr sources-check -------------------------------------------------------------------
def test_sources_check_cli_table_and_json(llama_dir, tmp_path):
    from conftest import one_error_line

    prompt = tmp_path / "p.txt"
    prompt.write_text(TEXT)
    base = ("sources-check", "--model", str(llama_dir), "--prompt-file", str(prompt), "--continuation", ANSWER,
            "--steps", "2", "--threads", "1")
    r = run_cli(*base, "--json", "--ks", "1,2")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert [s["text"] for s in got["sources"]] == ["w1 w2 w3", "w4 w5 w6 w7", "w8 w9 w10 w11"]
    assert set(got["sources"][0]["scores"]) == {"attattr", "attention", "input_x_gradient", "loo"}
    assert {(row["method"], row["k"]) for row in got["rows"]} == {(m, k) for m in got["tau_loo"] for k in (1, 2)}
    assert got["tau_loo"]["loo"] == pytest.approx(1.0)
    plot = tmp_path / "drops.svg"
    r = run_cli(*base, "--methods", "attattr,loo", "--plot", str(plot), "-q")
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ["method", "drop", "top-1", "drop"] and [ln.split()[0] for ln in lines[1:]] == ["attattr", "loo"]
    assert plot.read_text().lstrip().startswith("<?xml")
    for bad, needle in ((("--ks", "0"), "ks"), (("--methods", "nope"), "unknown source-removal method"),
                        (("--threads", "0"), "threads")):
        one_error_line(run_cli(*base, *bad), needle)
    one_error_line(run_cli("sources-check", "--model", str(llama_dir), "--continuation", ANSWER), "--prompt")


# -- results show themselves -----------------------------------------------------------------
def test_kept_sources_show_their_table_and_bars(lm, tmp_path):
    res = aa.score(lm, prompts=[TEXT], continuation=ANSWER, sources="paragraphs", steps=2, dtype="float64")[0]
    assert res.keep == "sources" and res.attribution is None
    page = res._repr_html_()
    for text in ("w1 w2 w3", "w4 w5 w6 w7", "w8 w9 w10 w11", "rank", "outside the passages", "data:image/png;base64"):
        assert text in page
    assert "w14 w15" not in page.split("outside the passages")[0]  # the question is no passage
    from attattr_cli.views.sources import source_table

    rows = source_table(res)
    assert sorted(r["rank"] for r in rows) == [1, 2, 3]
    best = max(rows, key=lambda r: r["score"])
    assert best["rank"] == 1
    fig = res.plot_sources()
    assert len(fig.axes[0].patches) == 3
    for suffix in (".png", ".svg"):
        out = tmp_path / f"bars{suffix}"
        res.plot(out)  # keep sources: plot() draws the passages
        assert out.stat().st_size > 0
    with pytest.raises(OptionError, match="no sources"):
        aa.score(lm, prompts=[TEXT], continuation=ANSWER, steps=2)[0].plot_sources()


def test_source_removal_shows_itself(lm, tmp_path):
    check = aa.source_removal(lm, TEXT, ANSWER, sources="paragraphs", ks=[1, 2], steps=2)
    page = check._repr_html_()
    assert "leave-one-out" in page and "w4 w5 w6 w7" in page and "data:image/png;base64" in page
    assert "RemovalCheck(3 sources" in repr(check)
    check.plot(tmp_path / "drops.png")
    assert (tmp_path / "drops.png").read_bytes()[:4] == b"\x89PNG"
    assert list(check.to_pandas().columns) == ["method", "k", "drop", "of_loo", "tau_loo"]


# -- every command that runs a model takes --threads -----------------------------------------
MODEL_COMMANDS = {"score", "finetune", "importance", "prune", "triggers", "attack", "faithfulness", "circuit",
                  "sources-check", "demo train"}


def test_every_command_that_runs_a_model_takes_threads():
    from conftest import cli_commands

    from attattr_cli.cli.options import THREADS_HELP

    found = {name: p.help for name, cmd in cli_commands().items() for p in cmd.params
             if "--threads" in getattr(p, "opts", [])}
    assert set(found) == MODEL_COMMANDS
    # one definition (cli/options.py), worded for training where the default differs
    assert {c for c, h in found.items() if h == THREADS_HELP} >= MODEL_COMMANDS - {"finetune", "demo train", "circuit"}


def test_a_run_given_threads_holds_them_for_every_scoring_inside():
    seen = []

    @threads.on_threads
    def run(*, threads=None):
        seen.append((torch.get_num_threads(), globals()["threads"].choose(100_000)))

    before = torch.get_num_threads()
    run(threads=1)
    assert seen[-1] == (1, 1) and torch.get_num_threads() == before
    run()
    assert seen[-1][0] == before and threads.choose(5) == 1


def test_importance_cli_takes_threads(tmp_path, monkeypatch):
    from conftest import one_error_line

    counts = []
    original = threads.using

    def spy(count):
        counts.append(count)
        return original(count)

    monkeypatch.setattr(threads, "using", spy)
    out = tmp_path / "imp.h5"
    r = run_cli("importance", "--examples", "0:4", "--methods", "taylor", "--threads", "1", "--out", str(out), "-q")
    assert r.exit_code == 0, r.output
    assert counts and set(counts) == {1}
    one_error_line(run_cli("importance", "--examples", "0:4", "--methods", "taylor", "--threads", "0",
                           "--out", str(out), "-q"), "threads")
    with pytest.raises(OptionError, match="threads"):
        aa.attack(threads=0)


def test_the_key_sums_path_of_the_kernel_gives_the_sources_of_the_head_sum_path(lm):
    """On the CUDA kernel, keep sources reads the per-key sums from the kernel's epilogue
    (engine/assembly.py) instead of summing an n x n head sum; the path is run here with the
    reference's key sums (a CPU stand-in for the kernel) and agrees with the head-sum path:
    key sums, read sums, residuals and the convergence states."""
    from attattr_cli.data.types import Example
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer

    opts = ScoreOptions(lm=True, continuation=ANSWER, keep="sources", sources="paragraphs", dtype="float64", steps=4)
    plain = Scorer(lm.loaded, opts).score(Example(0, TEXT))
    scorer = Scorer(lm.loaded, opts)
    calls = []
    key_sums = scorer.backend.attribution_key_sums
    scorer.backend.name = "cuda"  # the kernel's branch, on the reference backend's attribution_key_sums
    scorer.backend.attribution_key_sums = lambda *a, **k: calls.append(1) or key_sums(*a, **k)
    try:
        epilogue = scorer.score(Example(0, TEXT))
    finally:
        scorer.backend.name = type(scorer.backend).name
        del scorer.backend.attribution_key_sums
    assert len(calls) == lm.loaded.arch.num_layers  # one epilogue per layer, no head sum
    a, b = (next(iter(r.families.values())) for r in (plain, epilogue))
    assert a.read_sum is not None and a.key_sum.shape == b.key_sum.shape
    np.testing.assert_allclose(b.key_sum, a.key_sum, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(b.read_sum, a.read_sum, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(epilogue.residual, plain.residual, atol=1e-9)
    assert list(a.status) == list(b.status)
