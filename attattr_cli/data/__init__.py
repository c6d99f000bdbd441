"""Data: readers for TSV/CSV/JSONL files, task presets, and example selection."""

from attattr_cli.data.readers import Table, detect_format, read_rows, read_table
from attattr_cli.data.select import parse_examples
from attattr_cli.data.tasks import (GENERIC, TASKS, HubSpec, Task, get_task, load_examples, normalize_label,
                                    resolve_model_for_task)
from attattr_cli.data.types import Example

__all__ = ["Example", "GENERIC", "HubSpec", "TASKS", "Table", "Task", "detect_format", "get_task", "load_examples",
           "normalize_label", "parse_examples", "read_rows", "read_table", "resolve_model_for_task"]
