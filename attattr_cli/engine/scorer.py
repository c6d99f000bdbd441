"""Attention attribution of one example, all (or chosen) layers, all heads.

Attr_h(A) = A_h * integral_0^1 dF(alpha A)/dA_h d alpha   (Hao et al. 2021, eq. 1)

computed with the algebra of docs/method.md section 1.4: the clean forward runs once at batch 1
and keeps every layer's input; for each target layer the steps run as a batch in which
the layers below are replayed (not recomputed), the target layer's output for step k is
alpha_k * (A V), and the gradient is taken only with respect to that output. Then
Attr = A * (G V^T) with G = sum_k w_k dF/dO_k. No tensor of size steps x heads x n x n
is ever built.
"""

from __future__ import annotations

import inspect
from typing import Callable

import numpy as np
import torch

from ..data.types import Example
from ..errors import DataError, OptionError, ResourceError
from ..models.loading import LoadedModel, align_labels, resolve_dtype
from ..ops import reference_mask, with_causal, reference, select_backend
from . import attention, memory, options as options_mod
from .batching import pad_id_of
from .encoding import Encoded, decoder_start_of, encode, too_long
from . import adaptive
from .integrate import embedded, nodes
from .memory import BackOff, is_out_of_memory
from .options import DEFAULT_TOL, ScoreOptions
from .results import ExampleScore, FamilyScore
from .sites import SiteScorer


class Scorer:
    """Scores examples with one model and one set of options."""

    def __init__(self, loaded: LoadedModel, options: ScoreOptions, task_labels=None):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.options = options
        self.arch = loaded.arch
        self.sites = SiteScorer(self.model, self.arch)
        self.families = self.sites.choose(options.family)
        self.layers = options.validate(self.families[0].num_layers)
        self.layers_of = {f.name: options.validate(f.num_layers) for f in self.families}
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
        else:
            self.label_map, self.label_how = align_labels(task_labels, loaded)
            self.task_labels = list(task_labels) if task_labels is not None else loaded.label_names
            self._fixed_target = self._parse_target(options.target)
        self.alphas, self.weights = nodes(options.rule, options.steps if options.tol is None else 2)
        self.low = embedded(options.rule, options.steps) if options.tol is None else None
        self.last_integral = (options.steps or 0, float("nan"), False)  # nodes, error estimate, cap hit
        # LMs that can run only the needed positions through their head (checked once, not per pass)
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.last_step_batch = 0
        self._back_off = BackOff(self.device, options.dtype)  # its lowered size is kept for later examples
        self.warn: Callable[[str], None] | None = None  # where the back-off says so once; None: warnings.warn

    # -- targets ---------------------------------------------------------------
    def _parse_target(self, target: str) -> int | None:
        if target in ("predicted", "gold"):
            return None
        names = [n.lower() for n in self.loaded.label_names]
        if target.lower() in names:
            return names.index(target.lower())
        task_names = [n.lower() for n in self.task_labels]
        if target.lower() in task_names:
            return self.label_map[task_names.index(target.lower())]
        if target.lstrip("-").isdigit() and 0 <= int(target) < len(names):
            return int(target)
        raise OptionError(
            f"unknown target '{target}'; use predicted, gold, a label index or one of: "
            + ", ".join(self.loaded.label_names)
        )

    def _one_token(self, text: str) -> int:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            shown = self.tokenizer.convert_ids_to_tokens(ids)
            raise OptionError(
                f"--target-token '{text}' is {len(ids)} tokens for this tokenizer ({' '.join(shown) or 'none'});"
                " give one token (mind a leading space) or use --continuation"
            )
        return int(ids[0])

    def _target_value(self, logits: torch.Tensor, target) -> torch.Tensor:
        """F per batch row. Classifiers: logits [b, labels], target a label index.
        LMs: logits [b, positions, vocab] (the kept positions), target a list of token ids,
        one per kept position; F is their joint probability, summed log-probability or
        summed logit."""
        work = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        if self.options.lm:
            idx = torch.as_tensor(target, device=work.device).view(1, -1, 1).expand(work.shape[0], -1, 1)
            if self.options.output == "logit":
                return work.gather(-1, idx).squeeze(-1).sum(-1)
            logp = torch.log_softmax(work, dim=-1).gather(-1, idx).squeeze(-1).sum(-1)
            return logp if self.options.output == "logprob" else logp.exp()
        if torch.is_tensor(target):  # one target per row (several examples in one pass)
            if self.options.output != "logit":
                work = torch.log_softmax(work, dim=-1) if self.options.output == "logprob" else torch.softmax(work, dim=-1)
            return work.gather(1, target.view(-1, 1).to(work.device)).squeeze(1)
        if self.options.output == "logit":
            return work[:, target]
        if self.options.output == "logprob":
            return torch.log_softmax(work, dim=-1)[:, target]
        return torch.softmax(work, dim=-1)[:, target]

    # -- encoding --------------------------------------------------------------
    def _check_length(self, n: int, index: int) -> None:
        limit = self.loaded.arch.max_length
        if limit is not None and n > limit:
            raise too_long(index, n, limit, hint=not self.options.lm)

    def encode(self, example: Example) -> Encoded:
        if self.options.lm:
            enc = self._encode_lm(example)
        else:
            enc = encode(self.tokenizer, example, self.loaded.arch.max_length, self.options.truncate,
                         decoder_start=decoder_start_of(self.model) if self.arch.is_encoder_decoder else None)
        self._check_vocabulary(example, enc)
        return enc

    def _check_vocabulary(self, example: Example, enc: Encoded) -> None:
        """A token id the model's embeddings do not hold (a tokenizer from another model) is one
        line naming the example, not an IndexError from inside the model."""
        embeddings = self.model.get_input_embeddings()
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
        if self.arch.is_encoder_decoder:
            return self._encode_seq2seq(example, prompt)
        if self.options.continuation is not None:
            cont = list(tok(self.options.continuation, add_special_tokens=False)["input_ids"])
            if not cont:
                raise OptionError("--continuation is empty for this tokenizer")
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
        self._check_length(len(ids), example.index)
        segments = [0] * len(ids)
        return Encoded(ids, tok.convert_ids_to_tokens(ids), segments, None, False,
                       lm_positions=positions, lm_targets=targets)

    def _encode_seq2seq(self, example: Example, prompt: list[int]) -> Encoded:
        """An encoder-decoder LM (T5, BART for generation): the prompt is the encoder's input;
        the decoder's is the start token and the continuation without its last token, and the
        target is the continuation (F its joint probability), else the first token after the
        start token (the predicted one, or ``--target-token``)."""
        tok = self.tokenizer
        start = decoder_start_of(self.model)
        if self.options.continuation is not None:
            cont = list(tok(self.options.continuation, add_special_tokens=False)["input_ids"])
            if not cont:
                raise OptionError("--continuation is empty for this tokenizer")
            dec, targets = [start] + cont[:-1], cont
            positions = list(range(len(cont)))
        else:
            if self.options.position not in (None, -1, 0):
                raise OptionError("--position picks a prompt position of a decoder-only LM; an encoder-decoder"
                                  " model's target is the first decoder token (or --continuation)")
            dec, positions = [start], [0]
            targets = None if self._lm_token is None else [self._lm_token]
        self._check_length(len(prompt), example.index)
        return Encoded(prompt, tok.convert_ids_to_tokens(prompt), [0] * len(prompt), None, False,
                       lm_positions=positions, lm_targets=targets, decoder_input_ids=dec,
                       decoder_tokens=tok.convert_ids_to_tokens(dec))

    # -- scoring ---------------------------------------------------------------
    def _inputs(self, enc: Encoded, batch: int) -> dict:
        ids = torch.tensor([enc.input_ids], device=self.device)
        inputs = {"input_ids": ids.expand(batch, -1)}
        if self.options.lm and enc.decoder_input_ids is not None:  # an encoder-decoder LM's target side
            inputs["decoder_input_ids"] = torch.tensor([enc.decoder_input_ids], device=self.device).expand(batch, -1)
        if enc.token_type_ids is not None:
            inputs["token_type_ids"] = torch.tensor([enc.token_type_ids], device=self.device).expand(batch, -1)
        if self.arch.is_decoder or self.arch.is_encoder_decoder:
            inputs["use_cache"] = False  # no key/value cache at batch m
        if enc.lm_positions is not None and self._takes_logits_to_keep:
            inputs["logits_to_keep"] = torch.tensor(enc.lm_positions, device=self.device)
        return inputs

    def _logits(self, enc: Encoded, batch: int, extra: dict | None = None) -> torch.Tensor:
        """The model's logits: [batch, labels] for classifiers, [batch, kept positions, vocab]
        for LMs (only the positions F needs go through the LM head where the model can)."""
        inputs = self._inputs(enc, batch)
        logits = self.model(**inputs, **(extra or {})).logits
        if enc.lm_positions is not None and "logits_to_keep" not in inputs:
            logits = logits[:, torch.tensor(enc.lm_positions, device=logits.device)]
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
            # alpha = 1 is the clean forward for every target site: when the rule has that
            # node, one backward of the clean forward gives its gradient for all of them
            share_one = bool((self.alphas == 1).any()) and bool(targets)
            record = attention.Record(grad_layers=frozenset(targets) if share_one else frozenset(),
                                      keep={"maps": "maps", "sum": "mean"}.get(keep))
            with self.sites.capture() as clean, torch.set_grad_enabled(share_one), attention.active(record):
                logits_g = self._logits(enc, 1)
            logits = logits_g.detach()
            if self.options.lm:
                pred = int(logits[0, 0].argmax())
                gold = -1
                target = list(enc.lm_targets) if enc.lm_targets is not None else [pred]
            else:
                pred = int(logits[0].argmax())
                gold = -1 if example.label is None else self.label_map[example.label]
                target = self._choose_target(pred, gold, example)
            f_full = float(self._target_value(logits, target)[0])
            self._f_full = f_full  # F(1), for --tol's completeness check
            at_one = {}
            if share_one:
                wanted = [t for t in targets if t in record.leaves]
                grads = torch.autograd.grad(self._target_value(logits_g, target).sum(), [record.leaves[x] for x in wanted])
                at_one = dict(zip(wanted, grads))
                clean.outputs = {p: {i: detached(o) for i, o in d.items()} for p, d in clean.outputs.items()}
                if clean.encoder_out is not None:
                    clean.encoder_out = clean.encoder_out.detach()
            del logits_g, record.leaves

            fams = {}
            self.last_step_batch = 0
            for fam in self.families:
                per_layer = []
                for layer in self.layers_of[fam.name]:
                    site = (fam.name, layer)
                    g, f0 = self._integrate(enc, site, target, clean, at_one.get(site))
                    per_layer.append(self._layer_result(g, f0, f_full, keep, self._saved, self.last_integral))
                    del g
                    if on_layer is not None:
                        on_layer(layer)
                fams[fam.name] = self._family_score(fam, keep, record.keep, record.probs, per_layer,
                                                    len(enc.input_ids))
        return self._example_score(example, enc, logits, pred, gold, target, f_full, fams)

    def _layer_result(self, g: torch.Tensor, f0: float, f_full: float, keep: str, saved: dict, conv) -> dict:
        """What the store keeps of one layer, from its G: the map (keep maps), the head sum
        (maps, sum), the top-k entries, the per-head max, F(0), the completeness residual
        and (nodes, error estimate, cap hit, convergence state) of the integral (a fixed
        rule's state is judged here, from its embedded estimate and its residual)."""
        res = self._attribute(g, want_maps=(keep == "maps" or self.options.top_k is not None), saved=saved)
        hs = res["head_sum"][0]
        resid = float(hs.double().sum()) - (f_full - f0)
        if len(conv) == 3:  # a fixed rule: judged at the tolerance --tol would use by default
            scale = adaptive.residual_scale(f_full - f0, self._measure(g, saved)[0])
            state = adaptive.judge(conv[1], resid, scale, abs(f_full) + abs(f0), self.check_tol,
                                   float(torch.finfo(self.dtype).eps), float(torch.finfo(g.dtype).eps))
            conv = (*conv, state)
        return {
            "map": res["maps"][0].cpu() if keep == "maps" else None,
            "sum": hs.cpu() if keep in ("maps", "sum") else None,
            "topk": None if self.options.top_k is None else _top_k(res["maps"][0], self.options.top_k),
            "head_max": res["head_max"][0].cpu(),
            "f0": f0,
            "resid": resid,
            "conv": conv,
        }

    def _example_score(self, example: Example, enc: Encoded, logits: torch.Tensor, pred: int, gold: int, target,
                       f_full: float, fams: dict) -> ExampleScore:
        """The scored example from its logits ([1, ...]), prediction, target and families."""
        first = fams[self.families[0].name]
        n = len(enc.input_ids)
        if self.options.lm:
            pos_logits = logits[0].double()  # [positions, vocab]
            tgt = torch.as_tensor(target, device=pos_logits.device).view(-1, 1)
            out_logits = pos_logits.gather(-1, tgt).squeeze(-1)
            out_probs = torch.softmax(pos_logits, -1).gather(-1, tgt).squeeze(-1)
            meta = dict(example.meta, lm={
                "positions": list(enc.lm_positions), "target_ids": [int(t) for t in target],
                "target_tokens": self.tokenizer.convert_ids_to_tokens([int(t) for t in target]),
                "predicted_id": pred, "predicted_token": self.tokenizer.convert_ids_to_tokens([pred])[0],
                "output": self.options.output,
            })
            target_id = int(target[0])
        else:
            out_logits = logits[0].double()
            out_probs = torch.softmax(out_logits, -1)
            meta = dict(example.meta)
            target_id = target
        out_logits_np, out_probs_np = out_logits.cpu().numpy(), out_probs.cpu().numpy()
        nonfinite = nonfinite_parts(out_logits_np, out_probs_np, f_full, fams)
        if "logits" in nonfinite:
            pred = -1  # no class is predicted by non-finite logits
        return ExampleScore(
            nonfinite=nonfinite,
            index=example.index,
            tokens=enc.tokens,
            input_ids=np.asarray(enc.input_ids, dtype=np.int64),
            segment_ids=np.asarray(enc.segment_ids, dtype=np.int8),
            gold=gold,
            pred=pred,
            target=target_id,
            logits=out_logits_np,
            probs=out_probs_np,
            layers=list(first.layers),
            attribution=first.attribution if first.attribution is not None
            else np.zeros((0, 0, n, n), np.float32),
            attention=first.attention if first.attention is not None and first.attention.ndim == 4
            else np.zeros((0, 0, n, n), np.float32),
            head_max=first.head_max,
            f_full=f_full,
            f_baseline=first.f_baseline,
            residual=first.residual,
            kernel=getattr(self, "last_kernel", self.backend.name),
            truncated=enc.truncated,
            meta=meta,
            text_a=example.text_a,
            text_b=example.text_b,
            families=fams,
            decoder_tokens=enc.decoder_tokens,
            decoder_input_ids=None if enc.decoder_input_ids is None else np.asarray(enc.decoder_input_ids, np.int64),
            step_batch=self.last_step_batch,
        )

    def _family_score(self, fam, keep: str, kept: str | None, probs: dict, per_layer: list[dict], n: int) -> FamilyScore:
        """One family's results from its layers' (``_layer_result``) and the clean forward's
        probabilities (``probs``: site -> [1, ...], kept as ``kept``: maps, mean or None)."""
        maps = [r["map"] for r in per_layer if r["map"] is not None]
        sums = [r["sum"] for r in per_layer if r["sum"] is not None]
        head_max = [r["head_max"] for r in per_layer]
        tk_i = [r["topk"][0] for r in per_layer if r["topk"] is not None]
        tk_v = [r["topk"][1] for r in per_layer if r["topk"] is not None]
        f_base = [r["f0"] for r in per_layer]
        resid = [r["resid"] for r in per_layer]
        all_layers = range(fam.num_layers)
        attn = None
        if kept is not None:
            attn = torch.stack([probs[(fam.name, i)][0] for i in all_layers]).float().cpu().numpy()
        empty2 = np.zeros((0, fam.num_heads), np.float32)
        return FamilyScore(
            name=fam.name, layers=list(self.layers_of[fam.name]), heads=fam.num_heads,
            query_side=fam.query_side, key_side=fam.key_side, keep=keep,
            attribution=torch.stack(maps).numpy() if maps else (None if keep != "maps" else np.zeros((0, fam.num_heads, n, n), np.float32)),
            head_sum=torch.stack(sums).numpy() if sums else None,
            head_max=torch.stack(head_max).numpy() if head_max else empty2,
            attention=attn,
            f_baseline=np.asarray(f_base, dtype=np.float64),
            residual=np.asarray(resid, dtype=np.float64),
            topk_index=np.stack(tk_i) if tk_i else None,
            topk_value=np.stack(tk_v) if tk_v else None,
            nodes=np.asarray([r["conv"][0] for r in per_layer], np.int32),
            error=np.asarray([r["conv"][1] for r in per_layer], np.float64),
            capped=np.asarray([r["conv"][2] for r in per_layer], bool),
            status=np.asarray([r["conv"][3] for r in per_layer], np.uint8),
            status_tol=self.check_tol,
        )

    def _choose_target(self, pred: int, gold: int, example: Example) -> int:
        if self._fixed_target is not None:
            return self._fixed_target
        if self.options.target == "gold":
            if gold < 0:
                raise DataError(f"example {example.index} has no gold label; --target gold needs one")
            return gold
        return pred

    # -- step micro-batching ------------------------------------------------------
    def auto_step_batch(self, enc: Encoded, site, steps: int | None = None) -> int:
        """Steps per pass (at most ``steps``, default all) that fit the free memory of the
        device: an estimate of the activations kept for the backward through the layers
        at and above the target. ``--step-batch`` overrides it."""
        if self.options.step_batch is not None:
            return self.options.step_batch
        steps = len(self.alphas) if steps is None else steps
        n = max(len(enc.input_ids), len(enc.decoder_input_ids or []))
        return memory.steps_that_fit(self.step_bytes(enc, site), steps, n, self.device,
                                     memory.hidden_size(self.model.config))

    def step_bytes(self, enc: Encoded, site) -> int:
        """Estimated bytes one integration step of ``site`` keeps (see ``memory.step_bytes``)."""
        n = max(len(enc.input_ids), len(enc.decoder_input_ids or []))
        kept = len(enc.lm_positions) if enc.lm_positions is not None else 1
        return memory.step_bytes(self.model.config, self.arch, site, n, self.dtype, self.device, kept, self.options.lm)

    def _integrate(self, enc: Encoded, site, target, clean,
                   grad_at_one: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """G = sum_k w_k dF/dO_k for the target site, and F with its attention at 0.

        ``grad_at_one`` is dF/dO at alpha = 1 from the clean forward's backward; that node
        is then not recomputed. Steps run in micro-batches that fit memory; a CUDA
        out-of-memory error halves the micro-batch and retries.
        """
        family, layer = site
        acc_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        if self.options.tol is not None:
            return self._integrate_to_tol(enc, site, target, clean, grad_at_one, acc_dtype)
        alphas, weights, ratio, g_sum, g_low = self.fixed_nodes(grad_at_one, acc_dtype)
        zero = torch.nonzero(alphas == 0)
        zero_at = int(zero[0]) if len(zero) else None
        f0 = float("nan")
        chunk = self.auto_step_batch(enc, site, len(alphas)) if len(alphas) else 1
        saved = None
        weights = weights.to(self.device, acc_dtype)
        run = lambda part: self._step_chunk(enc, site, target, clean, alphas[part], weights[part])  # noqa: E731
        for part, (grads, f, saved) in self._back_off.chunks(len(alphas), chunk, run, self.warn):
            if ratio is not None:
                low = (grads * ratio[part].to(grads).view(-1, *[1] * (grads.dim() - 1))).sum(0, keepdim=True)
                g_low = low if g_low is None else g_low + low
            grads = grads.sum(0, keepdim=True)
            g_sum = grads if g_sum is None else g_sum + grads
            if zero_at is not None and part.start <= zero_at < part.stop:
                f0 = float(f[zero_at - part.start])
            self.last_step_batch = max(self.last_step_batch, part.stop - part.start)
            del f, grads
        if zero_at is None:  # F(0): one forward at batch 1, no backward
            plan = attention.Attribute(layer, torch.zeros(1, dtype=torch.float64, device=self.device), self.backend,
                                       family=family)
            with self.sites.target_pass(site, clean, plan), torch.no_grad():
                f0 = float(self._target_value(
                    self._logits(enc, 1, self.sites.extra_inputs(site, clean, 1)), target)[0])
            if saved is None:
                saved = plan.saved
        self._saved = saved
        self.last_integral = (len(self.alphas), self.embedded_error(g_sum, g_low), False)
        return g_sum, f0

    def fixed_nodes(self, grad_at_one: torch.Tensor | None, acc_dtype: torch.dtype):
        """The fixed rule's nodes left to evaluate, (alphas, weights, ratio, G, G_low): where the
        clean backward gave the alpha = 1 node (``grad_at_one``, [E, ...]) it is folded into G
        (and into the embedded lower-order rule's G_low; both None otherwise) and left out of
        the nodes. ``ratio`` = w_low / w of the nodes left (the embedded rule's G is
        sum_k ratio_k w_k dF/dO_k); None without an embedded rule."""
        alphas, weights = self.alphas, self.weights
        ratio = None if self.low is None else torch.from_numpy(self.low[0]) / weights
        g = g_low = None
        if grad_at_one is not None:
            one = alphas == 1
            g = grad_at_one.to(acc_dtype) * weights[one].sum().item()
            if ratio is not None:
                g_low = g * ratio[one].sum().item()
                ratio = ratio[~one]
            alphas, weights = alphas[~one], weights[~one]
        return alphas, weights, ratio, g, g_low

    def _integrate_to_tol(self, enc: Encoded, site, target, clean, grad_at_one, acc_dtype):
        """G and F(0) by the error-controlled integration of engine/adaptive.py."""
        def evaluate(alphas: torch.Tensor):  # unweighted dF/dO per alpha, in micro-batches
            ones = torch.ones(len(alphas), dtype=acc_dtype, device=self.device)
            run = lambda part: self._step_chunk(enc, site, target, clean, alphas[part], ones[part])  # noqa: E731
            grads, fs = [], []
            for part, (g, f, self._saved) in self._back_off.chunks(
                    len(alphas), self.auto_step_batch(enc, site, len(alphas)), run, self.warn):
                grads.append(g)
                fs.append(f)
                self.last_step_batch = max(self.last_step_batch, part.stop - part.start)
            return torch.cat(grads), torch.cat(fs)

        known = {} if grad_at_one is None else {adaptive.ONE: grad_at_one.to(acc_dtype)[0]}
        known_f = {} if grad_at_one is None else {adaptive.ONE: self._f_full}
        def derivative(g: torch.Tensor) -> torch.Tensor:  # sum Attr = <G, A V> per row (dF/dalpha at a node)
            s = self._saved
            if "out" not in s:
                s["out"] = torch.matmul(self.layer_probs(s, g.dtype), s["v"].to(g.dtype))
            return (g.reshape(len(g), *s["out"].shape[-3:]) * s["out"]).sum(dim=(-3, -2, -1), dtype=torch.float64)

        res = adaptive.integrate(evaluate, self._measure, self.options.tol, self.options.max_nodes, known, known_f,
                                 derivative)
        self.last_integral = (res.nodes, res.error, res.capped, res.status)
        return res.g.unsqueeze(0), res.f[adaptive.ZERO]

    def embedded_error(self, g: torch.Tensor, g_low: torch.Tensor | None, saved: dict | None = None) -> float:
        """The fixed rule's error estimate from its embedded lower-order rule: max |Attr(G) -
        Attr(G_low)| / max |Attr(G)| / d (``self.low``); nan without an embedded rule."""
        if g_low is None:
            return float("nan")
        return adaptive.relative(self._measure(g - g_low, saved)[0], self._measure(g, saved)[0]) / self.low[1]

    @property
    def check_tol(self) -> float:
        """The tolerance convergence is judged at: --tol, or for a fixed rule the default's."""
        return self.options.tol if self.options.tol is not None else DEFAULT_TOL

    def _measure(self, g: torch.Tensor, saved: dict | None = None) -> tuple[float, float, float]:
        """(max |Attr|, sum |Attr|, sum Attr) of the map made from ``g`` with the saved
        projections (``self._saved`` by default); the map itself is not kept."""
        s = self._saved if saved is None else saved
        g = g.reshape(1, *g.shape[-3:])
        return tuple(float(x) for x in map_measures(self.layer_probs(s, g.dtype), s["v"].to(g.dtype), g)[0])

    @staticmethod
    def layer_probs(saved: dict, dtype: torch.dtype) -> torch.Tensor:
        """The target layer's attention A (in ``dtype``) from its saved projections, made once
        per layer and kept in ``saved`` (error estimates ask for it at every level)."""
        if "probs" not in saved:
            mask = reference_mask(saved["mask"])
            mask = with_causal(mask, saved["q"], saved["k"]) if saved["causal"] else mask
            saved["probs"] = reference.attention_probs(saved["q"], saved["k"], mask, saved["scale"],
                                                       saved["softcap"]).to(dtype)
        return saved["probs"]

    def _step_chunk(self, enc: Encoded, site, target, clean, a: torch.Tensor, w: torch.Tensor):
        """One micro-batch of steps: (w_k dF/dO_k per step, F at its alphas, saved Q/K/V)."""
        family, layer = site
        acc_dtype = w.dtype
        plan = attention.Attribute(layer, a.to(self.device), self.backend, family=family)
        with self.sites.target_pass(site, clean, plan), torch.enable_grad():
            logits = self._logits(enc, len(a), self.sites.extra_inputs(site, clean, len(a)))
            f = self._target_value(logits, target)
            if plan.leaf is None:
                raise RuntimeError(f"{family} layer {layer}'s attention was not routed through attattr")
            (g,) = torch.autograd.grad((f * w).sum(), plan.leaf)
        return g.to(acc_dtype), f.detach(), plan.saved

    def _attribute(self, g: torch.Tensor, want_maps: bool = True, saved: dict | None = None) -> dict:
        s = self._saved if saved is None else saved
        self.last_kernel = self.backend.name if self.backend.supports(s["q"], s["mask"], s["softcap"]) else "torch"
        return self.backend.attribution_from_grad(
            s["q"], s["k"], s["v"], g, mask=s["mask"], scale=s["scale"], softcap=s["softcap"],
            causal=s["causal"], want_maps=want_maps,
        )


def _top_k(maps: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k entries of largest |value| per head: ([head, k, 2] (query, key), [head, k])."""
    heads, n_q, n_k = maps.shape
    flat = maps.reshape(heads, -1)
    k = min(k, flat.shape[1])
    idx = flat.abs().topk(k, dim=1).indices
    vals = flat.gather(1, idx)
    pos = torch.stack([idx // n_k, idx % n_k], dim=-1)
    return pos.to(torch.int32).cpu().numpy(), vals.float().cpu().numpy()



def detached(obj):
    if torch.is_tensor(obj):
        return obj.detach()
    if isinstance(obj, tuple):
        return tuple(detached(o) for o in obj)
    return obj


def map_measures(a: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """(max |Attr|, sum |Attr|, sum Attr) per leading index of the maps Attr = A * (G V^T):
    A [..., head, n, n], V and G [..., head, n, d] -> [..., 3] (sums in float64)."""
    attr = a * torch.matmul(g, v.transpose(-1, -2))
    dims = (-3, -2, -1)
    return torch.stack([attr.abs().amax(dim=dims).double(), attr.abs().sum(dim=dims, dtype=torch.float64),
                        attr.sum(dim=dims, dtype=torch.float64)], dim=-1)


def nonfinite_parts(logits: np.ndarray, probs: np.ndarray, f_full: float, families: dict) -> list[str]:
    """Which parts of a scored example hold NaN or infinity (a float16 model whose logits
    overflow, say): "logits", "probs", "output" (F at alpha 1 or 0), "attribution" (maps,
    head sums, head maxima, top-k), "attention". Empty when all are finite."""

    def bad(*arrays) -> bool:
        return any(a is not None and np.size(a) and not np.isfinite(np.asarray(a, np.float64)).all() for a in arrays)

    out = []
    if bad(logits):
        out.append("logits")
    if bad(probs):
        out.append("probs")
    if bad(np.asarray([f_full]), *(fs.f_baseline for fs in families.values())):
        out.append("output")
    if bad(*(x for fs in families.values() for x in (fs.attribution, fs.head_sum, fs.head_max, fs.topk_value,
                                                        fs.residual))):
        out.append("attribution")
    if bad(*(fs.attention for fs in families.values())):
        out.append("attention")
    return out
