"""The attattr HDF5 store schema (written down in docs/store.md).

Bump the minor version for additions that old readers may ignore, the major version
for anything an old reader would misread; readers refuse a newer major version.
"""

SCHEMA_NAME = "attattr.store"
SCHEMA_VERSION = "1.0"
SCHEMA_MAJOR = 1

EXAMPLES = "examples"
PROVENANCE = "provenance"
PARTIAL_PREFIX = ".partial-"
SHARD_EXAMPLES = "shard_examples"  # root dataset of a distributed shard: the indices it was given

# dataset name -> axis labels
AXES = {
    "tokens": ("token",),
    "input_ids": ("token",),
    "segment_ids": ("token",),
    "logits": ("label",),
    "probs": ("label",),
    "attribution": ("layer", "head", "query", "key"),
    "attention": ("layer", "head", "query", "key"),
    "head_max": ("layer", "head"),
    "f_baseline": ("layer",),
    "residual": ("layer",),
}

STORE_DTYPES = ("float32", "float16")


def example_name(index: int) -> str:
    return f"{index:08d}"
