"""The names of the public API, in one place: ``attattr_cli.api`` defines them and the package
top (``import attattr_cli as aa``) exports them lazily. Imports nothing."""

API = (
    "Attribution", "AttackResult", "Circuit", "circuit", "make_pairs", "pair_data", "FaithfulnessResult", "Importance",
    "Interaction", "Model", "Predictions", "PruneResult", "Results", "StoreView", "Tree", "TriggersResult", "attack",
    "faithfulness", "finetune", "import_2021", "importance", "load_model", "merge", "open_store", "predict", "prune",
    "score", "tree", "triggers", "view", "report", "info", "Picture", "train_default", "synthetic_data", "convert",
    "source_removal", "Integration", "Target", "Compute", "Hooks", "Adversarial", "methods", "Methods",
)
