"""`attattr score`: attention attribution into an HDF5 store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from ..api.scoring import DEFAULT_TOL, MAX_NODES, RULES, SOURCES_RULE, SOURCES_STEPS
from ..errors import OptionError
from . import options
from .common import command_line, edge, err, out, parse_int_list, progress_bar, read_prompt_file


RULES_HELP = "; ".join(f"{k}: {v}" for k, v in RULES.items())


def score(
    out_path: Path = typer.Option(..., "--out", "-o", help="HDF5 store to write; an existing store is resumed."),
    model: Optional[str] = options.model("Local model folder or hub id (default: the built-in synthetic-task BERT, or the task's preset model)."),
    data: Optional[str] = options.data("TSV, CSV or JSONL file (default: the built-in synthetic held-out set, or the task's hub dev split)."),
    task: Optional[str] = options.task(),
    examples: Optional[str] = options.examples(),
    steps: Optional[int] = typer.Option(None, "--steps", help="Integration steps m of a fixed rule instead of --tol (alone: the right rule; 20 when only --rule is given)."),
    rule: Optional[str] = typer.Option(None, "--rule", help="A fixed quadrature rule instead of --tol (right with --steps 20 is the paper's, left the 2021 code's): " + RULES_HELP + "."),
    tol: Optional[float] = typer.Option(None, "--tol", help=f"Error-controlled integration (the default, at {DEFAULT_TOL:g}, when neither --steps nor --rule is given, except with --sources): per example and layer, the path is subdivided until the map's estimated error is below TOL x max |Attr| of the layer and the completeness residual agrees (not with --steps or --rule)."),
    max_nodes: int = typer.Option(MAX_NODES, "--max-nodes", help="With --tol: the node cap per example and layer (the store flags where it stopped the refinement)."),
    target: str = typer.Option("predicted", "--target", help="Class to attribute: predicted, gold, a label name or index."),
    logit: bool = typer.Option(False, "--logit/--prob", help="Attribute the target's logit instead of its probability."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Layers to score, e.g. 0,3,6:12 (default: all)."),
    step_batch: Optional[int] = typer.Option(None, "--steps-per-pass", help="Integration steps per forward/backward pass (default: fit to memory); any value gives the same result."),
    step_batch_old: Optional[int] = options.hidden("--step-batch"),
    group: Optional[int] = typer.Option(None, "--group", help="Short examples (up to 128 tokens) of an encoder classifier scored together, their integration nodes sharing passes (default 32, up to 64 for models narrower than hidden size 384; 1: one at a time). Numbers are the same up to float rounding."),
    device: str = options.device(),
    dtype: str = typer.Option("float32", "--dtype", help="Compute dtype: float32, float64, bfloat16, float16."),
    kernel: str = typer.Option("auto", "--kernel", help="auto (CUDA kernel where built and on GPU), cuda, or torch (the reference)."),
    store_dtype: str = typer.Option("float32", "--store-dtype", help="float32, or float16 to halve the store (values below 6e-8 round to 0)."),
    truncate: bool = options.truncate(),
    seed: int = typer.Option(0, "--seed", help="Seed recorded in the store (scoring itself is deterministic); with --generate --sample, the sampling's seed."),
    family: Optional[str] = typer.Option(None, "--family", help="Attention families to score, e.g. encoder,cross (encoder-decoder models: encoder, decoder, cross; others: self). Default: all."),
    keep: str = typer.Option("auto", "--keep", help="Kept per layer: maps (per-head maps, head x query x key), sum (the head sum, query x key, and the per-head max), sources (each key's attribution summed over heads and queries: kilobytes), none (per-head max only). auto: maps up to 512 tokens, else sum; sources with --sources. Sizes: docs/long-context.md."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Also keep the k strongest entries (largest |value|) of each head as (query, key, value)."),
    lm: bool = typer.Option(False, "--lm", help="The model is a causal language model; the target is a next token (see --prompt, --target-token, --continuation)."),
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", help="With --lm: a prompt to score (repeat for several); or give --data."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="With --lm: a text file whose whole text is one prompt (a long context: passages separated by blank lines, then the question)."),
    sources: Optional[str] = typer.Option(None, "--sources", help=f"With --lm: group the prompt's keys into sources: sentences, paragraphs (split on blank lines) or a JSONL file of passages (FILE, or FILE:FIELD; field text by default). Implies --keep sources unless --keep is given; per source, the sum of its keys' attribution over layers, heads and the query rows after the last passage. Given none of --steps, --rule, --tol, the integral is the {SOURCES_RULE} rule with {SOURCES_STEPS} nodes (alpha = 1/2 and 1), fast at long lengths (170 CPU s at 1,063 tokens on one thread): on the 9 runs measured its top source was leave-one-out's and its top 3 removed 86-114 % of what leave-one-out's top 3 did (docs/long-context.md, \"The default for --sources\"); --tol 0.1 for the error-controlled run."),
    memory: Optional[str] = typer.Option(None, "--memory", help="Peak memory the run may use, e.g. 4GB (default: 0.8 of the memory available now). A run estimated above it is refused, naming the --keep that fits."),
    threads: Optional[int] = options.threads(),
    target_token: Optional[str] = typer.Option(None, "--target-token", help="With --lm: attribute the probability of this next token (one token; default: the predicted one)."),
    continuation: Optional[str] = typer.Option(None, "--continuation", help="With --lm: attribute the joint probability of this text right after the prompt."),
    position: Optional[int] = typer.Option(None, "--position", help="With --lm --target-token: the prompt position whose next token is the target (default: the last, -1)."),
    logprob: bool = typer.Option(False, "--logprob", help="Attribute the log-probability instead of the probability."),
    foil: Optional[str] = typer.Option(None, "--foil", help="Contrastive target: attribute the target's output minus this one's (with --lm a token, e.g. ' London'; else a class name or index). With --logprob: log p(target) - log p(foil)."),
    metric: Optional[str] = typer.Option(None, "--metric", help="With --lm and a --data JSONL of pairs (prompt, counterfactual, answer, foil; `attattr demo data --task ioi`): what each pair attributes with its own answer and foil: logit-diff (the default), logprob-diff, prob."),
    generate: Optional[int] = typer.Option(None, "--generate", help="With --lm: generate N tokens after each prompt (greedy; --sample: sampled with --seed) and attribute every generated token given everything before it."),
    per_step: bool = typer.Option(False, "--per-step", help="With --lm --continuation: attribute every token of the continuation given everything before it (instead of their joint probability)."),
    sample: bool = typer.Option(False, "--sample", help="With --generate: sample the tokens (seeded by --seed) instead of greedy decoding."),
    quiet: bool = options.quiet(),
    keep_shards: bool = typer.Option(False, "--keep-shards", help="Under torchrun: keep each process's shard (OUT.rankK-of-N.h5) after merging them into --out."),
    dist_timeout: float = typer.Option(3600, "--dist-timeout", help="Under torchrun: seconds a process waits for the others (to start, or to finish their share) before giving up."),
) -> None:
    """Score attention attribution (Hao et al. 2021) for every layer and head into an HDF5 store.

    With no --model and no --data it runs on the built-in default: a synthetic MNLI-like task
    whose label is decided by a planted token pair, and a small BERT trained on it.
    Encoder-decoder classifiers (BART) are scored per attention family (encoder, decoder,
    cross); with --lm a causal language model is scored for a next token or a continuation.
    Prints the store's path on stdout.

    Under torchrun (`torchrun --nproc-per-node N -m attattr_cli score ...`) each process
    scores a share of the examples, balanced by token count, into its own shard beside
    --out, and rank 0 merges the shards into --out.
    """
    with edge():
        from ..api import score as run
        from ..api.groups import Compute, Hooks, Integration, Target
        from ..api.scoring import cli_words

        if logit and logprob:
            raise OptionError("give --logit or --logprob, not both")
        if prompt_file is not None:
            if prompt:
                raise OptionError("give --prompt or --prompt-file, not both")
            prompt = [read_prompt_file(prompt_file)]
        t0 = time.perf_counter()
        with progress_bar("score", quiet) as bar, cli_words():
            report = run(
                model, data=data, task=task, examples=examples, prompts=prompt or None, lm=lm, out=out_path,
                layers=parse_int_list(layers, "--layers"),
                family=[f.strip() for f in family.split(",") if f.strip()] if family else None,
                keep=keep, top_k=top_k, sources=sources, seed=seed, progress=None if quiet else bar,
                command=command_line(),
                target=Target(target=target, output="logit" if logit else ("logprob" if logprob else "prob"),
                              foil=foil, target_token=target_token, continuation=continuation, position=position,
                              metric=metric, generate=generate, per_step=per_step, sample=sample),
                integration=Integration(steps=steps, rule=rule, tol=tol, max_nodes=max_nodes),
                compute=Compute(device=device, dtype=dtype, kernel=kernel, store_dtype=store_dtype, truncate=truncate,
                                steps_per_pass=options.pick(step_batch, step_batch_old), group=group, memory=memory,
                                threads=threads, keep_shards=keep_shards, dist_timeout=dist_timeout),
                hooks=Hooks(warn=_warn,
                            notify=None if quiet else (lambda line: err.print(line, markup=False))))
        if hasattr(report, "world_size"):  # under torchrun: this process's share; rank 0 reports the merge
            _report_distributed(report, quiet)
            return
        secs = time.perf_counter() - t0
        for note in report.notes:
            err.print(note, markup=False)
        if report.nonfinite:
            they_are, them = ("they are", "them") if report.nonfinite != 1 else ("it is", "it")
            _warn(f"{_count(report.nonfinite, 'example')} gave NaN or infinite values (with --dtype float16, an"
                  f" overflow?): {they_are} flagged 'nonfinite' in the store, and every analysis skips {them}")
        if not quiet:
            residual = report.mean_abs_residual
            err.print(f"scored {_count(report.scored, 'example')} ({report.skipped} already in the store) in {secs:.1f}"
                      f" s with kernel '{report.kernel}'"
                      + ("" if report.accuracy is None else f"; accuracy {report.accuracy:.3f}")
                      + ("" if residual is None else f"; mean |completeness residual| {residual:.2e}"), markup=False)
        out.print(report.out, markup=False)


def _count(n: int, noun: str) -> str:
    """'1 example', '2 examples'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _warn(message: str) -> None:
    """A warning on stderr; under torchrun it says which rank's."""
    import os

    if os.environ.get("WORLD_SIZE", "1") not in ("", "1") and "RANK" in os.environ:
        message = f"rank {int(os.environ['RANK'])}: {message}"
    err.print(f"Warning: {message}", markup=False)


def _report_distributed(report, quiet: bool) -> None:
    """One torchrun process's end: rank 0 says what every rank scored and what the merge did."""
    if report.rank != 0:
        return
    loads = ", ".join(str(t) for t in report.tokens_per_rank)
    merged = report.merged or {"added": 0, "skipped": 0}
    err.print(
        f"scored {_count(report.scored, 'example')} on {report.world_size} processes ({report.skipped} already in the"
        f" shards, {report.already} already in {report.out}) in {report.seconds:.1f} s with kernel '{report.own.kernel}';"
        f" tokens per process {loads} (imbalance {report.imbalance:.4f}); merged {merged['added']} into {report.out}"
        + ("; shards deleted" if report.shards_deleted else "; shards kept" if report.complete else ""),
        markup=False,
    )
    if report.shards_elsewhere:
        n = len(report.shards_elsewhere)
        them = "them" if n != 1 else "it"
        err.print(f"{n} shard{'s are' if n != 1 else ' is'} not on this machine ({' '.join(report.shards_elsewhere)}:"
                  f" other machines wrote {them} to their own disks): copy {them} here and run: attattr merge"
                  f" {' '.join(report.shard_names)} --out {report.out}", markup=False)
    out.print(report.out, markup=False)
