"""attattr: self-attention attribution (Hao et al., AAAI 2021) for transformers models.

``import attattr_cli as aa`` gives every function, result and option group of the API (the names
of ``attattr_cli.exports``; docs/api.md), imported lazily so that ``import attattr_cli`` loads no
torch until a function is used; the CLI (``attattr_cli.cli``) calls these functions. What they
raise is importable from here too: ``aa.AttattrError`` (which catches every error attattr reports
to a user) and its kinds ``aa.DataError``, ``aa.OptionError``, ``aa.ModelError``,
``aa.StoreError``, ``aa.ResourceError``, ``aa.DistributedError``.
"""

import warnings

from .exports import API
from .errors import (AttattrError, DataError, DistributedError, ModelError, OptionError,  # noqa: F401 (cheap:
                     ResourceError, StoreError)  # no torch)

__version__ = "0.1.0"

# transformers imports tqdm.auto, which in a notebook without ipywidgets writes "IProgress not
# found" to the cell's stderr; attattr draws no tqdm bar (progress=True is api/model.progress_for,
# no widgets), so in a notebook that line is noise about nothing attattr shows
warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

__all__ = [*API, "__version__", "AttattrError", "DataError", "DistributedError", "ModelError", "OptionError",
           "ResourceError", "StoreError"]


def __getattr__(name: str):
    if name in API:
        from . import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attattr_cli' has no attribute '{name}'")


def __dir__():
    return sorted(set(globals()) | set(__all__))
