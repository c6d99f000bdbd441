"""What a scored example becomes: one layer's result from its G (the map, the head sum,
the top-k, the per-head max, F(0), the completeness residual, the convergence state), a
family's arrays, and the :class:`~attattr_cli.engine.results.ExampleScore` the store keeps.
A part of :class:`~attattr_cli.engine.scorer.Scorer` (its result assembly), kept apart from
the integration (engine/layer_integral.py) and the encoding and targets (engine/scorer.py)."""

from __future__ import annotations

import numpy as np
import torch

from ..data.types import Example
from . import adaptive, layer_integral
from .encoding import Encoded
from .memory import to_host
from .results import ExampleScore, FamilyScore


class Assembly:
    """The Scorer's result assembly (a mixin: it uses the scorer's options, families and
    integration)."""

    def layer_result(self, g: torch.Tensor, f0: float, f_full: float, keep: str, saved: dict, conv) -> dict:
        """What the store keeps of one layer, from its G: the map (keep maps), the head sum
        (maps, sum), the top-k entries, the per-head max, F(0), the completeness residual
        and (nodes, error estimate, cap hit, convergence state) of the integral (a fixed
        rule's state is judged here, from its embedded estimate and its residual)."""
        return self.layer_results([(g, f0, f_full, saved, conv)], keep)[0]

    def layer_results(self, items: list, keep: str) -> list[dict]:
        """:meth:`layer_result` of each ``(g, f0, f_full, saved, conv)``; what comes to the host
        as numbers (the completeness sums, the judged scales, the per-head maxima) comes in one
        copy for all of them."""
        judged = [i for i, item in enumerate(items) if len(item[4]) == 3]  # a fixed rule's, judged here
        bigs = dict(zip(judged, self.measures([(items[i][0], items[i][3]) for i in judged])[:, 0])) if judged else {}
        parts = self._layer_parts(items, keep, bigs)
        scalars = [t.double() for _, total, big in parts for t in (total, big) if t is not None]
        host = iter(torch.stack(scalars).tolist())
        maxima = torch.stack([out["head_max"] for out, _, _ in parts]).cpu()  # [layer, head]: a few bytes
        results = []
        for (out, _, big), (g, f0, f_full, _, conv), head_max in zip(parts, items, maxima):
            resid = next(host) - (f_full - f0)
            out.update(head_max=head_max, f0=f0, resid=resid)
            out["conv"] = conv if big is None else self._judged(conv, resid, next(host), g.dtype, f0, f_full)
            results.append(out)
        return results

    def _layer_parts(self, items: list, keep: str, bigs: dict) -> list:
        """:meth:`_layer_part` of each item; the attributions of layers whose shapes and masks
        agree are made in one call of the backend (a chunk of about SPREAD_CHUNK map entries at
        a time), each layer's arrays then taken from it: an example's layers cost a few
        launches, not a handful each (issue 53)."""
        want_maps = keep == "maps" or self.options.top_k is not None
        parts: list = [None] * len(items)
        keys = []
        for g, _, _, saved, _ in items:
            mask = saved["mask"]
            alone = (saved.get("sink") or self._key_sums_on_kernel(keep, saved)
                     or (mask is not None and (mask.dim() != 2 or len(mask) != 1)) or len(saved["q"]) != 1)
            keys.append(None if alone else self.batch_key(saved, g.dtype) + (tuple(g.shape),))
        for part in layer_integral.layer_batches(keys, [item[3] for item in items]):
            if len(part) == 1:
                g, _, _, saved, _ = items[part[0]]
                parts[part[0]] = self._layer_part(g, keep, saved, bigs.get(part[0]))
                continue
            first = items[part[0]][3]
            mask = first["mask"]
            together = dict(first, mask=None if mask is None else mask.expand(len(part), -1).contiguous(),
                            **{name: torch.cat([items[i][3][name] for i in part]) for name in ("q", "k", "v")})
            res = self.attribute(torch.cat([items[i][0] for i in part]), together, want_maps=want_maps)
            for j, i in enumerate(part):
                parts[i] = self._layer_from(res, j, keep, bigs.get(i))
        return parts

    def _key_sums_on_kernel(self, keep: str, saved: dict) -> bool:
        """Whether ``keep sources`` takes this layer's per-key sums from the CUDA kernel's epilogue."""
        return (keep == "sources" and not saved.get("sink") and self.options.top_k is None
                and self.backend.name == "cuda")

    def _layer_part(self, g: torch.Tensor, keep: str, saved: dict, big: torch.Tensor | None) -> tuple:
        """One layer's arrays (the per-head max still on the device), its attribution's sum and
        ``big`` (for a fixed rule, max |Attr|: the residual's scale; else None), on the device."""
        sink = bool(saved.get("sink"))
        if self._key_sums_on_kernel(keep, saved):
            ks = self.key_sums(g, saved)  # the per-key sums as the kernel's epilogue: no n x n head sum made
            read = ks.get("read_sum")
            return ({"map": None, "sum": None, "topk": None, "key_sum": ks["key_sum"][0].float().cpu(),
                     "read_sum": None if self.read_from is None or read is None else read[0].float().cpu(),
                     "head_max": ks["head_max"][0]}, ks["total"][0], big)
        res = self.attribute(g, saved, want_maps=(keep == "maps" or self.options.top_k is not None or sink))
        if sink:  # the sink key's column (value 0, so attribution 0) is not a token: dropped
            maps = res["maps"][..., :-1]
            res = {"maps": maps, "head_sum": maps.sum(1), "head_max": maps.amax(dim=(-2, -1))}
        return self._layer_from(res, 0, keep, big)

    def _layer_from(self, res: dict, j: int, keep: str, big: torch.Tensor | None) -> tuple:
        """Layer ``j`` of the backend's attribution ``res``: as :meth:`_layer_part` returns it."""
        hs = res["head_sum"][j]
        return {
            "map": to_host(res["maps"][j]) if keep == "maps" else None,
            "sum": to_host(hs) if keep in ("maps", "sum") else None,
            "topk": None if self.options.top_k is None else _top_k(res["maps"][j], self.options.top_k),
            # keep sources: per key, the layer's attribution summed over heads and queries (the
            # head sum [q, k] above is made for this layer only and dropped here)
            "key_sum": hs.sum(0, dtype=torch.float64).float().cpu() if keep == "sources" else None,
            # and over the query rows that read the passages only, from the end of the last one on
            # (the source scores: docs/long-context.md, "The first-passage bias")
            "read_sum": hs[self.read_from:].sum(0, dtype=torch.float64).float().cpu()
            if keep == "sources" and self.read_from is not None else None,
            "head_max": res["head_max"][j],
        }, hs.double().sum(), big

    def _judged(self, conv, resid: float, big: float, g_dtype: torch.dtype, f0: float, f_full: float):
        """A fixed rule's (nodes, estimate, cap hit) with its state, judged at the tolerance
        --tol would use by default (``big``: max |Attr|, the residual's scale)."""
        scale = adaptive.residual_scale(f_full - f0, big)
        state = adaptive.judge(conv[1], resid, scale, abs(f_full) + abs(f0), self.check_tol,
                               float(torch.finfo(self.dtype).eps), float(torch.finfo(g_dtype).eps))
        return (*conv, state)

    def example_score(self, example: Example, enc: Encoded, logits: torch.Tensor, pred: int, gold: int, target,
                       f_full: float, fams: dict) -> ExampleScore:
        """The scored example from its logits ([1, ...]), prediction, target and families."""
        first = fams[self.families[0].name]
        n = len(enc.input_ids)
        if self.options.lm and hasattr(target, "answer"):  # a pair (engine/metrics.py): its own answer and foil
            pos_logits = logits[0, -1].double()  # [vocab]
            probs = torch.softmax(pos_logits, -1)
            ids = {"answer": target.answer, "foil": target.foil}
            meta = dict(example.meta, lm={
                "positions": list(enc.lm_positions), "target_ids": list(target.answer),
                "target_tokens": self.tokenizer.convert_ids_to_tokens(list(target.answer)),
                "foil_ids": list(target.foil), "foil_tokens": self.tokenizer.convert_ids_to_tokens(list(target.foil)),
                "predicted_id": pred, "predicted_token": self.tokenizer.convert_ids_to_tokens([pred])[0],
                "metric": target.metric,
                **{f"{k}_{what}": [float(x) for x in (pos_logits if what == "logits" else probs)[v]]
                   for k, v in ids.items() for what in ("logits", "probs")},
            })
            out_logits, out_probs = pos_logits[target.answer], probs[target.answer]
            target_id = int(target.answer[0])
        elif self.options.lm:
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
            if getattr(self, "foil", None) is not None:  # F = out(target) - out(foil) at the position(s)
                foil = int(self.foil)
                meta["lm"].update(foil_id=foil, foil_token=self.tokenizer.convert_ids_to_tokens([foil])[0],
                                  foil_logits=[float(x) for x in pos_logits[:, foil]],
                                  foil_probs=[float(x) for x in torch.softmax(pos_logits, -1)[:, foil]])
            target_id = int(target[0])
            if getattr(enc, "sources", None) is not None:  # data/sources.py: the prompt's passages
                meta["sources"] = {"how": str(self.options.sources),
                                   "spans": [[s["start"], s["end"], s["text"]] for s in enc.sources]}
        else:
            out_logits = logits[0].double()
            out_probs = torch.softmax(out_logits, -1)
            meta = dict(example.meta)
            if getattr(self, "foil", None) is not None:
                meta["foil"] = {"index": int(self.foil), "label": self.loaded.label_names[int(self.foil)]
                                if int(self.foil) < len(self.loaded.label_names) else str(self.foil)}
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

    def family_score(self, fam, keep: str, kept: str | None, probs: dict, per_layer: list[dict], n: int) -> FamilyScore:
        """One family's results from its layers' (``layer_result``) and the clean forward's
        probabilities (``probs``: site -> [1, ...], kept as ``kept``: maps, mean or None)."""
        maps = [r["map"] for r in per_layer if r["map"] is not None]
        sums = [r["sum"] for r in per_layer if r["sum"] is not None]
        key_sums = [r["key_sum"] for r in per_layer if r.get("key_sum") is not None]
        read_sums = [r["read_sum"] for r in per_layer if r.get("read_sum") is not None]
        head_max = [r["head_max"] for r in per_layer]
        tk_i = [r["topk"][0] for r in per_layer if r["topk"] is not None]
        tk_v = [r["topk"][1] for r in per_layer if r["topk"] is not None]
        f_base = [r["f0"] for r in per_layer]
        resid = [r["resid"] for r in per_layer]
        # every layer's attention, or a hybrid's scored layers (the others compute none)
        all_layers = range(fam.num_layers) if not fam.not_attention else self.layers_of[fam.name]
        attn = None
        if kept is not None:
            attn = to_host(torch.stack([probs[(fam.name, i)][0] for i in all_layers]).float()).clone().numpy()
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
            key_sum=torch.stack(key_sums).numpy() if key_sums else None,
            read_sum=torch.stack(read_sums).numpy() if read_sums else None,
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


def nonfinite_parts(logits: np.ndarray, probs: np.ndarray, f_full: float, families: dict) -> list[str]:
    """Which parts of a scored example hold NaN or infinity (a float16 model whose logits
    overflow, say): "logits", "probs", "output" (F at alpha 1 or 0), "attribution" (maps,
    head sums, head maxima, top-k), "attention". Empty when all are finite."""

    def bad(*arrays) -> bool:  # isfinite on the arrays' own dtypes (a float64 copy of the maps took longer)
        return any(a is not None and np.size(a) and not np.isfinite(np.asarray(a)).all() for a in arrays)

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
