"""Store round trip, resume, crash safety, refusals, merge."""

from __future__ import annotations

import hashlib
import json

import h5py
import numpy as np
import pytest

from attattr_cli.engine.run import ScoreRequest, score_to_store
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.errors import StoreError
from attattr_cli.store import Store, StoreWriter, merge
from attattr_cli.store.schema import EXAMPLES, PARTIAL_PREFIX, SCHEMA_VERSION


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _req(out, model_dir, data, examples="0:4", **opts):
    return ScoreRequest(out=str(out), model=str(model_dir), data=str(data), task="sst2", examples=examples,
                        options=ScoreOptions(steps=opts.pop("steps", 4), **opts), device="cpu",
                        command=["test"])


def test_round_trip(tmp_path, tiny_model_dir, sst2_small):
    out = tmp_path / "s.h5"
    report = score_to_store(_req(out, tiny_model_dir, sst2_small))
    assert report.scored == 4 and report.created
    with Store(out) as s:
        assert s.indices() == [0, 1, 2, 3]
        e = s.get(2)
        prov = s.provenance
        assert s.root_attrs["schema"] == "attattr.store"
        assert s.schema_version == SCHEMA_VERSION
    n = len(e.tokens)
    assert e.attribution.shape == (3, 4, n, n) and e.attention.shape == (3, 4, n, n)
    assert e.attribution.dtype == np.float32
    assert e.gold == 0 and e.pred in (0, 1) and e.target == e.pred
    assert np.isclose(e.probs.sum(), 1)
    assert e.tokens[0] == "[CLS]" and e.tokens[-1] == "[SEP]"
    assert abs(e.residual).max() < 0.05 * max(abs(e.f_full - e.f_baseline).max(), 1e-3) + 1e-3
    assert prov["label_names"] == ["negative", "positive"]
    assert prov["weights_sha256"] and prov["libraries"]["torch"]
    assert prov["kernel"] == "torch" and prov["options"]["steps"] == 4
    assert prov["command"] == ["test"]
    with h5py.File(out) as f:
        ds = f[EXAMPLES]["00000002"]["attribution"]
        assert [d.label for d in ds.dims] == ["layer", "head", "query", "key"]
        assert ds.compression == "gzip" and ds.chunks == (1, 4, n, n)


def test_float16_storage(tmp_path, tiny_model_dir, sst2_small):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    score_to_store(_req(a, tiny_model_dir, sst2_small, examples="0:2"))
    req = _req(b, tiny_model_dir, sst2_small, examples="0:2")
    req.store_dtype = "float16"
    score_to_store(req)
    with Store(a) as sa, Store(b) as sb:
        x, y = sa.get(1).attribution, sb.get(1).attribution
    assert y.dtype == np.float16
    assert np.allclose(x, y.astype(np.float32), atol=1e-3 * abs(x).max())


@pytest.mark.parametrize("group", [1, 3])
def test_interrupted_run_resumes_without_loss_or_duplicates(tmp_path, tiny_model_dir, sst2_small, group):
    """One example at a time an interruption loses the example being scored; in groups
    (examples sharing passes) the group being scored. Either way the store holds only
    whole examples and the rerun adds exactly the rest."""
    out = tmp_path / "s.h5"
    full = tmp_path / "full.h5"
    score_to_store(_req(full, tiny_model_dir, sst2_small, examples="0:6"))

    def req():
        r = _req(out, tiny_model_dir, sst2_small, examples="0:6")
        r.options.group = group
        return r

    seen = {"examples": set()}

    def interrupt(done, total, label):
        if label.startswith("example"):
            seen["examples"].add(label)
        if len(seen["examples"]) > 3:  # stop while the 4th example is half done
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score_to_store(req(), progress=interrupt)
    with Store(out) as s:
        kept = s.indices()
        before = {i: s.get(i).attribution.copy() for i in kept}
    # one at a time: examples 0..2 done, the 4th lost; groups of 3 (sorted by length): the first group done
    assert kept == [0, 1, 2] if group == 1 else len(kept) == 3
    report = score_to_store(req())
    assert report.skipped == 3 and report.scored == 3
    with Store(out) as s, Store(full) as f:
        assert s.indices() == list(range(6))
        for i in kept:
            assert np.array_equal(s.get(i).attribution, before[i])
        for i in range(6):
            assert np.allclose(s.get(i).attribution, f.get(i).attribution, atol=1e-6)
        assert len(s.provenance["runs"]) == 2


def test_partial_example_never_reads_as_whole(tmp_path, tiny_model_dir, sst2_small):
    out = tmp_path / "s.h5"
    score_to_store(_req(out, tiny_model_dir, sst2_small, examples="0:2"))
    with h5py.File(out, "a") as f:  # what a crash in the middle of writing example 5 leaves
        g = f[EXAMPLES].create_group(PARTIAL_PREFIX + "00000005")
        g.create_dataset("tokens", data=np.array(["[CLS]"], dtype=object), dtype=h5py.string_dtype())
    with Store(out) as s:
        assert s.indices() == [0, 1]
        assert 5 not in s.indices()
    score_to_store(_req(out, tiny_model_dir, sst2_small, examples="0:6"))
    with h5py.File(out) as f:
        assert not any(n.startswith(PARTIAL_PREFIX) for n in f[EXAMPLES])
    with Store(out) as s:
        assert s.indices() == list(range(6))
        assert s.get(5).tokens[0] == "[CLS]" and len(s.get(5).tokens) > 1


def test_other_options_or_model_are_refused_and_store_untouched(tmp_path, tiny_model_dir, other_model_dir, sst2_small):
    out = tmp_path / "s.h5"
    score_to_store(_req(out, tiny_model_dir, sst2_small, examples="0:2"))
    digest = _digest(out)
    with pytest.raises(StoreError, match=r"was made with other options \(steps=4 there, 8 here\)"):
        score_to_store(_req(out, tiny_model_dir, sst2_small, examples="0:4", steps=8))
    with pytest.raises(StoreError, match=r"was made with another model .*use another output store"):
        score_to_store(_req(out, other_model_dir, sst2_small, examples="0:4"))
    other_data = tmp_path / "other.tsv"
    other_data.write_text("sentence\tlabel\nw1 w2\t0\n")
    with pytest.raises(StoreError, match="was made from other data"):
        score_to_store(_req(out, tiny_model_dir, other_data, examples="0:1"))
    assert _digest(out) == digest


def test_corrupt_newer_and_foreign_files_are_refused(tmp_path, tiny_model_dir, sst2_small):
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all" * 10)
    with pytest.raises(StoreError, match="exists and is not an HDF5 store; it was left as it is"):
        score_to_store(_req(junk, tiny_model_dir, sst2_small))
    assert junk.read_bytes() == b"not hdf5 at all" * 10
    with pytest.raises(StoreError, match="is not a readable HDF5 store"):
        Store(junk)

    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2]
    with pytest.raises(StoreError, match="is an HDF5 file but not an attattr store"):
        Store(foreign)

    newer = tmp_path / "newer.h5"
    score_to_store(_req(newer, tiny_model_dir, sst2_small, examples="0:1"))
    with h5py.File(newer, "a") as f:
        f.attrs["schema_version"] = "2.0"
    digest = _digest(newer)
    with pytest.raises(StoreError, match=r"has store schema 2.0, newer than this attattr .* upgrade attattr"):
        Store(newer)
    with pytest.raises(StoreError, match="newer than this attattr"):
        score_to_store(_req(newer, tiny_model_dir, sst2_small, examples="0:2"))
    assert _digest(newer) == digest

    with pytest.raises(StoreError, match="no such store"):
        Store(tmp_path / "missing.h5")
    with pytest.raises(StoreError, match="does not exist"):
        score_to_store(_req(tmp_path / "nodir" / "s.h5", tiny_model_dir, sst2_small))


def test_bad_input_leaves_existing_store_untouched(tmp_path, tiny_model_dir, sst2_small):
    from attattr_cli.errors import DataError

    out = tmp_path / "s.h5"
    score_to_store(_req(out, tiny_model_dir, sst2_small, examples="0:2"))
    digest = _digest(out)
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence\tlabel\nw1 w2\tmaybe\n")
    with pytest.raises(DataError, match="unknown label 'maybe'"):
        score_to_store(_req(out, tiny_model_dir, bad))
    long = tmp_path / "long.tsv"
    long.write_text("sentence\tlabel\n" + " ".join(["w1"] * 80) + "\t0\n")
    with pytest.raises(DataError, match="example 0 has 82 tokens; the model takes at most 48"):
        score_to_store(_req(out, tiny_model_dir, long, examples="0:1"))
    assert _digest(out) == digest
    with pytest.raises(DataError, match="has 82 tokens"):
        score_to_store(_req(tmp_path / "new.h5", tiny_model_dir, long, examples="0:1"))
    assert not (tmp_path / "new.h5").exists()


def test_merge_shards_equals_single_run(tmp_path, tiny_model_dir, sst2_small):
    single, a, b, merged = (tmp_path / n for n in ("single.h5", "a.h5", "b.h5", "m.h5"))
    score_to_store(_req(single, tiny_model_dir, sst2_small, examples="0:6"))
    score_to_store(_req(a, tiny_model_dir, sst2_small, examples="0,2,4"))
    score_to_store(_req(b, tiny_model_dir, sst2_small, examples="1,3,5,4"))
    result = merge([a, b], merged)
    assert (result["added"], result["skipped"]) == (6, 1)
    assert [(d["file"], d["examples"], d["added"]) for d in result["shards"]] == [("a.h5", 3, 3), ("b.h5", 4, 3)]
    with Store(merged) as m, Store(single) as s:
        assert m.indices() == s.indices()
        for i in s.indices():
            assert np.allclose(m.get(i).attribution, s.get(i).attribution, atol=1e-6)
        assert m.fingerprint == s.fingerprint
    other = tmp_path / "other.h5"
    score_to_store(_req(other, tiny_model_dir, sst2_small, examples="0:1", steps=3))
    with pytest.raises(StoreError, match="other options"):
        merge([a, other], tmp_path / "m2.h5")


def test_writer_refuses_unknown_store_dtype(tmp_path):
    with pytest.raises(StoreError, match="unknown store dtype 'int8'"):
        StoreWriter(tmp_path / "x.h5", {}, {}, store_dtype="int8")
    assert not (tmp_path / "x.h5").exists()


def test_summary(tmp_path, tiny_model_dir, sst2_small):
    out = tmp_path / "s.h5"
    score_to_store(_req(out, tiny_model_dir, sst2_small, examples="0:3"))
    with Store(out) as s:
        summary = s.summary()
    assert summary["examples"] == 3 and summary["with_gold"] == 3
    assert 0 <= summary["accuracy"] <= 1
    assert len(summary["mean_abs_residual_per_layer"]) == 3
    json.dumps(summary, default=str)


def test_killed_run_leaves_a_readable_store_and_resumes(tmp_path):
    """SIGKILL in the middle of a run (no chance to clean up), then resume."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "killed.h5"
    script = (
        "import sys\n"
        "from attattr_cli.engine.run import ScoreRequest, score_to_store\n"
        "from attattr_cli.engine.options import ScoreOptions\n"
        "def tick(done, total, label):\n"
        "    print(label, flush=True)\n"
        f"score_to_store(ScoreRequest(out={str(out)!r}, examples='0:60', options=ScoreOptions(steps=8, group=1),"
        " command=['test']), progress=tick)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    seen = set()
    for line in proc.stdout:
        if line.startswith("example"):
            seen.add(line.split()[1])
        if len(seen) >= 5:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with Store(out) as s:
        kept = s.indices()
        assert 3 <= len(kept) < 60
        assert kept == list(range(len(kept)))
        for i in kept:
            e = s.get(i)
            assert e.attribution.shape[0] == 3 and len(e.tokens) == e.attribution.shape[-1]
    report = score_to_store(ScoreRequest(out=str(out), examples="0:60", options=ScoreOptions(steps=8),
                                         command=["test"]))
    assert report.skipped == len(kept) and report.scored == 60 - len(kept)
    with Store(out) as s:
        assert s.indices() == list(range(60))


# -- how two fingerprints differ ---------------------------------------------------------

_FP = {"weights_sha256": "a" * 64, "data": "dev.tsv", "data_sha256": "1" * 64, "options": {"steps": 4, "rule": "right"},
       "store_dtype": "float32"}


def test_fingerprint_difference_names_each_kind():
    from attattr_cli.store import fingerprint_difference

    assert fingerprint_difference(_FP, dict(_FP)) is None
    model = fingerprint_difference(_FP, dict(_FP, weights_sha256="b" * 64, data="x.tsv"))
    assert model.kind == "model"  # the model comes first, whatever else differs
    assert model.explain() == "with another model (weights sha256 aaaaaaaaaaaa… there, bbbbbbbbbbbb… here)"
    assert model.explain("in a.h5", "in b.h5", plural=True).startswith("with other models (weights sha256 aaaa")
    data = fingerprint_difference(_FP, dict(_FP, data="train.tsv", options={"steps": 8}))
    assert (data.kind, data.keys) == ("data", ("data",))
    assert data.explain() == "from other data (dev.tsv there; train.tsv here)"
    contents = fingerprint_difference(_FP, dict(_FP, data_sha256="2" * 64))
    assert (contents.kind, contents.keys) == ("data", ("data_sha256",))
    assert contents.explain() == "from other data (dev.tsv, sha256 111111111111… there; dev.tsv, sha256 222222222222… here)"
    options = fingerprint_difference(_FP, dict(_FP, options={"steps": 8, "rule": "left"}))
    assert (options.kind, options.keys) == ("options", ("rule", "steps"))
    assert options.explain() == "with other options (rule='right' there, 'left' here; steps=4 there, 8 here)"
    added = fingerprint_difference(_FP, dict(_FP, options={"steps": 4, "rule": "right", "top_k": 3}))
    assert added.explain() == "with other options (top_k=None there, 3 here)"
    field = fingerprint_difference(_FP, dict(_FP, store_dtype="float16"))
    assert (field.kind, field.keys) == ("field", ("store_dtype",))
    assert field.explain("on rank 0", "on rank 1") == "with other settings (store_dtype='float32' on rank 0, 'float16' on rank 1)"


def test_writer_and_merge_explain_the_difference(tmp_path):
    from types import SimpleNamespace

    from attattr_cli.store import check_fingerprint

    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    prov = {"num_layers": 1, "num_heads": 1}
    for path, fp in ((a, _FP), (b, dict(_FP, options={"steps": 8, "rule": "right"}))):
        with StoreWriter(path, fp, prov, store_dtype="float32") as w:
            n = 3
            w.write(SimpleNamespace(
                index=0, tokens=["[CLS]", "x", "[SEP]"], input_ids=np.arange(n), segment_ids=np.zeros(n, np.int64),
                logits=np.zeros(2), probs=np.full(2, 0.5), layers=[0], attribution=np.ones((1, 1, n, n)),
                attention=np.ones((1, 1, n, n)), head_max=np.ones((1, 1)), f_baseline=np.zeros(1),
                residual=np.zeros(1), gold=0, pred=0, target=0, f_full=0.5, kernel="torch", truncated=False,
                text_a="x", text_b=None, meta={}))
    with pytest.raises(StoreError) as info:
        check_fingerprint(a, _FP, dict(_FP, options={"steps": 8, "rule": "right"}))
    assert str(info.value) == f"{a} was made with other options (steps=4 there, 8 here): use the same options or another output store"
    with pytest.raises(StoreError) as info:
        StoreWriter(a, dict(_FP, weights_sha256="c" * 64), prov)
    assert str(info.value) == (f"{a} was made with another model (weights sha256 aaaaaaaaaaaa… there, cccccccccccc… here):"
                               " use another output store")
    with pytest.raises(StoreError) as info:
        merge([a, b], tmp_path / "m.h5")
    assert str(info.value) == "cannot merge b.h5 with a.h5: they were made with other options (steps=8 in b.h5, 4 in a.h5)"
    assert not (tmp_path / "m.h5").exists()


@pytest.mark.parametrize("encoder", ["zlib", "installed"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(3, 2, 5, 7), (1, 4, 6, 6), (0, 2, 3, 3), (4, 3, 3)], ids=str)
def test_maps_compressed_on_every_core_are_the_bytes_hdf5_writes(tmp_path, dtype, shape, encoder, monkeypatch):
    """store/compress.py writes each layer's chunk already shuffled and deflated, on a thread
    pool: the same filters declared and the same values back through HDF5's own filters; with
    zlib's deflate the same bytes in every chunk as HDF5's filter pipeline writes; with the
    installed one (ISA-L's) a zlib stream of the same shuffled bytes."""
    import itertools
    import zlib

    from attattr_cli.store import compress

    if encoder == "zlib":
        monkeypatch.setattr(compress, "deflate", lambda data: zlib.compress(data, compress.LEVEL))

    rng = np.random.default_rng(0)
    arr = (rng.standard_normal(shape) * np.where(rng.random(shape) < 0.5, 1e-4, 1.0)).astype(dtype)
    arr.reshape(-1)[: arr.size // 3] = 0  # a run of zeros, as a causal map has: deflate has something to take
    with h5py.File(tmp_path / "a.h5", "w") as f:
        ours = compress.write_maps(f.create_dataset, "ours", arr)
        theirs = f.create_dataset("theirs", data=arr, chunks=(1, *shape[1:]) if arr.size else None,
                                  **(compress.FILTERS if arr.size else {}))
        assert (ours.chunks, ours.compression, ours.compression_opts, ours.shuffle, ours.dtype, ours.shape) == \
            (theirs.chunks, theirs.compression, theirs.compression_opts, theirs.shuffle, theirs.dtype, theirs.shape)
        np.testing.assert_array_equal(ours[()], arr)
        if arr.size:
            offsets = list(itertools.product(*[range(0, s, c) for s, c in zip(shape, ours.chunks)]))
            assert len(offsets) == shape[0]
            for off in offsets:
                (mask, mine), (hdf5_mask, hdf5s) = ours.id.read_direct_chunk(off), theirs.id.read_direct_chunk(off)
                assert mask == hdf5_mask == 0  # every filter applied
                assert mine == hdf5s if encoder == "zlib" else zlib.decompress(mine) == zlib.decompress(hdf5s)


def test_examples_written_behind_are_those_written_in_line_and_a_failure_stops_them(tmp_path, tiny_model_dir,
                                                                                    sst2_small, monkeypatch):
    """StoreWriter(behind=True) writes on its own thread, in order: the store holds what the
    in-line writer writes. A write failing there raises at the next write or at close (the
    block's own error first), the examples before it stay, none after it is written."""
    from attattr_cli.engine.run import prepare_run
    from attattr_cli.store import writer as writer_mod

    prep = prepare_run(_req(tmp_path / "x.h5", tiny_model_dir, sst2_small, examples="0:6"))
    results = [prep.scorer.score(e, prep.encoded[e.index]) for e in prep.picked]
    for behind in (False, True):
        with StoreWriter(tmp_path / f"{behind}.h5", prep.fingerprint, prep.provenance, behind=behind) as w:
            for r in results:
                w.write(r)
            w.write(results[0])  # already handed over: nothing more
    with Store(tmp_path / "False.h5") as a, Store(tmp_path / "True.h5") as b:
        assert a.indices() == b.indices() == [e.index for e in prep.picked]
        for i in a.indices():
            np.testing.assert_array_equal(a.get(i).attribution, b.get(i).attribution)

    real = writer_mod.StoreWriter._write

    def failing(self, examples, final, score):
        if score.index == results[2].index:
            raise OSError("simulated failure of the third example's write")
        return real(self, examples, final, score)

    monkeypatch.setattr(writer_mod.StoreWriter, "_write", failing)
    out = tmp_path / "failing.h5"
    with pytest.raises(StoreError, match="writing example .* failed .*simulated failure"):
        with StoreWriter(out, prep.fingerprint, prep.provenance, behind=True) as w:
            for r in results:
                w.write(r)
    assert w.poisoned and sorted(w.done) == [r.index for r in results[:2]]
    w.f.close()  # (the test's own: the CLI ends the process after a failed write)
    monkeypatch.undo()
    with Store(out) as s:
        assert s.indices() == [r.index for r in results[:2]]
