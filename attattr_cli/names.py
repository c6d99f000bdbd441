"""The API's argument names and the CLI's flags, in one table, and each caller's words.

An argument's flag is ``--`` and its name with ``-`` for ``_`` (``keep_heads`` is ``--keep-heads``)
unless :data:`FLAGS` says otherwise. A message is written once, naming arguments or flags; a Python
caller reads it in the API's words (:func:`api_names`, which each public function runs inside), a
command's user in the flags (:func:`in_cli_words`, at the CLI's edge). Standard library only.
"""

from __future__ import annotations

import contextlib
import contextvars
import re

# argument (of the API, or a field of the engine's options) -> flag, where the rule does not give it
FLAGS = {
    "fmt": "--format",
    "lam": "--lambda",
    "score_store": "--store",  # faithfulness: the store scored into (its STORE argument is the store read)
    "step_batch": "--steps-per-pass",  # ScoreOptions' field; the API's steps_per_pass
}
# flags that name an argument other than the rule's: the inverse of FLAGS (where one argument
# has the flag) and old spellings kept as hidden aliases
ARGUMENTS = {"--format": "fmt", "--lambda": "lam", "--step-batch": "steps_per_pass",
             "--steps-per-pass": "steps_per_pass"}


def flag(argument: str) -> str:
    """The CLI's flag of an API argument: ``keep_heads`` -> ``--keep-heads``, ``fmt`` -> ``--format``."""
    return FLAGS.get(argument, "--" + argument.replace("_", "-"))


def argument(flag_: str) -> str:
    """The API's argument of a CLI flag: ``--keep-heads`` -> ``keep_heads``, ``--format`` -> ``fmt``."""
    return ARGUMENTS.get(flag_, flag_.lstrip("-").replace("-", "_"))


_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def in_api_words(text: str) -> str:
    """``text`` with every flag replaced by its argument."""
    return _FLAG.sub(lambda m: argument(m.group()), text)


def in_cli_words(text: str, arguments=()) -> str:
    """``text`` with the API's ``arguments`` replaced by their flags. An argument of several
    words (``keep_heads``) wherever it stands; one of one word only where a message names it:
    first, or after "give", "unknown", "needs", "and/or", "and"."""
    for name in arguments:
        n, f = re.escape(name), flag(name)
        if "_" in name:
            text = re.sub(rf"(?<![\w-]){n}\b", f, text)
        else:
            text = re.sub(rf"^{n}(?=[ :'])|(?<=unknown ){n}(?= ')|(?<=give |eeds |d/or | and ){n}(?=[ )])", f, text)
    return text


def cli_text(exc: BaseException, arguments=()) -> str:
    """The message of ``exc`` in the CLI's words: an argument's check (which knows the
    argument it names) with its flag; any other message with ``arguments`` renamed."""
    template, name = getattr(exc, "template", None), getattr(exc, "argument", None)
    if template is not None and name is not None:
        return template.format(name=flag(name))
    return in_cli_words(str(exc), arguments)


_CLI_WORDS = contextvars.ContextVar("attattr_cli_words", default=False)


@contextlib.contextmanager
def cli_words():
    """Inside, messages keep the CLI's flags (a command calling the API): :func:`api_names`
    leaves them as they are."""
    token = _CLI_WORDS.set(True)
    try:
        yield
    finally:
        _CLI_WORDS.reset(token)


@contextlib.contextmanager
def api_names():
    """Errors raised inside name the API's arguments (``steps_per_pass``) instead of the CLI's
    flags (``--steps-per-pass``), unless a command called (:func:`cli_words`): one validator,
    each caller's words. The error is the same object (its class, its traceback), reworded."""
    if _CLI_WORDS.get():
        yield
        return
    from .errors import AttattrError

    try:
        yield
    except AttattrError as exc:
        text = in_api_words(str(exc))
        if text != str(exc) and getattr(exc, "template", None) is None:
            exc.args = (text,)
        raise
