"""What a W&B offline run recorded, read from its `run-*.wandb` file.

W&B keeps an offline run as a LevelDB-style log (32 KiB blocks of records, each with a 7-byte
header: checksum, length, type; the file starts with the 7-byte header ":W&B", magic,
version) of protobuf `Record`s. W&B ships no reader for it in Python, so the tests read it
here: the run's config and its history rows by step.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
WHOLE, LAST = 1, 4  # record types that end a record (FIRST and MIDDLE continue it)


def _records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, pending, at = [], b"", HEADER
    while at + HEADER <= len(data):
        left = BLOCK - at % BLOCK
        if left < HEADER:  # the rest of a block too short for a header is padding
            at += left
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + HEADER])
        pending += data[at + HEADER : at + HEADER + length]
        at += HEADER + length
        if kind in (WHOLE, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def offline_run(directory: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(config, {step: {key: value}}) of the one offline run under `directory`."""
    [path] = directory.glob("offline-run-*/run-*.wandb")
    config: dict[str, Any] = {}
    history: dict[int, dict[str, Any]] = {}
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            for item in record.run.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = history.setdefault(record.history.step.num, {})
            for item in record.history.item:
                row[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config, history
