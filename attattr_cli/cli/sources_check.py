"""`attattr sources-check`: are a long context's source scores right? Source removal against
leave-one-out, attention and input x gradient on the user's own prompt (docs/long-context.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import OptionError
from . import options
from .common import edge, err, out, parse_int_list, progress_bar, read_prompt_file, renamed_options

METHODS_HELP = "attattr, attention, input_x_gradient, loo"


def table(check) -> str:
    """The plain table: one row per method, the drop of log p(answer) at each k, its share of
    leave-one-out's, and Kendall's tau-b with leave-one-out."""
    rows = check.method_rows()
    ks = sorted({k for d in check.drops.values() for k in d})
    head = ["method"] + [f"drop top-{k}" for k in ks] + [f"of LOO top-{k}" for k in ks] + ["tau LOO"]

    def num(v, fmt, unit=""):
        return "-" if v is None or v != v else format(v, fmt) + unit

    body = [[r["method"]] + [num(r.get(f"drop_k{k}"), ".3f") for k in ks]
            + [num(None if r.get(f"of_loo_k{k}") is None else 100 * r[f"of_loo_k{k}"], ".0f", " %") for k in ks]
            + [num(r.get("tau_loo"), "+.2f")] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in [head] + body]
    return "\n".join(lines)


def sources_check(
    model: Optional[str] = options.model("Local model folder or hub id of a causal language model."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="The prompt: passages separated by blank lines, then the question (or give --prompt-file)."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="A text file whose whole text is the prompt."),
    continuation: str = typer.Option(..., "--continuation", help="The answer whose joint log-probability the sources are checked for, e.g. ' Ana Ruiz'."),
    sources: str = typer.Option("paragraphs", "--sources", help="The sources: paragraphs (the default), sentences or a JSONL file of passages (FILE or FILE:FIELD); passages only, the template and the question are not sources."),
    ks: str = typer.Option("1,3,5", "--ks", help="How many top sources each method removes, e.g. 1,3,5 (the default)."),
    methods: Optional[str] = typer.Option(None, "--methods", help=f"Comma-separated methods (default all: {METHODS_HELP})."),
    steps: Optional[int] = typer.Option(None, "--steps", help="attattr's integration: a fixed rule of this many steps instead of --tol."),
    rule: Optional[str] = typer.Option(None, "--rule", help="attattr's integration: a fixed quadrature rule instead of --tol."),
    tol: Optional[float] = typer.Option(None, "--tol", help="attattr's integration: error-controlled to this tolerance (without it, --steps or --rule: score's default for --sources, the right rule with 2 nodes)."),
    memory: Optional[str] = typer.Option(None, "--memory", help="Peak memory attattr's scoring may use, e.g. 4GB."),
    threads: Optional[int] = options.threads(),
    device: str = options.device(),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw the drops (.png, .svg or .pdf)."),
    as_json: bool = options.as_json("Print the check as JSON on stdout (sources with every method's score, one row per method and k, tau) instead of the table."),
    quiet: bool = options.quiet(),
) -> None:
    """Check a long context's source scores by removing them: each method (attattr, raw attention, input x gradient, leave-one-out) ranks the prompt's sources for the answer's joint log-probability, its top-k sources are removed together, and the drop of log p(answer) is reported beside leave-one-out's, with Kendall's tau-b against leave-one-out.

    Prints a plain table on stdout (one row per method), or the whole check as JSON with --json.
    """
    with edge():
        from ..api import source_removal

        if (prompt is None) == (prompt_file is None):
            raise OptionError("give the prompt: --prompt or --prompt-file (one of them)")
        if prompt_file is not None:
            prompt = read_prompt_file(prompt_file)
        if plot is not None and plot.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise OptionError(f"cannot tell the format of {plot}: use one of .png, .svg, .pdf")
        k_list = parse_int_list(ks, "--ks")
        if not k_list:
            raise OptionError(f"--ks must list whole numbers of at least 1, got {ks!r}")
        with progress_bar("sources-check", quiet) as bar, renamed_options("methods", "ks", "memory", "threads"):
            check = source_removal(model, prompt, continuation, sources=sources, ks=k_list,
                                   methods=[m.strip() for m in methods.split(",") if m.strip()] if methods else None,
                                   steps=steps, rule=rule, tol=tol, threads=threads, memory=memory, device=device,
                                   progress=None if quiet else bar)
        if plot is not None:
            check.plot(plot)
        if as_json:
            from ..api.inputs import strict_dumps

            out.file.write(strict_dumps(check.to_dict(), indent=2, ensure_ascii=False) + "\n")
            return
        out.print(table(check), markup=False, soft_wrap=True)
        if not quiet:
            err.print(f"{len(check.sources)} sources, log p(answer) {check.f_full:.4g}, {check.forwards} forwards",
                      markup=False)
