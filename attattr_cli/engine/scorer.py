"""Attention attribution of one example, all (or chosen) layers, all heads.

Attr_h(A) = A_h * integral_0^1 dF(alpha A)/dA_h d alpha   (Hao et al. 2021, eq. 1)

computed as Attr = A * (G V^T) with G = sum_k w_k dF/dO_k, O_k = alpha_k * (A V) the target
layer's output in its integration pass (docs/method.md section 1.4, "The fast algebra"): no
tensor of size steps x heads x n x n is ever built.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..data.types import Example
from ..errors import DataError, OptionError, ResourceError
from ..models.arch import takes_logits_to_keep
from ..models.loading import LoadedModel, align_labels, resolve_dtype
from ..ops import select_backend
from . import attention, options as options_mod, sweep
from .batching import pad_id_of
from .encoding import Encoded, decoder_start_of, empty_text, encode, too_long
from .assembly import Assembly
from .integrate import embedded, nodes
from .layer_integral import Integration
from .memory import BackOff, is_out_of_memory
from .options import ScoreOptions
from .results import ExampleScore
from .rows import detached, to_device
from .sites import SiteScorer


class Scorer(Integration, Assembly):
    """Scores examples with one model and one set of options (a generation step by step:
    engine/generation.py's StepwiseScorer)."""

    scores_steps = False
    read_from: int | None = None  # with sources: the first query row after the last passage (score())

    def __init__(self, loaded: LoadedModel, options: ScoreOptions, task_labels=None):
        if options.stepwise and not self.scores_steps:  # engine/run.py's scorer_for chooses the strategy
            raise TypeError("a generation is scored by engine/generation.py's StepwiseScorer, not Scorer")
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.options = options
        self.arch = loaded.arch
        self.sites = SiteScorer(self.model, self.arch)
        self.families = self.sites.choose(options.family)
        # a hybrid's layers without softmax attention are not scored (models/arch.py)
        self.layers_of = {f.name: f.scored(options.validate(f.num_layers))
                          for f in self.families}
        self.layers = self.layers_of[self.families[0].name]
        if options.lm and not getattr(loaded, "lm", False):
            raise OptionError("--lm needs the model loaded as a causal language model")
        if getattr(loaded, "lm", False) and not options.lm:
            raise OptionError("this model was loaded as a language model: score it with --lm")
        if options.lm and options.target not in ("predicted",):
            raise OptionError(
                f"--target '{options.target}' names a class; with --lm the target is the predicted next token,"
                " --target-token TOKEN or --continuation TEXT"
            )
        self.device = next(self.model.parameters()).device
        self.pad_id = pad_id_of(self.model, self.tokenizer)  # None: examples cannot share a padded pass
        self.dtype = resolve_dtype(options.dtype)
        if next(self.model.parameters()).dtype != self.dtype:
            self.model.to(self.dtype)
        self.backend = select_backend(options.kernel, self.device)
        if options.lm:
            self.label_map, self.label_how = [], "lm"
            self.task_labels = []
            self._fixed_target = None
            self._lm_token = self._one_token(options.target_token) if options.target_token is not None else None
            self.foil = self._one_token(options.foil, "--foil") if options.foil is not None else None
            if self.foil is not None and self.foil == self._lm_token:
                raise OptionError(f"--foil '{options.foil}' is the target token itself: out(target) - out(foil) is 0"
                                  " everywhere and every map would be zero; give another --foil")
        else:
            self.label_map, self.label_how = align_labels(task_labels, loaded)
            self.task_labels = list(task_labels) if task_labels is not None else loaded.label_names
            self._fixed_target = self._parse_target(options.target)
            self.foil = None
            if options.foil is not None:
                self.foil = self._parse_target(options.foil, "--foil class")
                if self.foil is None:
                    raise OptionError(f"--foil names one class (a label name or index), not '{options.foil}'")
                if self.foil == self._fixed_target:
                    raise OptionError(f"--foil '{options.foil}' is the --target class itself: out(target) - out(foil)"
                                      " is 0 everywhere and every map would be zero; give another --foil")
        self.alphas, self.weights = nodes(options.rule, options.steps if options.tol is None else 2)
        self.low = embedded(options.rule, options.steps) if options.tol is None else None
        self.has_one = bool((self.alphas == 1).any())  # alpha = 1 is a node: the clean forward's backward gives it
        # LMs that can run only the needed positions through their head (checked once, not per pass)
        self.takes_logits_to_keep = takes_logits_to_keep(self.model)
        self.last_step_batch = 0
        self.back_off = BackOff(self.device, options.dtype)  # its lowered size is kept for later examples
        self.warn: Callable[[str], None] | None = None  # where the back-off says so once; None: warnings.warn

    # -- targets ---------------------------------------------------------------
    def _parse_target(self, target: str, what: str = "target") -> int | None:
        if target in ("predicted", "gold"):
            return None
        names = [n.lower() for n in self.loaded.label_names]
        if target.lower() in names:
            return names.index(target.lower())
        task_names = [n.lower() for n in self.task_labels]
        if target.lower() in task_names:
            return self.label_map[task_names.index(target.lower())]
        if target.isascii() and target.isdigit() and int(target) < len(names):  # not '²' or '٣'
            return int(target)
        raise OptionError(
            f"unknown {what} '{target}'; use {'predicted, gold, ' if what == 'target' else ''}a label index or one of: "
            + ", ".join(self.loaded.label_names)
        )

    def _one_token(self, text: str, flag: str = "--target-token") -> int:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            shown = self.tokenizer.convert_ids_to_tokens(ids)
            raise OptionError(
                f"{flag} '{text}' is {len(ids)} tokens for this tokenizer ({' '.join(shown) or 'none'});"
                " give one token (mind a leading space) or use --continuation"
            )
        return int(ids[0])

    def target_value(self, logits: torch.Tensor, target) -> torch.Tensor:
        """F per batch row. Classifiers: logits [b, labels], target a label index.
        LMs: logits [b, positions, vocab] (the kept positions), target a list of token ids,
        one per kept position; F is their joint probability, summed log-probability or
        summed logit. With a foil (``--foil``), F is the target's output minus the foil's
        (docs/method.md section 1.1); a generation's per-row targets (engine/generation.py)
        compute their own."""
        if hasattr(target, "value"):  # a generation's step targets, one (position, token) per row
            return target.value(self, logits)
        if self.foil is None:
            return self._output_of(logits, target)
        foil = [self.foil] * len(target) if self.options.lm else (
            torch.full_like(target, self.foil) if torch.is_tensor(target) else self.foil)
        return self._output_of(logits, target) - self._output_of(logits, foil)

    def _output_of(self, logits: torch.Tensor, target) -> torch.Tensor:
        """The chosen output (probability, log-probability or logit) of ``target`` per batch row."""
        work = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        if self.options.lm:
            idx = torch.as_tensor(target, device=work.device).view(1, -1, 1).expand(work.shape[0], -1, 1)
            if self.options.output == "logit":
                return work.gather(-1, idx).squeeze(-1).sum(-1)
            logp = torch.log_softmax(work, dim=-1).gather(-1, idx).squeeze(-1).sum(-1)
            return logp if self.options.output == "logprob" else logp.exp()
        if self.options.output != "logit":
            work = torch.log_softmax(work, dim=-1) if self.options.output == "logprob" else torch.softmax(work, dim=-1)
        if torch.is_tensor(target):  # one target per row (several examples in one pass)
            return work.gather(1, target.view(-1, 1).to(work.device)).squeeze(1)
        return work[:, target]

    # -- encoding --------------------------------------------------------------
    def check_length(self, n: int, index: int) -> None:
        limit = self.loaded.arch.max_length
        if limit is not None and n > limit:
            raise too_long(index, n, limit, hint=not self.options.lm)

    def encode(self, example: Example) -> Encoded:
        if self.options.lm:
            enc = self._encode_lm(example)
        else:
            enc = encode(self.tokenizer, example, self.loaded.arch.max_length, self.options.truncate,
                         decoder_start=decoder_start_of(self.model) if self.arch.is_encoder_decoder else None,
                         token_types=self.loaded.arch.token_types)
        self._check_vocabulary(example, enc)
        if self.options.sources is not None:
            enc.sources = self._sources(example)
        return enc

    def _sources(self, example: Example) -> list[dict]:
        """The prompt's passages as token spans (data/sources.py: the template and the question
        left out), from the tokenizer's character offsets of the prompt (its first tokens in
        every LM encoding)."""
        from ..data.sources import prompt_spans

        return prompt_spans(self.tokenizer, example.text_a, self.options.sources, example.index)

    def _check_vocabulary(self, example: Example, enc: Encoded) -> None:
        """A token id the model's embeddings do not hold (a tokenizer from another model) is one
        line naming the example, not an IndexError from inside the model."""
        try:
            embeddings = self.model.get_input_embeddings()
        except NotImplementedError:  # no one token embedding (CANINE hashes characters): nothing to check
            return
        size = getattr(embeddings, "num_embeddings", None)
        ids = list(enc.input_ids) + list(enc.decoder_input_ids or [])
        if size is not None and ids and max(ids) >= size:
            raise DataError(f"example {example.index} has token id {max(ids)}, but the model's embeddings hold {size}"
                            " tokens: the folder's tokenizer is not the model's (a tokenizer from another model?)")

    def _encode_lm(self, example: Example) -> Encoded:
        tok = self.tokenizer
        prompt = list(tok(example.text_a, add_special_tokens=True)["input_ids"])
        if not prompt:
            raise DataError(f"example {example.index} has an empty prompt")
        if not tok(example.text_a, add_special_tokens=False)["input_ids"]:  # only the tokenizer's own marks
            raise empty_text(example.index, "prompt", example.text_a)
        if self.options.stepwise:  # a generation, step by step (StepwiseScorer's; __init__ refuses it here)
            return self._encode_steps(example, prompt)
        if self.options.metric is not None:  # a clean / counterfactual pair with its own answer and foil
            return self._encode_pair(example)
        if self.arch.is_encoder_decoder:
            return self._encode_seq2seq(example, prompt)
        if self.options.continuation is not None:
            cont = self.continuation_ids()
            ids = prompt + cont[:-1]
            positions = list(range(len(prompt) - 1, len(prompt) - 1 + len(cont)))
            targets = cont
        else:
            ids = prompt
            p = -1 if self.options.position is None else self.options.position
            if not -len(ids) <= p < len(ids):
                raise OptionError(f"--position {p} is outside the prompt of example {example.index} ({len(ids)} tokens)")
            positions = [p % len(ids)]
            targets = None if self._lm_token is None else [self._lm_token]
        self.check_length(len(ids), example.index)
        return Encoded(ids, tok.convert_ids_to_tokens(ids), [0] * len(ids), None, False,
                       lm_positions=positions, lm_targets=targets)

    def continuation_ids(self) -> list[int]:
        """--continuation's token ids (none is an error)."""
        cont = list(self.tokenizer(self.options.continuation, add_special_tokens=False)["input_ids"])
        if not cont:
            raise OptionError("--continuation is empty for this tokenizer")
        return cont

    def _encode_pair(self, example: Example) -> Encoded:
        """A pair (data/pairs.py; its answer, foil and counterfactual in ``example.meta["pair"]``):
        the clean prompt, its next token's answer and foil ids, checked as data/pairs.py checks
        them (equal token lengths, one-token answers and foils)."""
        from ..data.pairs import encode_pair, pair_of_example

        if self.arch.is_encoder_decoder:
            raise OptionError("--metric scores pairs of a decoder-only language model")
        pair = pair_of_example(example)
        enc = encode_pair(self.tokenizer, pair, self.loaded.arch.max_length)
        ids = enc.clean
        return Encoded(ids, self.tokenizer.convert_ids_to_tokens(ids), [0] * len(ids), None, False,
                       lm_positions=[len(ids) - 1], lm_targets=enc.answer, lm_foils=enc.foil)

    def _encode_seq2seq(self, example: Example, prompt: list[int]) -> Encoded:
        """An encoder-decoder LM (T5, BART for generation): the prompt is the encoder's input;
        the decoder's is the start token and the continuation without its last token, and the
        target is the continuation (F its joint probability), else the first token after the
        start token (the predicted one, or ``--target-token``)."""
        tok = self.tokenizer
        start = decoder_start_of(self.model)
        if self.options.continuation is not None:
            cont = self.continuation_ids()
            dec, targets = [start] + cont[:-1], cont
            positions = list(range(len(cont)))
        else:
            if self.options.position not in (None, -1, 0):
                raise OptionError("--position picks a prompt position of a decoder-only LM; an encoder-decoder"
                                  " model's target is the first decoder token (or --continuation)")
            dec, positions = [start], [0]
            targets = None if self._lm_token is None else [self._lm_token]
        self.check_length(len(prompt), example.index)
        return Encoded(prompt, tok.convert_ids_to_tokens(prompt), [0] * len(prompt), None, False,
                       lm_positions=positions, lm_targets=targets, decoder_input_ids=dec,
                       decoder_tokens=tok.convert_ids_to_tokens(dec))

    # -- scoring ---------------------------------------------------------------
    def on_device(self, values, device=None) -> torch.Tensor:
        """``torch.tensor(values)`` on the device, made once per value list: the clean forward
        copies an example's ids to the device, its integration passes reuse them (a plain copy
        from the host waits for the device's queue; issue 53)."""
        device = self.device if device is None else device
        key = (tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in values), str(device))
        cache = self.__dict__.setdefault("_device_values", {})
        if key not in cache:
            if len(cache) >= 64:
                cache.clear()
            cache[key] = to_device(torch.tensor(values), device)
        return cache[key]

    def _example_tensor(self, enc: Encoded, role: str, values) -> torch.Tensor:
        """The example's ``role`` (token ids, kept positions) on the device: its static slot where
        the example is bound (Integration.bind_static), else :meth:`on_device`'s copy."""
        bound = self.__dict__.get("_bound")
        if bound is not None and bound[0] is enc and role in bound[1]:
            return bound[1][role]
        return self.on_device(values if role == "positions" else [values])

    def _inputs(self, enc: Encoded, batch: int) -> dict:
        ids = self._example_tensor(enc, "input_ids", enc.input_ids)
        inputs = {"input_ids": ids.expand(batch, -1)}
        if self.options.lm and enc.decoder_input_ids is not None:  # an encoder-decoder LM's target side
            inputs["decoder_input_ids"] = self._example_tensor(enc, "decoder_input_ids",
                                                               enc.decoder_input_ids).expand(batch, -1)
        if enc.token_type_ids is not None:
            inputs["token_type_ids"] = self._example_tensor(enc, "token_type_ids", enc.token_type_ids).expand(batch, -1)
        if self.arch.is_decoder or self.arch.is_encoder_decoder:
            inputs["use_cache"] = False  # no key/value cache at batch m
        if enc.lm_positions is not None and self.takes_logits_to_keep:
            inputs["logits_to_keep"] = self._example_tensor(enc, "positions", enc.lm_positions)
        return inputs

    def logits(self, enc: Encoded, batch: int, extra: dict | None = None) -> torch.Tensor:
        """The model's logits: [batch, labels] for classifiers, [batch, kept positions, vocab]
        for LMs (only the positions F needs go through the LM head where the model can)."""
        inputs = self._inputs(enc, batch)
        logits = self.model(**inputs, **(extra or {})).logits
        if enc.lm_positions is not None and "logits_to_keep" not in inputs:
            logits = logits[:, self._example_tensor(enc, "positions", enc.lm_positions).to(logits.device)]
        return logits

    def keep_for(self, enc: Encoded) -> str:
        if self.options.keep != "auto":
            return self.options.keep
        n = max(len(enc.input_ids), len(enc.decoder_input_ids or []))
        return "maps" if n <= options_mod.AUTO_MAPS_UP_TO else "sum"

    def score(self, example: Example, encoded: Encoded | None = None,
              on_layer: Callable[[int], None] | None = None) -> ExampleScore:
        """Score one example. Step micro-batches that run out of memory are halved and retried
        (said once through ``self.warn``); memory that runs out anyway raises ResourceError."""
        enc = encoded or self.encode(example)
        # the first query row that reads the passages (after the last one), for their scores
        self.read_from = max(s["end"] for s in enc.sources) if getattr(enc, "sources", None) else None
        try:
            return self._score(example, enc, on_layer)
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            raise ResourceError(
                f"out of memory on {self.device} for example {getattr(example, 'index', '?')} ({len(enc.input_ids)} tokens)"
                " outside the integration steps (the clean forward pass or the attribution maps):"
                " use a smaller model, --dtype bfloat16, --truncate, or a device with more memory"
            ) from exc

    def _score(self, example: Example, enc: Encoded,
               on_layer: Callable[[int], None] | None = None) -> ExampleScore:
        model = self.model
        keep = self.keep_for(enc)
        targets = [(f.name, layer) for f in self.families for layer in self.layers_of[f.name]]
        with attention.taken_over(model):
            graphed = self.graphed_clean(enc, targets, keep, self._target_ahead(example, enc))
            if graphed is None:
                clean, record, logits_g = self.clean_forward(targets, keep, lambda: self.logits(enc, 1))
                logits = logits_g.detach()
            else:  # the clean forward and its backward replayed (graphs on; Integration.graphed_clean)
                clean, record, logits, at_one = graphed
            pred, gold, target = self._targets_of(example, enc, logits)
            f_full = float(self.target_value(logits, target)[0])
            if graphed is None:
                at_one = self.at_one(targets, clean, record, lambda leaves: torch.autograd.grad(
                    self.target_value(logits_g, target).sum(), leaves))
                del logits_g
            clean = self.bind_static(enc, clean)  # (graphs on: the passes read the static slots)

            fams = {}
            for fam in self.families:
                per_layer = []
                layers = self.layers_of[fam.name]
                swept = None
                if sweep.usable(self, enc, fam.name, layers):  # every layer's passes in one sweep per round
                    try:
                        swept = sweep.integrate(self, enc, fam.name, layers, target, clean, at_one, f_full,
                                                on_layer)
                    except attention.NotSweepable:
                        # a model whose layers do not run as a sweep needs them (engine/sweep.py):
                        # one pass per target layer, for this model from now on
                        self.sweeps_work = False
                if swept is not None:
                    per_layer += self.layer_results([(g, f0, f_full, saved, conv) for g, f0, saved, conv in swept], keep)
                # keep sources: the kept table [layer, key] is judged as a whole, the layers from the top
                # down (docs/integration.md, "What is judged, and on which scale")
                floor = 0.0
                done = {}
                order = (layers[::-1] if keep == "sources" else layers) if swept is None else []
                for layer in order:
                    site = (fam.name, layer)
                    g, f0, saved, conv = self.integrate(enc, site, target, clean, at_one.get(site), f_full, floor)
                    done[layer] = self.layer_result(g, f0, f_full, keep, saved, conv)
                    if keep == "sources":
                        floor = max(floor, float(done[layer]["key_sum"].abs().max()))
                    del g
                    if on_layer is not None:
                        on_layer(layer)
                per_layer += [done[layer] for layer in layers if layer in done]
                fams[fam.name] = self.family_score(fam, keep, record.keep, record.probs, per_layer,
                                                    len(enc.input_ids))
        return self.example_score(example, enc, logits, pred, gold, target, f_full, fams)

    def _targets_of(self, example: Example, enc: Encoded, logits: torch.Tensor) -> tuple:
        """(prediction, gold label or -1, target) of an example from its clean logits."""
        if self.options.lm:
            pred = int(logits[0, 0].argmax())
            target = list(enc.lm_targets) if enc.lm_targets is not None else [pred]
            if enc.lm_foils is not None:  # a pair: F is the metric of its own answer and foil
                from .metrics import PairTarget
                target = PairTarget(enc.lm_targets, enc.lm_foils, self.options.metric)
            if self.foil is not None and enc.lm_targets is None and pred == self.foil:
                self.foil_is_target(example.index, "its predicted next token")
            return pred, -1, target
        pred = int(logits[0].argmax())
        gold = -1 if example.label is None else self.label_map[example.label]
        return pred, gold, self.choose_target(pred, gold, example)

    def _target_ahead(self, example: Example, enc: Encoded) -> tuple | None:
        """The target as a captured clean forward computes it on the device: ("predicted", None)
        (the argmax of the logits), ("given", ids) where it is known before the forward, or None
        where the host must see the logits first (a pair's metric, a missing gold label)."""
        if self.options.lm:
            if enc.lm_foils is not None:
                return None
            return ("predicted", None) if enc.lm_targets is None else ("given", list(enc.lm_targets))
        if self._fixed_target is not None:
            return ("given", [self._fixed_target])
        if self.options.target == "gold":
            return None if example.label is None else ("given", [self.label_map[example.label]])
        return ("predicted", None)

    def clean_forward(self, sites: list, keep: str, forward: Callable[[], torch.Tensor]):
        """The clean forward (``forward()`` -> logits) that captures every target site's input and
        keeps the attention ``keep`` asks for: (the captured run, the attention record, the logits,
        with their graph where the rule has alpha = 1: that node is the clean forward for every
        target site, and one backward gives it for all of them, :meth:`at_one`)."""
        self.last_step_batch = 0  # (the example's most steps in one pass, for its store)
        share_one = self.has_one and bool(sites)
        record = attention.Record(grad_layers=frozenset(sites) if share_one else frozenset(),
                                  keep={"maps": "maps", "sum": "mean"}.get(keep))
        with self.sites.capture() as clean, torch.set_grad_enabled(share_one), attention.active(record):
            logits = forward()
        return clean, record, logits

    def at_one(self, sites: list, clean, record, backward: Callable[[list], list]) -> dict:
        """Site -> dF/dO at alpha = 1 from the clean forward's backward (``backward(leaves)`` ->
        the gradient at each leaf); empty where the rule lacks alpha = 1. The captured run is
        detached from the clean forward's graph."""
        at = {}
        if record.grad_layers:
            wanted = [s for s in sites if s in record.leaves]
            if not wanted:  # the model's attention went around the interface and every adapter
                raise attention.not_routed(self.arch.model_type, *sites[0])
            at = dict(zip(wanted, backward([record.leaves[s] for s in wanted])))
            clean.outputs = {p: {i: detached(o) for i, o in d.items()} for p, d in clean.outputs.items()}
            if clean.encoder_out is not None:
                clean.encoder_out = clean.encoder_out.detach()
        del record.leaves
        return at

    def choose_target(self, pred: int, gold: int, example: Example) -> int:
        if self._fixed_target is not None:
            return self._fixed_target
        if self.options.target == "gold":
            if gold < 0:
                raise DataError(f"example {example.index} has no gold label; --target gold needs one")
            chosen = gold
        else:
            chosen = pred
        if self.foil is not None and chosen == self.foil:
            self.foil_is_target(example.index, f"its {self.options.target} class")
        return chosen

    def foil_is_target(self, index: int, what: str) -> None:
        """Say that an example's target is the foil (a question with no answer: F is 0 and every
        map is zero), once per example (a generation: per step, ``what`` names it)."""
        label = (self.tokenizer.convert_ids_to_tokens([int(self.foil)])[0] if self.options.lm
                 else self.loaded.label_names[int(self.foil)])
        message = (f"example {index}: {what} is the foil ({label}): out(target) - out(foil) is 0, and its maps"
                   " are all zero (a question with no answer; choose another --foil or --target)")
        if self.warn is not None:
            self.warn(message)
        else:
            from ..errors import warn_user
            warn_user(message)


