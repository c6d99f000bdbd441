"""The HDF5 attribution store: schema, writer, reader, merge."""

from .schema import SCHEMA_NAME, SCHEMA_VERSION
from .store import Store, StoredExample, StoreWriter, merge
from .token_importance import TokenImportanceStore, read_token_importance

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "Store", "StoredExample", "StoreWriter", "merge",
           "TokenImportanceStore", "read_token_importance"]
