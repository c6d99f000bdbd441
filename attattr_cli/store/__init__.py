"""The HDF5 attribution store: schema, writer, reader, merge."""

from .schema import SCHEMA_NAME, SCHEMA_VERSION
from .store import Store, StoredExample, StoreWriter, merge

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "Store", "StoredExample", "StoreWriter", "merge"]
