"""Truthful, readable labels (attattr_cli/labels.py): tokens decoded with visible spaces and
line breaks for any script, the attributed quantity and foil named with their values, each
generation step with its own token, and pictures of deep models of bounded size."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

import attattr_cli as aa
from attattr_cli.labels import format_number, style_of, text_of, token_labels
from conftest import build_model

TEXTS = ["Столица Франции — это Париж", "שלום עולם", "fin 😀 émoji\nnext\tline", "The capital of France is"]


@pytest.fixture(scope="module")
def byte_bpe():
    """A byte-level BPE tokenizer (GPT-2's pre-tokenizer) trained here on a few lines: few
    merges, so that Cyrillic, Hebrew and emoji characters are split over several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXTS * 3, trainer)
    return tok


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_pieces_become_readable_labels(byte_bpe, text):
    pieces = byte_bpe.encode(text).tokens
    assert style_of(pieces) == "bytes"
    assert text_of(pieces) == text == byte_bpe.decode(byte_bpe.encode(text).ids)
    labels = token_labels(pieces)
    assert len(labels) == len(pieces)
    raw_marks = set("ĠĊĉÐÑ×Ãð")  # byte-level BPE's stand-ins for spaces, breaks and UTF-8 bytes
    assert not raw_marks & set("".join(labels)), labels
    for piece, label in zip(pieces, labels):
        if piece.startswith("Ġ"):
            assert label.startswith("␣")
        if "Ċ" in piece:
            assert "↵" in label
    for lab in labels:  # a character split over tokens is named in each, with its part
        for m in re.finditer(r"(.)\((\d)/(\d)\)", lab):
            assert m.group(1) in text and int(m.group(2)) <= int(m.group(3))


def test_a_split_character_is_named_in_each_part():
    assert token_labels(["Ð", "¡", "ÑĤ", "ĠÐ", "¤"]) == ["С(1/2)", "С(2/2)", "т", "␣Ф(1/2)", "Ф(2/2)"]
    assert text_of(["Ð", "¡", "ÑĤ", "ĠÐ", "¤"]) == "Ст Ф"


def test_other_tokenizers_keep_their_readable_pieces():
    assert token_labels(["[CLS]", "caf", "##é", "[SEP]"]) == ["[CLS]", "caf", "##é", "[SEP]"]
    assert token_labels(["▁the", "<0x0A>", "▁caf", "é"]) == ["␣the", "↵", "␣caf", "é"]
    assert token_labels(["w1", "w2"]) == ["w1", "w2"] and token_labels([""]) == ["∅"]


def _lm_store(tokenizer, tmp_path, **kw):
    lm = build_model("llama", lm=True, layers=2)
    model = aa.load_model((lm, tokenizer), lm=True)
    res = aa.score(model, ["w1 w2 w3 w4"], steps=2, **kw)
    path = tmp_path / "lm.h5"
    res.save(path)
    return res, path


def test_a_foil_is_named_with_the_quantity_and_its_value(tokenizer, tmp_path):
    res, path = _lm_store(tokenizer, tmp_path, target_token="w5", foil="w9", output="logprob")
    e = aa.open_store(path)[0]
    lm = e.meta["lm"]
    want = "log p(w5) − log p(w9) = "
    assert e.foil_label == "w9" and want in e.attributed
    for shown in (repr(e), e._repr_html_(), aa.view(path, 0, fmt="svg").data.decode()):
        assert want in shown and "logprob of the target" not in shown
    assert f"p(w9) {format_number(lm['foil_probs'][0])}" in e.attributed
    from attattr_cli.views.data import header_of

    h = header_of(e)
    assert h["foil"] == "w9" and h["value"] == pytest.approx(e.f_full) and "foil w9" in h["summary"]


def test_each_generation_step_carries_its_own_token_and_probability(tokenizer, tmp_path):
    res, path = _lm_store(tokenizer, tmp_path, generate=3)
    e = aa.open_store(path)[0]
    assert len(e.steps) == 3
    for t, st in enumerate(e.steps):
        token = st.meta["step"]["target_token"]
        assert st.target_label == token and st.meta["lm"]["target_tokens"] == [token]
        assert f"p({token}) = " in st.attributed and f"step {t} of 3" in repr(st)
        tree = aa.tree(st)
        assert f"step {t} of 3" in tree.to_dot() and f"p({token})" in tree.to_dot()
    table = e.to_pandas()
    assert list(table.token) == [st.target_label for st in e.steps] and "piece" in table.columns
    assert "Σ over the 3 steps" in e.attributed


def test_a_many_layer_picture_is_bounded_and_names_what_it_leaves_out(tmp_path):
    from attattr_cli.views import save

    rng = np.random.default_rng(0)
    L, H, n = 30, 2, 6
    e = SimpleNamespace(index=0, tokens=["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis", "Ċ"], layers=list(range(L)),
                        attribution=rng.normal(size=(L, H, n, n)), attention=rng.random((L, H, n, n)),
                        residual=np.zeros(L), gold=-1, pred=0, target=0, probs=np.array([0.7, 0.3]),
                        text_a="The capital of France is\n", text_b=None, meta={}, f_full=0.7)
    v = save(e, tmp_path / "deep.png", ["a", "b"], tree=False)
    assert len(v.layers) == 6 and "left out" in " ".join(v.notes) and v.query_tokens[1] == "␣capital"
    import matplotlib.image as mpimg

    h, w = mpimg.imread(tmp_path / "deep.png").shape[:2]
    assert w <= 3000 and h <= 2500, (w, h)
    every = save(e, tmp_path / "all.png", ["a", "b"], tree=False, layers="all")
    assert len(every.layers) == 30
    from attattr_cli.views import example_html

    page = example_html(e, ["a", "b"], tree=False)  # the still picture: labels, the piece on hover
    assert ">␣capital<title>piece: Ġcapital</title>" in page and ">Ġcapital<" not in page


def test_info_counts_a_generation_once_and_an_empty_store_plainly(tokenizer, tmp_path):
    from attattr_cli.store import StoreWriter
    from conftest import run_cli

    _res, path = _lm_store(tokenizer, tmp_path, generate=3)
    out = run_cli("info", path)
    assert out.exit_code == 0, out.output
    info = aa.open_store(path).info()
    fam, gen = info["families"]["self"], info["generations"]
    assert fam["counted"] == "step-layers" and fam["unconverged"] == gen["step_layers_unconverged"]
    assert sum(fam["convergence"].values()) == 3 * len(fam["layers"])  # every step's every layer
    assert "step-layers" in out.output.split("generations")[0]  # the families row counts step-layers too
    empty = tmp_path / "empty.h5"
    with StoreWriter(empty, {"options": {"lm": True}}, {"lm": True}):
        pass
    out = run_cli("info", empty)
    assert out.exit_code == 0 and "None" not in out.output.split("examples", 1)[1].split("\n")[0]
    assert "0 complete" in out.output
