"""The HDF5 attribution store: schema, writer, reader, merge."""

from .schema import SCHEMA_NAME, SCHEMA_VERSION
from .store import ShardCheck, Store, StoredExample, StoreWriter, inspect_shards, merge
from .token_importance import TokenImportanceStore, read_token_importance

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "ShardCheck", "Store", "StoredExample", "StoreWriter", "inspect_shards",
           "merge", "TokenImportanceStore", "read_token_importance"]
