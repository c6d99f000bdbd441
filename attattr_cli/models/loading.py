"""Loading sequence classifiers (local folders or hub ids) and the facts attattr records."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelError, OptionError, first_line
from ..hub import hub_reachable
from .arch import ArchInfo, arch_info

DTYPES = {name: getattr(torch, name) for name in ("float32", "float64", "bfloat16", "float16")}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    model_id: str  # what the user passed (folder or hub id)
    source: str  # "local" or "hub" or "memory"
    revision: str | None
    weights_sha256: str
    arch: ArchInfo
    lm: bool = False  # loaded as a causal language model (targets are next tokens)

    @property
    def label_names(self) -> list[str]:
        cfg = self.model.config
        return [str(cfg.id2label[i]) for i in range(cfg.num_labels)]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise OptionError(f"unknown device '{device}': use auto, cpu, cuda or cuda:N") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OptionError(f"device '{device}' was asked for but PyTorch sees no CUDA device here")
    return dev


def resolve_dtype(dtype: str) -> torch.dtype:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise OptionError(f"unknown dtype '{dtype}'; available: {', '.join(DTYPES)}") from None


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over the names, dtypes, shapes and bytes of the state dict (any device)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        flat = t.reshape(-1)  # a 0-dim parameter (a learned scalar) has the same bytes as one element
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(flat.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# the parameters attribution rests on: a checkpoint that lacks any of them is refused (a missing
# task head, pooler or LM head is initialised by transformers as usual)
_CORE = ("attention", "attn", "embed", "wte", "wpe", "query", "key", "value", "q_proj", "k_proj", "v_proj",
         "o_proj", "self_attn", "intermediate", "mlp", "ffn", "layernorm", "layer_norm")


def from_pretrained(auto, source: str, model_id: str, allow_new_head: bool = True, **kwargs):
    """``auto.from_pretrained(source, **kwargs)``, the one way attattr loads weights: a weights
    file that cannot be read (random bytes, cut short), a config whose sizes do not match the
    weights, or a checkpoint that lacks parameters of the layers attribution reads (transformers
    5 only reports them and initialises them at random) is one ModelError line. A missing task
    head (with ``allow_new_head``) is allowed: transformers initialises it, as it says."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    try:
        hf_logging.set_verbosity_error()  # its load report (a mismatch) is said here in one line
        try:
            model, info = auto.from_pretrained(source, output_loading_info=True, **kwargs)
        finally:
            hf_logging.set_verbosity(level)
    except RuntimeError as exc:
        if "mismatched_sizes" not in str(exc):
            raise
        raise ModelError(f"cannot load model folder {model_id}: its config.json does not match its weights"
                         " (tensors of other sizes than the config describes)") from exc
    except (OSError, ValueError, KeyError, pickle.UnpicklingError):
        raise
    except Exception as exc:  # safetensors' own error type (SafetensorError) and the like
        if type(exc).__module__.split(".")[0].lstrip("_") in ("safetensors", "torch", "transformers"):
            raise ModelError(f"cannot load model folder {model_id}: its weights file cannot be read"
                             f" ({first_line(exc)})") from exc
        raise
    mismatched = [k[0] if isinstance(k, (tuple, list)) else k for k in info.get("mismatched_keys") or []]
    if kwargs.get("ignore_mismatched_sizes"):  # asked for: a new head of another size (finetune)
        mismatched = [k for k in mismatched if any(c in str(k).lower() for c in _CORE)]
    if mismatched:
        name = mismatched[0]
        raise ModelError(f"cannot load model folder {model_id}: its config.json does not match its weights"
                         f" ({len(mismatched)} tensors of other sizes, e.g. {name})")
    missing = [k for k in info.get("missing_keys") or [] if any(c in k.lower() for c in _CORE)]
    if missing:
        raise ModelError(f"cannot load model folder {model_id}: its weights lack {len(missing)} parameters of the"
                         f" model its config.json describes (e.g. {sorted(missing)[0]}); config and weights do"
                         " not belong together")
    if not allow_new_head and info.get("missing_keys"):
        raise ModelError(f"cannot load model folder {model_id}: its weights lack {sorted(info['missing_keys'])[0]}")
    return model


def check_vocabulary(model: torch.nn.Module, tokenizer, model_id: str) -> None:
    """Refuse a tokenizer that gives ids the model's input embeddings lack (its vocabulary
    is larger than the embedding table): every such token would crash the forward pass."""
    try:
        rows = model.get_input_embeddings().num_embeddings
        size = len(tokenizer)
    except (AttributeError, TypeError, NotImplementedError):
        return
    if size > rows:
        raise ModelError(f"{model_id}: its tokenizer has {size} tokens, but the model's embeddings hold {rows} tokens:"
                         f" the folder's tokenizer is not the model's (ids from {rows} on would crash the model)")


def prepare(model: torch.nn.Module, tokenizer, model_id: str, source: str = "memory",
            revision: str | None = None, lm: bool = False) -> LoadedModel:
    """Freeze and switch a model to eval mode, and gather what attattr records about it. ``lm``: the
    model is a language model (``*ForCausalLM``, or an encoder-decoder's ``*ForConditionalGeneration``)
    whose targets are next tokens rather than classes."""
    check_vocabulary(model, tokenizer, model_id)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(model, tokenizer, model_id, source, revision, weights_hash(model),
                       arch_info(model, tokenizer), lm=lm)


def refuse_pruned(folder: Path) -> None:
    """Refuse, in one line, a folder written by ``attattr prune --save-model``: its layers keep
    different numbers of heads, which attention attribution does not handle, and it loads
    only with its own model code (trust_remote_code), which attattr does not run."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # transformers reports an unreadable config
    if not isinstance(cfg, dict) or cfg.get("attattr_kept_heads") is None:
        return
    kept = cfg["attattr_kept_heads"]
    heads = "/".join(str(len(k)) for k in kept) if isinstance(kept, list) else "?"
    raise ModelError(
        f"--model {folder} is a model pruned by attattr prune --save-model (heads kept per layer: {heads});"
        " attattr scores only unpruned models: score the original model (attattr prune masks heads of it),"
        " and load the pruned one in Python with attattr_cli.analysis.prune.load_pruned")


def _config(model_id: str):
    """The model's config (a local folder, or a hub id in the cache), or None."""
    from transformers import AutoConfig

    try:
        path = Path(model_id).expanduser()
        return AutoConfig.from_pretrained(str(path) if path.exists() else model_id, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None


# the endings of the class names of models whose head predicts tokens, not classes
_LM_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def refuse_lm_as_classifier(model_id: str) -> None:
    """Refuse a language model's folder loaded as a classifier: its classification head would be
    new random weights (transformers initialises a missing head), and every score of it noise."""
    names = [str(a) for a in getattr(_config(model_id), "architectures", None) or []]
    if names and all(a.endswith(_LM_HEADS) for a in names):
        raise OptionError(f"--model {model_id} is a language model ({names[0]}), not a sequence classifier: scored as"
                         " a classifier its classification head would be random weights; pass --lm to attribute"
                         " its next tokens (or fine-tune a classifier from it first: attattr finetune)")


def gguf_source(model_id: str) -> tuple[Path, str] | None:
    """(folder, file name) of a GGUF file given as ``--model``: the file itself, or a folder
    without config.json that holds exactly one; None for anything else."""
    path = Path(model_id).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.parent, path.name
    if path.is_dir() and not (path / "config.json").exists():
        files = sorted(p.name for p in path.glob("*.gguf") if p.is_file())
        if len(files) > 1:
            raise ModelError(f"--model {model_id} holds {len(files)} GGUF files ({', '.join(files[:4])}"
                             f"{', ...' if len(files) > 4 else ''}): give the one to load")
        if files:
            return path, files[0]
    return None


def load_gguf(model_id: str, folder: Path, name: str, dtype: torch.dtype):
    """(model, tokenizer) of a GGUF file (llama.cpp's format): the causal language model with
    its weights dequantized to ``dtype`` (transformers' ``gguf_file=``) and the tokenizer the
    file describes. Costs the full-precision model's memory and a load of the whole file
    (docs/models.md, "GGUF files"); ``attattr convert`` writes it out as a plain folder once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # attattr draws its own progress on stderr
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
        with contextlib.redirect_stderr(io.StringIO()):  # its own progress bar of the dequantization (tqdm)
            model = from_pretrained(AutoModelForCausalLM, str(folder), model_id, gguf_file=name, dtype=dtype,
                                    quantization_config=GgufConfig(dequantize=True))
    except (ModelError, MemoryError):
        raise
    except Exception as exc:  # a file cut short or not GGUF: its reader's own errors (struct.error, ...)
        raise ModelError(f"cannot load the GGUF file {Path(folder) / name}: {first_line(exc)}") from exc
    model.config.__dict__.pop("quantization_config", None)  # dequantized: plain dense weights now
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    return model, tokenizer


def load(model_id: str, device: str = "auto", dtype: str = "float32", lm: bool = False) -> LoadedModel:
    """Load a sequence classifier (or, with ``lm``, a causal language model) and its
    tokenizer from a local folder, a hub id, or a GGUF file (a language model)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    gguf = gguf_source(model_id)
    if gguf is not None:
        if not lm:
            raise OptionError(f"--model {model_id} is a GGUF file, which holds a language model: pass --lm to"
                              " attribute its next tokens")
        model, tokenizer = load_gguf(model_id, gguf[0], gguf[1], resolve_dtype(dtype))
        model.to(resolve_device(device))
        return prepare(model, tokenizer, str((gguf[0] / gguf[1]).resolve()), "local", None, lm=True)
    auto = AutoModelForCausalLM if lm else AutoModelForSequenceClassification
    if not lm:
        refuse_lm_as_classifier(model_id)
    if lm and getattr(_config(model_id), "is_encoder_decoder", False):  # T5, BART: targets on the decoder side
        from transformers import AutoModelForSeq2SeqLM as auto
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # attattr draws its own progress on stderr
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    path = Path(model_id).expanduser()
    local = path.exists()
    if local and not path.is_dir():
        raise ModelError(f"--model {model_id} is a file; give the model's folder (with config.json), or a GGUF"
                         " file (.gguf)")
    if local and not (path / "config.json").exists():
        raise ModelError(f"--model {model_id} has no config.json: not a transformers model folder (nor a folder"
                         " holding a GGUF file)")
    if local:
        refuse_pruned(path)
    if not local and (model_id.startswith((".", "/", "~")) or model_id.count("/") > 1):
        raise ModelError(f"--model {model_id}: no such folder")
    source = str(path) if local else model_id
    try:
        try:
            # a hub id already in the local cache loads without touching the network
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=not local)
            model = from_pretrained(auto, source, model_id, dtype=torch_dtype, local_files_only=not local)
        except OSError:
            if local:
                raise
            if os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_reachable():
                raise ModelError(
                    f"cannot load '{model_id}': it is not in the local cache and the hub is unreachable; "
                    "pass --model with a local model folder"
                ) from None
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = from_pretrained(auto, source, model_id, dtype=torch_dtype)
    except OSError as exc:
        if local:
            raise ModelError(f"cannot load model folder {model_id}: {first_line(exc)}") from exc
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ModelError(
            f"cannot load '{model_id}' from the hub ({'HF_HUB_OFFLINE=1' if offline else 'no network or no such model'}): "
            "pass --model with a local model folder"
        ) from exc
    except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) met more than tensors
        raise ModelError(f"cannot load model folder {model_id}: its weights file is a pickled Python object, not"
                         " tensors, and unpickling can run code: attattr loads weights only; load it yourself and"
                         " re-save it with save_pretrained (safetensors)") from exc
    except RuntimeError as exc:  # transformers' load report: sizes that do not match
        raise ModelError(f"cannot load model folder {model_id}: its config.json does not match its weights"
                         f" ({first_line(exc)})") from exc
    except (ValueError, KeyError) as exc:
        what = "causal language model" if lm else "sequence classifier"
        raise ModelError(f"'{model_id}' is not a {what} attattr can load: {first_line(exc)}") from exc
    model.to(dev)
    revision = getattr(model.config, "_commit_hash", None)
    return prepare(model, tokenizer, str(path.resolve()) if local else model_id,
                   "local" if local else "hub", revision, lm=lm)


def align_labels(task_labels: list[str] | tuple[str, ...] | None, loaded: LoadedModel) -> tuple[list[int], str]:
    """Map task label index -> model output index: by name where the model's id2label names cover
    the task's (case-insensitive), else by position when the counts agree. Returns (mapping, how)
    with how "name" or "index"."""
    model_names = [n.lower() for n in loaded.label_names]
    if task_labels is None:
        return list(range(len(model_names))), "index"
    wanted = [str(n).lower() for n in task_labels]
    if all(n in model_names for n in wanted):
        return [model_names.index(n) for n in wanted], "name"
    if len(wanted) == len(model_names):
        return list(range(len(wanted))), "index"
    raise ModelError(
        f"the model has {len(model_names)} labels ({', '.join(loaded.label_names)}) but the task has "
        f"{len(wanted)} ({', '.join(task_labels)}); pick the matching --task or model"
    )
