"""The built-in pair tasks, one module each (data/pairs.py ``PairTask``): a new task is one
module here that registers itself, imported below; its order is the order of listings."""

from . import ioi, greater_than, capitals, copying, pronoun, agreement, mcq  # noqa: F401
