"""A GGUF file (llama.cpp's format) written out as a plain transformers model folder (docs/models.md,
"GGUF files"): what ``save_pretrained`` would write, had transformers not refused to save a model
loaded from GGUF, so that the dequantization is paid once instead of on every load: ``config.json``
without the quantization entry, ``model.safetensors`` (a tied weight, the LM head that is the
embedding matrix, once; it is tied again on load), the tokenizer's files and the generation config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..errors import ModelError, OptionError
from .loading import gguf_source, load_gguf, resolve_dtype, weights_hash


def convert(source: str | os.PathLike, out: str | os.PathLike, dtype: str = "float32") -> dict:
    """Write the GGUF file ``source`` (or the folder holding one) to the model folder ``out``
    (a new or empty folder: an existing one with files in it is refused, nothing replaced).
    Returns {"out", "gguf", "model_type", "parameters", "weights_sha256"}; the hash is that of
    the dequantized model, the same for the folder loaded back."""
    from safetensors.torch import save_file

    from ..fileio import swap_dir_in, temp_dir_for, writing

    found = gguf_source(str(source))
    if found is None:
        raise ModelError(f"{source} is not a GGUF file (.gguf), nor a folder holding one")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OptionError(f"--out {out} exists and is {'not empty' if out.is_dir() else 'a file'}: give a new or"
                          " empty folder (nothing there is replaced)")
    folder, name = found
    model, tokenizer = load_gguf(str(source), folder, name, resolve_dtype(dtype))
    tmp = temp_dir_for(out)
    try:
        with writing(out):
            config = model.config.to_dict()
            config.pop("quantization_config", None)
            config["architectures"] = [type(model).__name__]
            config["dtype"] = dtype
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            save_file(_untied(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
            tokenizer.save_pretrained(str(tmp))
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(str(tmp))
        swap_dir_in(tmp, out)
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return {"out": str(out), "gguf": str(folder / name), "model_type": str(model.config.model_type),
            "parameters": int(sum(p.numel() for p in model.parameters())), "weights_sha256": weights_hash(model)}


def _untied(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each tensor once: a weight tied to another (the LM head that is the
    embedding matrix) is left out, as save_pretrained leaves it out; the model ties it again."""
    out, seen = {}, set()
    for key, tensor in model.state_dict().items():
        t = tensor.detach()
        where = (t.device.type, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if t.numel() and where in seen:
            continue
        seen.add(where)
        out[key] = t.to("cpu").contiguous()
    return out
