"""Data: crash-safe JSON Lines I/O and loaders for Alpaca-format instruction data and the AlpacaEval set.

    from pasta.data import load_instructions, JsonlAppender
    records = load_instructions(cfg.data)          # [Record(instruction, output, input, annotated, ...)]
    records, report = load_training_records(cfg.data)   # the same, less the held-out evaluation pool's prompts
"""

from pasta.data.instructions import (
    DataConfig,
    DataFormat,
    LoadReport,
    Record,
    load_alpaca_eval,
    load_instructions,
    load_training_records,
)
from pasta.data.jsonl import (
    JsonlAppender,
    append_jsonl,
    check_text,
    iter_jsonl,
    iter_numbered_jsonl,
    read_json_file,
    read_jsonl,
    read_text_file,
    write_json_atomic,
    write_jsonl_atomic,
    write_text_atomic,
)
from pasta.data.paths import check_output_dir, check_output_file

__all__ = [
    "DataConfig",
    "DataFormat",
    "JsonlAppender",
    "LoadReport",
    "Record",
    "append_jsonl",
    "check_output_dir",
    "check_output_file",
    "check_text",
    "iter_jsonl",
    "iter_numbered_jsonl",
    "load_alpaca_eval",
    "load_instructions",
    "load_training_records",
    "read_json_file",
    "read_jsonl",
    "read_text_file",
    "write_json_atomic",
    "write_jsonl_atomic",
    "write_text_atomic",
]
