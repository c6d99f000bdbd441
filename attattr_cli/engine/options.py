"""What defines a scoring run: :class:`ScoreOptions` and the accepted values of its fields.

Imports neither torch nor transformers (the dtypes are looked up when validating).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import OptionError
from ..names import api_names, cli_words, flag  # noqa: F401  (api_names, cli_words: each caller's words)

OUTPUTS = ("prob", "logit", "logprob")
# what is attributed for clean / counterfactual pairs (data/pairs.py), per example its own answer and foil
# (engine/metrics.py computes them): the logit difference answer - foil, the log-probability difference, p(answer)
METRICS = ("logit-diff", "logprob-diff", "prob")
DTYPES = ("float32", "float64", "bfloat16", "float16")  # compute dtypes (models/loading.py maps them to torch's)
KEEPS = ("auto", "maps", "sum", "none", "sources")
AUTO_MAPS_UP_TO = 512  # --keep auto keeps per-head maps up to this many tokens
MAX_NODES = 129  # default node cap of the error-controlled integration (Clenshaw-Curtis with 128 intervals)
# `attattr score` and api.score() given none of --steps, --rule, --tol integrate to this tolerance
# (docs/integration.md "Which to pick"); --steps or --rule alone: that fixed rule
DEFAULT_TOL = 1e-1
PAPER_STEPS, PAPER_RULE = 20, "right"  # the paper's setting: a fixed rule's defaults
# ... except with --sources (a long context ranked per passage): given none of them, the right rule with
# two nodes (alpha = 1/2 and 1), chosen on bench/bench_sources_heldout.py (docs/long-context.md "The
# default for --sources"); --tol for the error-controlled run
SOURCES_STEPS, SOURCES_RULE = 2, "right"
# the quadrature rules engine/integrate.py implements (named here, where `attattr --help` reads them without torch)
RULES = {
    "right": "right Riemann sum, alpha = k/m for k = 1..m (the paper)",
    "left": "left Riemann sum, alpha = k/m for k = 0..m-1 (the 2021 reference code)",
    "midpoint": "midpoint rule, alpha = (k - 1/2)/m",
    "gauss": "Gauss-Legendre quadrature with m nodes (exact for polynomials of degree 2m-1)",
    "clenshaw-curtis": "Clenshaw-Curtis quadrature with m nodes, alpha = (1 - cos(pi k/(m-1)))/2 (both ends included)",
}


def integration(steps: int | None, rule: str | None, tol: float | None, sources: str | None = None) -> dict:
    """The ScoreOptions fields ``steps``, ``rule``, ``tol`` from what a user gave (None: not
    given): nothing -> ``tol`` DEFAULT_TOL, or with ``sources`` the fixed rule SOURCES_RULE
    with SOURCES_STEPS nodes; ``steps`` and/or ``rule`` -> that fixed rule (the paper's right
    rule, 20 steps, for what is left out); ``tol`` -> as given, with no steps (it places its
    own nodes). ``tol`` with ``steps`` or ``rule`` is an OptionError: the one place this is
    checked and the defaults are chosen, for the CLI and the API."""
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float))):
        raise OptionError(f"--tol must be a number, got {tol!r}")
    if tol is not None and not (math.isfinite(tol) and tol > 0):
        raise OptionError(f"--tol must be a finite number > 0, got {tol}")
    if tol is not None and (steps is not None or rule is not None):
        given = " and ".join(f"--{name} {value}" for name, value in (("steps", steps), ("rule", rule)) if value is not None)
        raise OptionError(f"--tol places its own nodes; it does not go with {given} (give either --tol or a fixed rule)")
    if steps is None and rule is None and tol is None:
        if sources is not None:
            return {"steps": SOURCES_STEPS, "rule": SOURCES_RULE, "tol": None}
        tol = DEFAULT_TOL
    if tol is not None:
        return {"steps": None, "rule": "clenshaw-curtis", "tol": tol}
    return {"steps": PAPER_STEPS if steps is None else steps, "rule": rule or PAPER_RULE, "tol": None}


@dataclass
class ScoreOptions:
    """What defines a run's numbers (everything but ``step_batch``, ``kernel`` and ``group`` changes them).
    Its own defaults are the paper's fixed rule; the CLI and the API resolve theirs with
    :func:`integration` (the error-controlled rule when none is chosen)."""

    steps: int | None = None  # a fixed rule's nodes (None: PAPER_STEPS; with tol: none, it places its own)
    rule: str = PAPER_RULE
    target: str = "predicted"  # predicted | gold | a label name | a label index
    output: str = "prob"  # prob | logit
    layers: list[int] | None = None  # None: all layers
    dtype: str = "float32"
    truncate: bool = False
    step_batch: int | None = None  # steps per forward/backward; None: fit to memory
    # short examples of encoder classifiers scored together, their nodes sharing passes
    # (engine/grouped.py); None: 32 where the model allows it; 1: one example at a time
    group: int | None = None
    kernel: str = "auto"
    # attention families to score (None: all; "self" for encoder-only/decoder-only models)
    family: list[str] | None = None
    # what is kept per layer: maps (per-head [head, q, k]), sum (head sum [q, k] and per-head
    # max), none (only the per-head max and top-k); auto: maps up to 512 tokens, else sum
    keep: str = "auto"
    top_k: int | None = None  # also keep the k strongest entries (|value|) of each head
    # language-model targets (a causal LM loaded with lm=True)
    lm: bool = False
    target_token: str | None = None  # the next token whose probability is attributed
    continuation: str | None = None  # several tokens after the prompt: F is their joint (log-)probability
    position: int | None = None  # position whose next-token distribution holds the target (default: last)
    # contrastive target: F = out(target) - out(foil), a token (--lm) or a class (engine/scorer.py)
    foil: str | None = None
    # a generation attributed step by step (engine/generation.py): `generate` new tokens (greedy,
    # or sampled with `sample_seed`), or `continuation` with per_step; F_t is step t's token
    generate: int | None = None
    per_step: bool = False
    sample_seed: int | None = None
    # error-controlled integration to tol, at most max_nodes nodes per example and layer (engine/adaptive.py)
    tol: float | None = None
    max_nodes: int = MAX_NODES
    # pairs (data/pairs.py): each example's own answer and foil, F = this metric of them (METRICS);
    # the tokens are part of each example's record (and of the data's digest), not of the options,
    # so that the examples of one pairs file share one store
    metric: str | None = None
    # sources (data/sources.py): sentences, paragraphs or a JSONL file of passages; the prompt's
    # keys grouped into them (recorded per example); with keep auto, keep becomes "sources"
    sources: str | None = None
    # what a run may use (engine/budget.py): bytes of peak memory (None: a fraction of the free
    # memory), and the threads torch runs on (None: chosen for the work, engine/threads.py);
    # neither changes the numbers
    memory: int | None = None
    threads: int | None = None

    # fields added after store schema 1.0; left out of the fingerprint at their defaults so
    # that stores written before them still resume
    _LATER = {"family": None, "keep": "auto", "top_k": None, "lm": False, "target_token": None,
              "continuation": None, "position": None, "tol": None, "max_nodes": MAX_NODES,
              "foil": None, "generate": None, "per_step": False, "sample_seed": None, "metric": None,
              "sources": None}

    def __post_init__(self):
        if self.tol is not None and self.rule == "right":  # the default rule: tol picks its own nodes
            self.rule = "clenshaw-curtis"
        if self.tol is None and self.steps is None:
            self.steps = PAPER_STEPS
        if self.sources is not None and self.keep == "auto":
            self.keep = "sources"

    def check(self) -> None:
        """Every check that needs no model (types, names, ranges, combinations): OptionError
        naming the option. The one validator of the CLI and the API, run before torch loads."""
        for name in ("steps", "group", "step_batch", "top_k", "max_nodes", "position", "generate", "sample_seed",
                     "memory", "threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise OptionError(f"--{_flag(name)} must be a whole number, got {value!r}")
        if self.tol is not None and (isinstance(self.tol, bool) or not isinstance(self.tol, (int, float))):
            raise OptionError(f"--tol must be a number, got {self.tol!r}")
        for name in ("rule", "output", "dtype", "keep", "target", "kernel"):
            if not isinstance(getattr(self, name), str):
                raise OptionError(f"--{_flag(name)} must be a string, got {getattr(self, name)!r}")
        if self.layers is not None and (isinstance(self.layers, (str, bytes)) or
                                        not all(isinstance(x, int) and not isinstance(x, bool) for x in self.layers)):
            raise OptionError(f"--layers must be layer indices (a list of whole numbers), got {self.layers!r}")
        if self.family is not None and (isinstance(self.family, (str, bytes)) or
                                        not all(isinstance(x, str) for x in self.family)):
            raise OptionError(f"--family must be a list of family names, got {self.family!r}")
        if self.dtype not in DTYPES:
            raise OptionError(f"unknown dtype '{self.dtype}'; available: {', '.join(DTYPES)}")
        self._check_values()

    def validate(self, num_layers: int) -> list[int]:
        """Check the options against a model of ``num_layers`` layers; the chosen layers, sorted."""
        from ..models.loading import resolve_dtype

        self.check()
        resolve_dtype(self.dtype)
        layers = list(range(num_layers)) if self.layers is None else list(self.layers)
        for layer in layers:
            if not -num_layers <= layer < num_layers:
                raise OptionError(f"layer {layer} does not exist: the model has {num_layers} layers (0..{num_layers - 1})")
        layers = sorted({layer % num_layers for layer in layers})
        return layers

    def _check_values(self) -> None:
        if self.rule not in RULES:
            raise OptionError(f"unknown rule '{self.rule}'; available: {', '.join(RULES)}")
        if self.output not in OUTPUTS:
            raise OptionError(f"unknown output '{self.output}'; available: {', '.join(OUTPUTS)}")
        if self.steps is not None and self.steps < 1:
            raise OptionError(f"--steps must be at least 1, got {self.steps}")
        if self.group is not None and self.group < 1:
            raise OptionError(f"--group must be at least 1, got {self.group}")
        if self.step_batch is not None and self.step_batch < 1:
            raise OptionError(f"{flag('step_batch')} must be at least 1, got {self.step_batch}")
        if self.keep not in KEEPS:
            raise OptionError(f"unknown --keep '{self.keep}'; available: {', '.join(KEEPS)}")
        if self.top_k is not None and self.top_k < 1:
            raise OptionError(f"--top-k must be at least 1, got {self.top_k}")
        from .threads import check as check_threads

        check_threads(self.threads)
        if self.memory is not None and self.memory < 1:
            raise OptionError(f"--memory must be a positive size, got {self.memory}")
        from ..data.sources import check_spec

        check_spec(self.sources)
        if self.sources is not None and not self.lm:
            raise OptionError("--sources groups a language model's prompt: it needs --lm")
        if not self.lm and (self.target_token is not None or self.continuation is not None or self.position is not None):
            raise OptionError("--target-token, --continuation and --position need --lm (a causal language model)")
        if self.target_token is not None and self.continuation is not None:
            raise OptionError("give either --target-token or --continuation, not both")
        if self.continuation is not None and self.position is not None:
            raise OptionError("--continuation is scored right after the prompt; --position goes with --target-token")
        if self.foil is not None and (not isinstance(self.foil, str) or self.foil == ""):
            raise OptionError(f"--foil must be a token (with --lm) or a class name or index, got {self.foil!r}")
        self._check_generation()
        self._check_metric()
        if self.tol is not None and not (math.isfinite(self.tol) and self.tol > 0):
            raise OptionError(f"--tol must be a finite number > 0, got {self.tol}")
        if self.tol is not None and (self.rule != "clenshaw-curtis" or self.steps is not None):
            raise OptionError("--tol places its own nodes; it does not go with --steps or --rule")
        if self.max_nodes < 5:
            raise OptionError(f"--max-nodes must be at least 5 (the first interval's nodes), got {self.max_nodes}")

    def _check_generation(self) -> None:
        """--generate / --per-step: language models only, one way to give the tokens."""
        if self.generate is not None and self.generate < 1:
            raise OptionError(f"--generate must be at least 1, got {self.generate}")
        if (self.generate is not None or self.per_step) and not self.lm:
            raise OptionError("--generate and --per-step need --lm (a causal language model)")
        if self.generate is not None and (self.continuation is not None or self.target_token is not None):
            raise OptionError("--generate makes its own tokens; it does not go with --continuation or --target-token")
        if self.per_step and self.continuation is None:
            raise OptionError("--per-step goes with --continuation TEXT (or use --generate N)")
        if (self.generate is not None or self.per_step) and self.position is not None:
            raise OptionError("a generation is scored right after the prompt; --position goes with --target-token")
        if self.sample_seed is not None and self.generate is None:
            raise OptionError("--sample (sampling with --seed) goes with --generate")
        if self.foil is not None and self.continuation is not None and not self.per_step:
            raise OptionError("--foil contrasts one token: give --target-token, or --continuation with --per-step")

    def _check_metric(self) -> None:
        """--metric: pairs of a causal language model, each with its own answer and foil."""
        if self.metric is None:
            return
        if not isinstance(self.metric, str) or self.metric not in METRICS:
            raise OptionError(f"unknown --metric {self.metric!r}; available: {', '.join(METRICS)}")
        if not self.lm:
            raise OptionError("--metric scores clean / counterfactual pairs of a causal language model: it needs --lm")
        given = [flag(n) for n in ("target_token", "continuation", "position", "foil", "generate")
                 if getattr(self, n) is not None] + ([flag("per_step")] if self.per_step else [])
        if given:
            raise OptionError(f"--metric takes each pair's own answer and foil; it does not go with {', '.join(given)}")
        if self.output != "prob":
            raise OptionError("--metric says what is attributed; it does not go with --logit or --logprob")

    @property
    def stepwise(self) -> bool:
        """A generation attributed step by step (--generate, or --continuation --per-step)."""
        return self.generate is not None or bool(self.per_step)

    def fingerprint(self, num_layers: int) -> dict:
        """The options that must agree for two runs to share a store."""
        d = asdict(self)
        for key in ("step_batch", "kernel", "group", "memory", "threads"):  # they do not change the numbers
            d.pop(key)
        for key, default in self._LATER.items():
            if d.get(key) == default:
                d.pop(key)
        d["layers"] = self.validate(num_layers)
        return d


def _flag(name: str) -> str:
    return flag(name)[2:]


def precheck(options: ScoreOptions, examples: str | None = None, data: str | None = None) -> None:
    """What a scoring run can refuse before torch, transformers or the model load: the options
    (:meth:`ScoreOptions.check`), the syntax of the example selection, and that the data file
    exists. The CLI and the API both call it first."""
    from pathlib import Path

    from ..data.select import check_spec
    from ..errors import DataError

    options.check()
    check_spec(examples)
    if data is not None:
        if not isinstance(data, (str, Path)):
            raise OptionError(f"--data must be a file path, got {data!r}")
        if not Path(data).exists():
            raise DataError(f"{data}: no such file")
        if Path(data).is_dir():
            raise DataError(f"{data} is a folder; give a TSV, CSV or JSONL file")
