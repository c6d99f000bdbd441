"""The attattr HDF5 store schema (written down in docs/store.md).

Bump the minor version for additions that old readers may ignore, the major version
for anything an old reader would misread; readers refuse a newer major version.
"""

SCHEMA_NAME = "attattr.store"
SCHEMA_VERSION = "1.6"  # what each minor version added: docs/store.md, "Root attributes"
SCHEMA_MAJOR = 1

EXAMPLES = "examples"
FAMILIES = "families"  # examples/N/families/<family>/ for every family but "self"
PROVENANCE = "provenance"
STEPS = "steps"  # examples/N/steps/<5-digit step>/ for a generation attributed step by step (schema 1.4)
PARTIAL_PREFIX = ".partial-"
SHARD_EXAMPLES = "shard_examples"  # root dataset of a distributed shard: the indices it was given

# dataset name -> axis labels
AXES = {
    "tokens": ("token",), "input_ids": ("token",), "segment_ids": ("token",), "logits": ("label",), "probs": ("label",),
    "attribution": ("layer", "head", "query", "key"), "attention": ("layer", "head", "query", "key"),
    "head_max": ("layer", "head"), "f_baseline": ("layer",), "residual": ("layer",),
    # schema 1.1
    "head_sum": ("layer", "query", "key"), "attention_mean": ("layer", "query", "key"),
    "topk_index": ("layer", "head", "rank", "query_key"), "topk_value": ("layer", "head", "rank"),
    "decoder_tokens": ("decoder_token",), "decoder_input_ids": ("decoder_token",),
    # schema 1.2 and 1.3 (convergence)
    "nodes": ("layer",), "error_estimate": ("layer",), "node_cap_hit": ("layer",), "convergence": ("layer",),
    # schema 1.5 and 1.6 (keep sources)
    "key_sum": ("layer", "key"), "read_sum": ("layer", "key"),
}

STORE_DTYPES = ("float32", "float16")


def example_name(index: int) -> str:
    return f"{index:08d}"
