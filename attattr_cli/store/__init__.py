"""The HDF5 attribution store: schema (schema.py), opening and schema check (opening.py),
writer (writer.py), reader (reader.py), merge (merging.py), fingerprint differences
(fingerprint.py), token importance (token_importance.py)."""

from .fingerprint import FingerprintDifference, check_fingerprint, fingerprint_difference
from .merging import ShardCheck, inspect_shards, merge
from .reader import Store, StoredExample
from .schema import SCHEMA_NAME, SCHEMA_VERSION
from .token_importance import TokenImportanceStore, read_token_importance
from .writer import StoreWriter

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "FingerprintDifference", "ShardCheck", "Store", "StoredExample",
           "StoreWriter", "check_fingerprint", "fingerprint_difference", "inspect_shards", "merge",
           "TokenImportanceStore", "read_token_importance"]
