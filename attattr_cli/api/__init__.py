"""The public Python API of attattr (also exported from ``attattr_cli`` itself).

>>> import attattr_cli as aa
>>> model = aa.load_model()
>>> res = aa.score(model, [("a premise", "a hypothesis")], steps=20)
>>> res[0].top(5)

Layered above analysis/, engine/ and store/; every command of the CLI calls into it.
"""

from .commands import (AttackResult, FaithfulnessResult, Importance, Predictions, PruneResult, TriggersResult,
                       attack, faithfulness, finetune, import_2021, importance, merge, model_and_data, predict, prune,
                       score, to_examples, triggers)
from .model import Model, load_model
from .results import Attribution, Interaction, Results, StoreView, Tree, open_store, tree

__all__ = [
    "Attribution", "AttackResult", "FaithfulnessResult", "Importance", "Interaction", "Model", "Predictions",
    "PruneResult", "Results", "StoreView", "Tree", "TriggersResult", "attack", "faithfulness", "finetune",
    "import_2021", "importance", "load_model", "merge", "open_store", "predict", "prune", "score", "tree",
    "triggers",
]
