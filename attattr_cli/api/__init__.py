"""The public Python API of attattr (also exported from ``attattr_cli`` itself).

>>> import attattr_cli as aa
>>> model = aa.load_model()
>>> res = aa.score(model, [("a premise", "a hypothesis")], integration=aa.Integration(steps=20))
>>> res[0].top(5)

Layered above analysis/, engine/ and store/; every command of the CLI calls into it. Each
function's arguments are declared once (checks.py ``@checked``) and checked before any work.
"""

from .circuits import Circuit, circuit
from .demo import make_pairs, pair_data, synthetic_data, train_default
from .heads import Importance, Predictions, PruneResult, importance, predict, prune
from ..exports import API
from .groups import Adversarial, Compute, Hooks, Integration, Target
from .methods import Methods, methods
from .scoring import score
from .tools import FaithfulnessResult, finetune, faithfulness, import_2021, merge, source_removal
from .triggers import AttackResult, TriggersResult, attack, triggers
from .model import Model, convert, load_model
from .results import Attribution, Interaction, Results, StoreView, Tree, open_store, tree
from .views import Picture, info, report, view

__all__ = list(API)
