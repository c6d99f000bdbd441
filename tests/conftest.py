"""Tiny models built from configs (no hub), seeded; shared fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# One intra-op thread: the tests' models are tiny (hidden size 32), so a second thread only
# adds synchronisation, and on a busy 2-core machine it spins; set before torch is imported
# so that the commands the tests start in subprocesses inherit it. An explicit
# OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A pytest-xdist worker (`just test` runs two) is given its controller's terminal size in
# COLUMNS and LINES; rich would fix the commands' width at 80 from them at import, where a
# test run in one process reads the width a test gives (CliRunner's env) at each print.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ["OMP_NUM_THREADS"].isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

sys.path.insert(0, str(Path(__file__).parent))

WORDS = [f"w{i}" for i in range(40)]
REPO = Path(__file__).resolve().parents[1]
# data sets shared between checkouts live next to the repository, in ../shared/data
SHARED = REPO.parent / "shared"


def shared_data(*parts: str) -> Path:
    """The file ``../shared/data/<parts>`` next to the repository; skips the calling test
    with the path in the reason when it is absent (a checkout without the shared data)."""
    path = SHARED.joinpath("data", *parts)
    if not path.is_file():
        pytest.skip(f"{Path('..', 'shared', 'data', *parts)} is absent (the shared GLUE data next to the repository)")
    return path


def run_cli(*args):
    """``attattr ARGS`` in-process through Typer's CliRunner (arguments may be paths or numbers)."""
    from typer.testing import CliRunner

    from attattr_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def cli_commands() -> dict:
    """Every leaf command of the CLI by its name ("demo train" for a subcommand): its click command."""
    import typer

    from attattr_cli.cli import app

    found = {}

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                walk(cmd, prefix + [name])
            else:
                found[" ".join(prefix + [name])] = cmd

    walk(typer.main.get_command(app), [])
    return found


def one_error_line(result, *needles: str) -> str:
    """Assert that a command failed with exactly one line on stderr, ``Error: ...``, holding
    every needle, and no traceback anywhere; return that line.

    ``result`` is a CliRunner result or a ``subprocess.CompletedProcess`` run with ``text=True``.
    """
    code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert code != 0, f"expected a failure, got exit code {code}: {result.stdout}{result.stderr}"
    lines = [line for line in (result.stderr or "").strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    assert lines[0].startswith("Error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert "Traceback" not in (result.stdout or "") + (result.stderr or ""), result.stderr
    return lines[0]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    from transformers import BertTokenizerFast

    d = tmp_path_factory.mktemp("tok")
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return BertTokenizerFast(str(d / "vocab.txt"), model_max_length=48)


def build_model(kind: str, dtype=torch.float32, num_labels: int = 3, layers: int = 3, lm: bool = False):
    """A tiny, randomly initialised sequence classifier of the given family (gpt2 and llama
    with ``lm``: the causal language model instead; bart: an encoder-decoder classifier)."""
    import transformers as tf

    torch.manual_seed(0)
    vocab = 5 + len(WORDS)
    common = dict(num_labels=num_labels)
    if kind == "bert":
        cfg = tf.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                            intermediate_size=37, max_position_embeddings=48, **common)
        model = tf.BertForSequenceClassification(cfg)
    elif kind == "roberta":
        cfg = tf.RobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                               intermediate_size=37, max_position_embeddings=50, pad_token_id=0, bos_token_id=2,
                               eos_token_id=3, **common)
        model = tf.RobertaForSequenceClassification(cfg)
    elif kind == "electra":
        cfg = tf.ElectraConfig(vocab_size=vocab, embedding_size=16, hidden_size=32, num_hidden_layers=layers,
                               num_attention_heads=4, intermediate_size=37, max_position_embeddings=48, **common)
        model = tf.ElectraForSequenceClassification(cfg)
    elif kind == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=layers, n_heads=4, hidden_dim=37,
                                  max_position_embeddings=48, **common)
        model = tf.DistilBertForSequenceClassification(cfg)
    elif kind == "gpt2":
        cfg = tf.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=layers, n_head=4, n_positions=48,
                            bos_token_id=2, eos_token_id=3, **common)
        model = tf.GPT2LMHeadModel(cfg) if lm else tf.GPT2ForSequenceClassification(cfg)
    elif kind == "llama":
        cfg = tf.LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=37, max_position_embeddings=48,
                             bos_token_id=2, eos_token_id=3, **common)
        model = tf.LlamaForCausalLM(cfg) if lm else tf.LlamaForSequenceClassification(cfg)
    elif kind == "bart":
        cfg = tf.BartConfig(vocab_size=vocab, d_model=32, encoder_layers=layers, decoder_layers=layers,
                            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                            decoder_ffn_dim=37, max_position_embeddings=48, pad_token_id=0, bos_token_id=2,
                            eos_token_id=3, decoder_start_token_id=3, forced_eos_token_id=None, **common)
        model = tf.BartForSequenceClassification(cfg)
    else:
        raise ValueError(kind)
    # random init leaves the classifier nearly uniform; spread it so gradients are not tiny
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    return model.to(dtype).eval()


@pytest.fixture
def llama_dir(tmp_path, tokenizer):
    """A tiny causal Llama (float32, 2 layers) saved with the word tokenizer."""
    folder = tmp_path / "tiny-llama"
    build_model("llama", torch.float32, num_labels=2, layers=2, lm=True).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def loaded_factory(tokenizer):
    from attattr_cli.models.loading import prepare

    def make(kind="bert", dtype=torch.float32, **kw):
        return prepare(build_model(kind, dtype, **kw), tokenizer, f"tiny-{kind}")

    return make


def with_sentiment_labels(model):
    """Give a two-class model SST-2's label names (negative, positive); returns it."""
    model.config.id2label = {0: "negative", 1: "positive"}
    model.config.label2id = {"negative": 0, "positive": 1}
    return model


def save_sentiment_model(model, tokenizer, folder):
    """A two-class model with SST-2's label names, saved with ``tokenizer`` into ``folder``."""
    with_sentiment_labels(model).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A saved tiny BERT folder with sst2-style labels, loadable by path."""
    return save_sentiment_model(build_model("bert", num_labels=2), tokenizer, tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory, tokenizer):
    """Same shape as tiny_model_dir, other weights."""
    d = tmp_path_factory.mktemp("tiny_bert_other")
    model = build_model("bert", num_labels=2)
    with torch.no_grad():
        model.classifier.weight.add_(0.5)
    return save_sentiment_model(model, tokenizer, d)


@pytest.fixture
def sst2_small(tmp_path):
    """A small SST-2-style TSV using the tiny vocabulary."""
    p = tmp_path / "small.tsv"
    rows = ["sentence\tlabel"] + [f"{' '.join(WORDS[i:i + 4 + i % 3])}\t{i % 2}" for i in range(8)]
    p.write_text("\n".join(rows) + "\n")
    return p


DIST_STEPS = 4  # integration steps of the torchrun tests (test_distributed*.py)


@pytest.fixture(scope="session")
def single(tmp_path_factory):
    """The built-in default scored in one process, examples 0:40, DIST_STEPS steps: the store
    every torchrun test compares its merged result with (built once per session)."""
    from attattr_cli.engine.run import ScoreRequest, score_to_store
    from attattr_cli.engine.options import ScoreOptions

    out = tmp_path_factory.mktemp("single") / "single.h5"
    score_to_store(ScoreRequest(out=str(out), examples="0:40", options=ScoreOptions(steps=DIST_STEPS), device="cpu",
                                command=["test"]))
    return out


def pytest_collection_modifyitems(config, items):
    """Without a CUDA device, every test marked ``gpu`` is skipped here, with one reason that
    says what they are and where they run (``-rs`` then lists them together)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (the GPU kernel tests: `just gpu-test` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
