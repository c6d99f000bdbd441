"""``faithfulness``, ``finetune``, ``merge`` and ``import_2021``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from ..errors import OptionError
from .checks import Bool, OneOf, Tolerance, Examples, File, Files, Int, Ints, Names, Number, Out, Progress, Str, Texts, Threads, checked
from .groups import Adversarial, Compute, Group, Integration, Target, legacy_table, regroup
from ..engine.threads import on_threads
from ..fileio import write_atomic
from .inputs import check_methods_given, check_outputs, command_of, default_task, model_arg, selection
from .model import Model, ModelArg, as_model, progress_for, using
from .results import TemporaryStore
from .scoring import TARGET, score
from .tables import Table, saved

# the registry's names (it imports NumPy only): the CLI's --methods help reads them
from ..analysis.methods import DEFAULT as FAITHFULNESS_DEFAULT, NAMES as FAITHFULNESS_METHODS  # noqa: F401


# ----------------------------------------------------------------------------- faithfulness


@dataclass
class FaithfulnessResult(Table):
    """The faithfulness report: ``report`` (per method: Kendall tau with leave-one-out and with
    gradients, AOPC comprehensiveness and sufficiency, deletion AUC; per example; the
    permutation test), ``rows`` one flat row per method, ``store`` where token importance is kept
    (None when it was kept nowhere: the store read is never changed unless asked).
    ``to_pandas()``: one row per method, the columns of :attr:`rows` (what ``--csv`` prints)."""

    JSON = {"indent": 1}
    report: dict
    store: str

    @property
    def methods(self) -> dict:
        """Per method its summary numbers."""
        return self.report["methods"]

    @property
    def rows(self) -> list[dict]:
        """One flat row per method (the CSV)."""
        from ..analysis.faithfulness import report_rows

        return report_rows(self.report)

    def _rows(self) -> list[dict]:
        return self.rows

    def to_dict(self) -> dict:
        """The JSON report."""
        return self.report

    def to_csv(self) -> str:
        """One CSV row per method (``section`` methods) and, with the adversarial experiment,
        one per epsilon (``section`` adversarial): what `faithfulness --csv` prints."""
        import csv
        import io

        from ..analysis.faithfulness import adversarial_rows

        rows = [{"section": "methods", **r} for r in self.rows]
        rows += [{"section": "adversarial", **r} for r in adversarial_rows(self.report)]
        fields = list(dict.fromkeys(k for r in rows for k in r))
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=fields, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})
        return buf.getvalue()

    @checked(path=Out())
    def plot(self, path=None):
        """Deletion curves and taus (and the adversarial panel): a matplotlib ``Figure``, also
        written to ``path`` (.png, .svg, .pdf; whole or not at all) when given."""
        from ..analysis.faithfulness import report_figure

        return saved(report_figure(self.report), path)

    def _repr_html_(self) -> str:
        from ..views.notebook import table_html

        cols = ["method", "tau_loo", "tau_grad", "aopc_comprehensiveness", "aopc_sufficiency", "deletion_auc",
                "mask_aopc", "examples"]
        return table_html([[r.get(c) for c in cols] for r in self.rows], cols, title=repr(self))

    def __repr__(self) -> str:
        ms = self.report.get("methods", {})
        best = max(ms, key=lambda m: ms[m].get("comprehensiveness") or float("-inf"), default=None)
        return (f"FaithfulnessResult({self.report.get('examples')} examples, {len(ms)} methods: "
                + ", ".join(list(ms)[:8]) + (" …" if len(ms) > 8 else "")
                + (f"; highest AOPC comprehensiveness: {best}" if best else "")
                + (f"; store {self.store!r}" if self.store else "") + ")")


FAITHFULNESS_GROUPS = {"target": Target, "integration": Integration, "compute": Compute, "adversarial": Adversarial}
# faithfulness's old flat keywords (its fields of the groups), kept for one release
FAITHFULNESS_LEGACY = legacy_table({k: v for k, v in FAITHFULNESS_GROUPS.items() if k != "adversarial"},
                                   {"epsilons": ("adversarial", "epsilons"), "adversarial_layer": ("adversarial", "layer")},
                                   only={"target": ("output",), "integration": ("steps", "rule", "tol"),
                                         "compute": ("device", "truncate", "threads")})
# what faithfulness does with the groups: the fields it reads itself; the rest go to score when it scores
_OWN = {"target": ("target", "output"), "compute": ("device", "truncate", "threads")}


@checked(store=File(), model=ModelArg(), data=File(), task=Str(), examples=Examples(), methods=Names(),
         score_store=Out(), importance_store=Out(), permutations=Int(min=0), perm_layers=Ints(),
         adversarial=OneOf(Bool(), Group(Adversarial), what="True, False or an aa.Adversarial"), out=Out(),
         progress=Progress(), command=Texts(), target=TARGET, integration=Group(Integration), compute=Group(Compute))
def faithfulness(store=None, *, model=None, data=None, task=None, examples=None, methods=None, score_store=None,
                 importance_store=None, erase: str = "remove", permutations: int = 20, perm_layers=None, seed: int = 0,
                 aggregate: str | None = None, adversarial=False, target=None, integration=None, compute=None, out=None,
                 progress=False, command=None, **legacy) -> FaithfulnessResult:
    """Faithfulness of token importance methods, side by side (docs/api.md, "Faithfulness and
    fine-tuning"), over the examples of ``store`` (a path, only read); or, with no store, after
    scoring model and data into ``score_store`` (default: ``out`` with .h5, or a temporary file) as
    :func:`score` scores with ``target`` (its ``target`` and ``output``), ``integration`` and
    ``compute``. ``importance_store`` (a path) keeps the token importance computed for the next run.
    ``methods``: names from ``attattr_cli.analysis.methods``, or ``"all"``. ``adversarial=True`` (or an
    :class:`Adversarial`) adds the adversarial-attention experiment; ``aggregate="words"`` ranks and
    erases whole words. ``out``: write the JSON report. The old flat keywords still work for one
    release, with a FutureWarning. Returns :class:`FaithfulnessResult`; a ``compute`` field other
    than ``device``, ``truncate`` and ``threads`` with a store is an OptionError."""
    g = regroup("faithfulness", {"target": target, "integration": integration, "compute": compute,
                                 "adversarial": adversarial}, legacy, FAITHFULNESS_LEGACY, FAITHFULNESS_GROUPS,
                shorthand={"target": lambda text: Target(target=text)})
    _only_own(g["target"], "target", "faithfulness attributes the target class and its output")
    if store is not None:
        _only_own(g["compute"], "compute", "with a store nothing is scored")
    return _faithfulness(store, model=model, data=data, task=task, examples=examples, methods=methods,
                         score_store=score_store, importance_store=importance_store, erase=erase,
                         permutations=permutations, perm_layers=perm_layers, seed=seed, aggregate=aggregate,
                         adversarial=None if adversarial is False else g["adversarial"], target=g["target"],
                         integration=g["integration"], compute=g["compute"], threads=g["compute"].threads, out=out,
                         progress=progress, command=command)


def _only_own(group, arg: str, why: str) -> None:
    """The fields of ``group`` faithfulness does not read must be at their defaults."""
    from dataclasses import fields

    other = [f.name for f in fields(group) if f.name not in _OWN[arg] and getattr(group, f.name) != f.default]
    if other:
        raise OptionError(f"{arg}={type(group).__name__}({other[0]}=...): {why}; faithfulness takes"
                          f" {' and '.join(_OWN[arg])} of it")


@on_threads
def _faithfulness(store, *, model, data, task, examples, methods, score_store, importance_store, erase, permutations,
                  perm_layers, seed, aggregate, adversarial, target, integration, compute, threads, out, progress,
                  command) -> FaithfulnessResult:
    """faithfulness's run, its options checked and its groups resolved (``adversarial`` an
    :class:`Adversarial` or None; ``threads`` is ``compute.threads``, for :func:`on_threads`)."""
    import time
    from contextlib import nullcontext

    started = time.perf_counter()
    from ..analysis.aggregate import words_asked
    from ..analysis.faithfulness import FaithfulnessOptions, evaluate_store
    from ..analysis.token_importance import ATTRIBUTION_METHODS, ERASE_MODES, METHODS, check_methods

    check_methods_given(methods)
    if any(v is not None for v in (integration.steps, integration.rule, integration.tol)):  # before anything loads
        from ..engine.options import api_names
        from ..engine.options import integration as resolve_integration

        with api_names():
            resolve_integration(integration.steps, integration.rule, integration.tol)
    if isinstance(methods, str):
        methods = methods.split(",")
    chosen = check_methods(list(methods or METHODS))
    if erase not in ERASE_MODES:
        raise OptionError(f"unknown erase '{erase}'; available: {', '.join(ERASE_MODES)}")
    words_asked(aggregate)
    if store is not None and (data is not None or task is not None):
        raise OptionError("give either a store or model/data/task, not both")
    check_outputs({"out": out}, [store, model, data, score_store, importance_store])
    if importance_store is not None and store is None:
        raise OptionError("importance_store goes with a store; scoring first, token importance is kept in score_store")
    scored_into = Path(score_store) if score_store is not None else out and Path(out).with_suffix(".h5")
    if store is None and out is not None and scored_into.resolve() == Path(out).resolve():
        raise OptionError(f"score_store and out are the same file ({out}): give the report a .json name")
    tmp = TemporaryStore("attattr-faithfulness-") if store is None and scored_into is None else None
    try:
        loaded_model = None if model is None or isinstance(model, (str, Path)) else as_model(model)
        if store is None:
            store = scored_into or tmp.path
            need_attr = any(m in ATTRIBUTION_METHODS or m == "all" for m in chosen)
            loaded_model = loaded_model or as_model(model, device=compute.device)
            score(loaded_model, data=data, task=task, examples=examples, out=store, target=target,
                  integration=integration, compute=replace(compute, threads=None), layers=None if need_attr else [],
                  progress=progress, command=command)  # threads: on_threads gives this call's to every scoring
            from ..data import parse_examples
            from ..engine.run import resolve_inputs

            mid, names = model_arg(loaded_model)
            _, _, rows, _ = resolve_inputs(mid, data, default_task(mid, data, task, None), names)
            select = [rows[i].index for i in parse_examples(selection(examples), len(rows))]
            keep_in = store  # where the token importance computed is kept: the store scored into
        else:
            select = examples
            keep_in = _importance_store(store, importance_store)  # or the importance_store asked for (None: nowhere)
            store = keep_in or store
        fopts = FaithfulnessOptions(methods=chosen, examples=select, permutations=permutations,
                                    perm_layers=None if perm_layers is None else list(perm_layers), erase=erase,
                                    seed=seed, aggregate=None if aggregate == "tokens" else aggregate)
        if adversarial is not None:
            from ..analysis.adversarial import EPSILONS, AdversarialOptions

            fopts.adversarial = AdversarialOptions(epsilons=tuple(float(e) for e in (adversarial.epsilons or EPSILONS)),
                                                   layer=int(adversarial.layer), seed=seed)
        with (nullcontext() if loaded_model is None else using(loaded_model) as used,
              progress_for(progress, "faithfulness") as bar):
            report = evaluate_store(store, fopts, model=str(model) if isinstance(model, (str, Path)) else None,
                                    device=compute.device, loaded=None if used is None else used.loaded, progress=bar,
                                    keep=keep_in is not None)
        report["command"] = command_of(command)
        res = FaithfulnessResult(report, None if tmp is not None or keep_in is None else str(keep_in))
    finally:
        if tmp is not None:
            tmp.remove()
    res.report["seconds"] = round(time.perf_counter() - started, 2)
    if out is not None:
        write_atomic(Path(out), (res.to_json() + "\n").encode())
    return res


def _importance_store(store, importance_store):
    """Where ``faithfulness`` reads a given store's examples: the store itself (opened
    read-only, nothing kept) without ``importance_store``; else the importance store (the
    store itself when it names it, or a copy of it made on first use: a store of the same run
    holding every example of ``store``). None when nothing is to be kept."""
    from ..errors import StoreError
    from ..fileio import replaced, same_file
    from ..store import Store

    if importance_store is None:
        return None
    if not isinstance(importance_store, (str, Path)):
        raise OptionError("importance_store must be a path")
    keep = Path(importance_store)
    if same_file(keep, store):
        return keep
    if keep.exists():
        with Store(store) as a, Store(keep) as b:
            if a.fingerprint != b.fingerprint:
                raise StoreError(f"{keep} is not a copy of {store} (it was made by another run): give a new path"
                                 " for importance_store, or the store itself")
        return keep
    import shutil

    with Store(store):  # a readable store, before it is copied
        pass
    with replaced(keep, suffix=".h5", make_parents=False) as tmp:
        shutil.copyfile(store, tmp)
    return keep


# ----------------------------------------------------------------------------- finetune, merge, import


@checked(model=ModelArg(), out=Out(folder=True), data=File(), task=Str(), examples=Examples(), eval_data=File(),
         max_examples=Int(min=1), epochs=Number(above=0), lr=Number(above=0), batch_size=Int(min=1),
         max_length=Int(min=2), progress=Progress(), command=Texts())
def finetune(model=None, *, out, data=None, task=None, examples=None, eval_data=None, max_examples: int | None = None,
             epochs: float = 1.0, lr: float = 1e-4, warmup: float = 0.0, batch_size: int = 32, max_length: int = 128,
             freeze_embeddings: bool = False, weight_decay: float = 0.01, threads: int = 0, seed: int = 0,
             overwrite: bool = False, progress=False, command=None):
    """Fine-tune a sequence classifier (a folder or hub id; None: the built-in default on the
    synthetic task's training set, evaluated on its held-out set) on ``data`` and save a
    standard model folder to ``out``. Returns the ``FinetuneReport`` (steps, seconds, final
    loss, eval accuracy, parameters)."""
    from ..data import get_task, load_examples, parse_examples, synthetic
    from ..engine.finetune import FinetuneOptions, check_out
    from ..engine.finetune import finetune as run_finetune
    from ..models.default import DEFAULT_MODEL_DIR

    if isinstance(model, Model):
        if model.path is None:
            raise OptionError("finetune starts from a saved model: give its folder or hub id")
        model = model.path
    if model is not None and not isinstance(model, (str, Path)):
        raise OptionError("finetune starts from a saved model: give its folder or hub id")
    check_outputs({"out": out}, [model, data, eval_data])
    check_out(out, overwrite)
    if model is None and data is None and task is None:
        task = "synthetic"
    task_obj = get_task(task) if task else None
    if task_obj is not None and task_obj.builtin:
        if data is not None:
            raise OptionError("the synthetic task trains on the built-in set; leave out data")
        model = str(model or DEFAULT_MODEL_DIR)
        train_all = synthetic.train_set(2000)
        labels = tuple(synthetic.LABELS)
        evals = synthetic.heldout() if eval_data is None else None
    else:
        if data is None:
            raise OptionError("a model to fine-tune needs data (a training file), or leave out both for the built-in task")
        if model is None:
            raise OptionError("data needs a model (a local model folder to fine-tune)")
        train_all, labels = load_examples(data, task_obj)
        evals = None
    if eval_data is not None:
        evals, _ = load_examples(eval_data, task_obj, list(labels))
    chosen = parse_examples(selection(examples), len(train_all))
    if max_examples is not None:
        chosen = chosen[:max_examples]
    train = [train_all[i] for i in chosen]
    options = FinetuneOptions(epochs=epochs, lr=lr, batch_size=batch_size, max_length=max_length,
                              freeze_embeddings=freeze_embeddings, weight_decay=weight_decay, warmup=warmup,
                              seed=seed, threads=threads)
    provenance = {"task": task_obj.name if task_obj else "generic", "data": data or "builtin",
                  "eval_data": eval_data or ("builtin" if evals else ""), "command": command_of(command)}
    with progress_for(progress, "finetune") as bar:
        return run_finetune(str(model), train, labels, out, options, evals, bar, overwrite, provenance)


@checked(shards=Files(), out=Out())
def merge(shards: Sequence, out, *, partial: bool = True) -> dict:
    """Merge stores (shards of one run, or runs with the same fingerprint) into ``out``;
    returns what was added and skipped, with ``notes`` on the shards and, with ``partial``,
    the ``problems`` merged over (a torchrun shard cut short, a rank's shard not given;
    without ``partial`` they are a StoreError)."""
    from ..store import inspect_shards
    from ..store import merge as merge_stores
    from ..views.notebook import Summary

    check_outputs({"out": out}, list(shards))
    check = inspect_shards([str(s) for s in shards])
    notes, problems = check.notes(), check.problems() if partial else []
    result = merge_stores([str(s) for s in shards], str(out), partial=partial)
    return Summary(dict(result, notes=notes, problems=problems), "merge")


@checked(attr_path=File(), tokens_path=File(), out=Out(), labels=Texts(), attention_path=File(), command=Texts())
def import_2021(attr_path, tokens_path, out, *, model: str | None = None, example: int | None = None,
                labels: Sequence[str] | None = None, attention_path=None, store_dtype: str = "float32", command=None):
    """Import one example of the 2021 code's output (its attribution matrices and tokens
    file) into the store ``out``; returns the import report."""
    from ..analysis.legacy import import_2021 as run_import
    from ..fileio import check_store_output

    check_outputs({"out": out}, [attr_path, tokens_path, attention_path])
    check_store_output(out, "out")
    return run_import(attr_path, tokens_path, out, model=model, example=example, labels=labels,
                      attention_path=attention_path, command=command_of(command), store_dtype=store_dtype)


# ----------------------------------------------------------------------------- source removal (LMs)


@checked(model=ModelArg(), prompt=Str(), continuation=Str(), sources=Str(), ks=Ints(min=1), methods=Names(),
         tol=Tolerance(), progress=Progress(), threads=Threads(),
         memory=OneOf(Number(above=0), Str(), what="a size: bytes, or a string such as 4GB"))
@on_threads
def source_removal(model, prompt: str, continuation: str, *, sources: str = "paragraphs", ks=(1, 3, 5), methods=None,
                   steps: int | None = None, rule: str | None = None, tol: float | None = None,
                   threads: int | None = None, memory=None, device: str = "auto", progress=False):
    """The context-attribution check of faithfulness for a language model (docs/long-context.md):
    ``prompt``'s sources (``sources``: sentences, paragraphs or a JSONL file of passages) are
    scored for the answer ``continuation``'s joint log-probability by attattr (``score(...,
    output="logprob", keep="sources")``), raw attention, input x gradient and leave-one-source-out
    (``methods``: a subset of those names); each method's top-k sources (``ks``) are removed and
    the drop of the answer's log-probability reported, with Kendall's tau-b against
    leave-one-out. Returns :class:`~attattr_cli.analysis.context_check.RemovalCheck`
    (``rows()``: method, k, drop, its ratio to leave-one-out's, tau)."""
    from ..analysis.context_check import METHODS, check_example, removal_check

    methods = list(METHODS) if methods is None else [methods] if isinstance(methods, str) else list(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise OptionError(f"unknown source-removal method '{unknown[0]}'; available: {', '.join(METHODS)}")
    ks = tuple(ks)
    if not ks:
        raise OptionError("ks must be whole numbers of at least 1, got []")
    m = as_model(model, device=device, lm=True)
    res = score(m, prompts=[prompt], sources=sources, keep="sources", lm=True, progress=progress,
                target=Target(continuation=continuation, output="logprob"),
                integration=Integration(steps=steps, rule=rule, tol=tol),
                compute=Compute(threads=threads, memory=memory)) \
        if "attattr" in methods else None
    with using(m, device=device, lm=True) as used:
        if res is not None:
            return check_example(used.loaded.model, used.loaded.tokenizer, res[0], ks, methods)
        from ..data.sources import prompt_spans

        tok = used.loaded.tokenizer
        spans = prompt_spans(tok, prompt, sources)
        answer = list(tok(continuation, add_special_tokens=False)["input_ids"])
        return removal_check(used.loaded.model, list(tok(prompt, add_special_tokens=True)["input_ids"]), answer, spans, None,
                             ks, methods)
