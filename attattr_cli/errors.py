"""Exception types of the attattr library.

The library raises these and nothing prints or exits; the CLI turns each into a
single ``Error: ...`` line on stderr and a non-zero exit status.
"""


class AttattrError(Exception):
    """Base class of every error attattr reports to a user."""

    exit_code = 1


class DataError(AttattrError):
    """A data file is missing, unreadable, lacks columns, or holds unknown labels."""

    exit_code = 2


class ModelError(AttattrError):
    """A model cannot be loaded or is not supported."""

    exit_code = 3


class StoreError(AttattrError):
    """An attribution store is missing, corrupt, from a newer schema, or incompatible."""

    exit_code = 4


class OptionError(AttattrError):
    """Options that contradict each other or name something that does not exist."""

    exit_code = 2


class ResourceError(AttattrError):
    """The machine cannot do the work: memory runs out even at the smallest batch."""

    exit_code = 5


class DistributedError(AttattrError):
    """The processes of a torchrun launch disagree, time out, or one of them failed."""

    exit_code = 6


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (its type's name when it has none),
    for one-line error messages that wrap another library's error."""
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside attattr (the user's own line),
    however deep in the library it is raised and whatever wraps the public function."""
    import os
    import sys
    import warnings

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
