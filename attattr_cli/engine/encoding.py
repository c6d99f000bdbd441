"""Encoding an example into the ids, tokens and segment ids the model sees.

:func:`encode` is the one place attattr tokenises an example (a sentence or a pair, with
the model's special tokens): the scorer, head masking, the attack, faithfulness and
fine-tuning all call it, so they agree on ids, segments and truncation.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..data.types import Example
from ..errors import DataError


@dataclass
class Encoded:
    input_ids: list[int]
    tokens: list[str]
    segment_ids: list[int]  # 0, 1 for the segments, -1 for special tokens
    token_type_ids: list[int] | None  # only where the model takes them
    truncated: bool = False
    lm_positions: list[int] | None = None  # LM: positions whose next token is the target
    lm_targets: list[int] | None = None  # LM: target token ids (None: the predicted one)
    lm_foils: list[int] | None = None  # LM pair (options.metric): the foil token ids; lm_targets the answer's
    decoder_input_ids: list[int] | None = None  # encoder-decoder: the decoder's input
    decoder_tokens: list[str] | None = None
    sources: list[dict] | None = None  # LM --sources: the prompt's sources as token spans (data/sources.py)

    def model_inputs(self) -> dict[str, list[int]]:
        """``{input name: list}`` for one row of a padded batch (see ``batching.pad_rows``):
        input_ids, attention_mask and, where the model takes them, token_type_ids."""
        row = {"input_ids": list(self.input_ids), "attention_mask": [1] * len(self.input_ids)}
        if self.token_type_ids is not None:
            row["token_type_ids"] = list(self.token_type_ids)
        return row


def unknown_words(tokenizer, encoded: dict, model: str) -> str | None:
    """One line when most of some examples' tokens (their segments' tokens, special tokens
    aside) are the tokenizer's unknown token: the model does not know their words, and what is
    scored says little about them. None when no example is so."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return None
    mostly = []
    for index, enc in encoded.items():
        ids = [i for i, seg in zip(enc.input_ids, enc.segment_ids) if seg >= 0] or list(enc.input_ids)
        if ids and 2 * sum(int(i) == unk for i in ids) > len(ids):
            mostly.append(index)
    if not mostly:
        return None
    shown = ", ".join(map(str, mostly[:5])) + (" …" if len(mostly) > 5 else "")
    return (f"{len(mostly)} of {len(encoded)} examples ({shown}) are mostly the unknown token "
            f"{tokenizer.unk_token} of {model}'s tokenizer ({type(tokenizer).__name__}): it does not know their words")


def too_long(index: int, n: int, limit: int, hint: bool = True) -> DataError:
    """The error for an example longer than the model takes."""
    return DataError(f"example {index} has {n} tokens; the model takes at most {limit}"
                     + (" (pass --truncate to cut long inputs)" if hint else ""))


def empty_text(index: int, field: str, text: str) -> DataError:
    """The error for a text that the tokenizer turns into no tokens at all."""
    return DataError(f"example {index}: its {field} {text!r} gives no tokens for this model's tokenizer"
                     " (whitespace only, or characters it drops): there is nothing to attribute")


def encode(tokenizer, example: Example, max_length: int | None = None, truncate: bool = False,
           decoder_start: int | None = None, tokens: bool = True, token_types: int | None = None) -> Encoded:
    """``example`` (``text_a`` and, for a pair, ``text_b``) as the model sees it, with special tokens.

    Longer than ``max_length`` (None: no limit): cut to it with ``truncate`` (the longer
    segment first; ``truncated`` is then set), else a DataError naming the example.
    ``decoder_start``: the decoder start token of an encoder-decoder model; the decoder's
    input is then that token followed by the input shifted right. ``tokens=False`` skips
    converting ids to token strings (``tokens`` is then empty). ``token_types``: the model's
    number of token types; with one, a pair's second segment goes in as type 0 (its tokenizer
    may say 1, which such an embedding has no row for).
    """
    args = (example.text_a,) if example.text_b is None else (example.text_a, example.text_b)
    enc = tokenizer(*args, add_special_tokens=True, verbose=False)  # too long: our own one line says so
    truncated = False
    if max_length is not None and len(enc["input_ids"]) > max_length:
        if not truncate:
            raise too_long(example.index, len(enc["input_ids"]), max_length)
        enc = tokenizer(*args, add_special_tokens=True, truncation=True, max_length=max_length)
        truncated = True
    ids = list(enc["input_ids"])
    try:
        segments = [-1 if s is None else int(s) for s in enc.sequence_ids()]
        present = set(segments)
    except (ValueError, AttributeError):  # slow tokenizers: no sequence ids
        segments = list(enc.get("token_type_ids", [0] * len(ids)))
        present = {k for k, text in enumerate(args) if tokenizer(text, add_special_tokens=False)["input_ids"]}
    for k, text in enumerate(args):
        if k not in present:  # whitespace only (or characters the tokenizer drops): nothing to attribute
            raise empty_text(example.index, ("text_a", "text_b")[k], text)
    types = (list(enc["token_type_ids"])
             if "token_type_ids" in enc and "token_type_ids" in tokenizer.model_input_names else None)
    if types is not None and token_types is not None and token_types >= 1:
        types = [t if t < token_types else 0 for t in types]
    out = Encoded(ids, tokenizer.convert_ids_to_tokens(ids) if tokens else [], segments, types, truncated)
    if decoder_start is not None:
        out.decoder_input_ids = [int(decoder_start)] + ids[:-1]
        out.decoder_tokens = tokenizer.convert_ids_to_tokens(out.decoder_input_ids) if tokens else []
    return out


def decoder_start_of(model) -> int:
    """The token an encoder-decoder model's decoder starts from (its config's
    ``decoder_start_token_id``, else ``eos_token_id``, else 0)."""
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(model.config, "eos_token_id", 0)
    return int(start)
