"""attattr: self-attention attribution (Hao et al., AAAI 2021) for transformers models.

The library surface; the command-line interface lives in ``attattr_cli.cli``.
"""

__version__ = "0.1.0"
