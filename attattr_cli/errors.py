"""Exception types of the attattr library.

The library raises these and nothing prints or exits; the CLI turns each into a
single ``Error: ...`` line on stderr and a non-zero exit status.
"""


class AttattrError(Exception):
    """Base class of every error attattr reports to a user. A subclass gives its exit status
    in its class line (``class DataError(AttattrError, exit_code=2)``) or keeps its base's."""

    exit_code = 1

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code


class DataError(AttattrError, exit_code=2):
    """A data file is missing, unreadable, lacks columns, or holds unknown labels."""


class ModelError(AttattrError, exit_code=3):
    """A model cannot be loaded or is not supported."""


class StoreError(AttattrError, exit_code=4):
    """An attribution store is missing, corrupt, from a newer schema, or incompatible."""


class OptionError(AttattrError, exit_code=2):
    """Options that contradict each other or name something that does not exist."""


class ResourceError(AttattrError, exit_code=5):
    """The machine cannot do the work: memory runs out even at the smallest batch."""


class DistributedError(AttattrError, exit_code=6):
    """The processes of a torchrun launch disagree, time out, or one of them failed."""


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (its type's name when it has none),
    for one-line error messages that wrap another library's error."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


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
