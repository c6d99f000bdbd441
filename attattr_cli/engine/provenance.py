"""The versions of attattr and the libraries it runs on, recorded in every store's provenance.

Imports neither torch nor transformers unless asked for their versions.
"""

from __future__ import annotations

import platform

from .. import __version__


def libraries(frameworks: bool = True) -> dict:
    """``{name: version}`` of attattr, Python, h5py, HDF5 and numpy; with ``frameworks`` also
    torch (and the CUDA it was built with) and transformers."""
    import h5py
    import numpy

    out = {"attattr": __version__, "python": platform.python_version()}
    if frameworks:
        import torch
        import transformers

        out.update({"torch": torch.__version__, "cuda": torch.version.cuda,
                    "transformers": transformers.__version__})
    out.update({"h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version, "numpy": numpy.__version__})
    return out
