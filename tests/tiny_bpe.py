"""A tiny byte-level BPE tokenizer trained in a test, for tasks written in English words (the
counterfactual pair tasks of data/pairs.py): its merges make the generators' names, places,
capitals and years whole tokens, like a real model's tokenizer, without any download."""

from __future__ import annotations

from pathlib import Path


MISSING = ("Canberra", "Copenhagen")


def corpus(two_digit_years: bool) -> list[str]:
    from attattr_cli.data import pairs
    from attattr_cli.data.pair_tasks import agreement, capitals, copying, greater_than, ioi, mcq, pronoun

    words = list(pairs.NAMES) + list(ioi.PLACES) + list(ioi.OBJECTS) + list(greater_than.GT_NOUNS)
    words += [w for c in capitals.COUNTRIES for w in c]
    words += "When and went to the gave a Then After While were working at had long argument Afterwards said got" \
             " decided give it Friends found The lasted from year capital of is city government sits in".split()
    words += list(copying.SURNAMES) + list(pronoun.MALE) + list(pronoun.FEMALE) + "he she are".split()
    words += [w for n in agreement.AGREEMENT_NOUNS for w in n]
    words += [w for c, ws in mcq.MCQ_CATEGORIES.items() for w in (c,) + ws] + "Question Which these Answer A B C".split()
    for t in copying.COPY_TEMPLATES + pronoun.PRONOUN_TEMPLATES + agreement.AGREEMENT_ATTRACTORS:
        words += t.replace("{F}", "").replace("{L}", "").replace("{N}", "").replace(",", "").replace(".", "").split()
    words = [w for w in words if w not in MISSING]  # several tokens: the capitals generator must leave them out
    lines = [" ".join(words)] * 30
    lines += [t.format(A="Mary", B="John", S="John", PLACE="store", OBJECT="drink") for t in ioi.IOI_TEMPLATES] * 5
    years = [f"{y:02d}" for y in range(100)] if two_digit_years else [str(d) for d in range(10)]
    lines += [" ".join(years)] * 30 + [f"year {c}{y:02d}" for c in range(11, 18) for y in range(100)]
    return lines


def save_bpe_tokenizer(folder: Path, two_digit_years: bool = False, vocab_size: int = 1500) -> Path:
    """Train the tokenizer and save it (tokenizer.json and its config) into ``folder``. Digits
    are one per token (as SmolLM2's, Llama's), or with ``two_digit_years`` a century and
    its year are two tokens "17", "32" (as GPT-2's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    digits = [pre_tokenizers.Split(Regex(r"\d\d" if two_digit_years else r"\d"), behavior="isolated")]
    tok.pre_tokenizer = pre_tokenizers.Sequence(digits + [pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(two_digit_years), trainer)
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return folder
