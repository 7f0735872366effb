"""`onthejob export --format parquet | trl`: what we recorded, for the tools people train with.

- **parquet** (docs/reference/export-format.md, "Parquet"): one row per training sequence, as
  the learner itself builds them (store/samples.py: a trajectory's calls stitched into one
  sequence where each call's prompt extends the last): token ids, the loss mask (true on the
  tokens vLLM sampled), their logprobs, the trajectory's reward, interaction type and policy
  versions. `datasets.load_dataset("parquet", data_files=...)` reads it.
- **trl**: JSON Lines in TRL's conversational prompt-completion form, one row per trajectory
  with a reply: `prompt` (the messages before the model's last reply, tool calls included)
  and `completion` (that reply), plus `reward`. TRL's SFT trainer takes `prompt` and
  `completion`; its GRPO trainer takes `prompt`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Literal, NotRequired, TypedDict, get_args

import orjson

from store.conversation import Message, conversation
from store.export import TrajectoryFields, trajectory_fields
from store.json_types import JsonValue
from store.samples import build_samples
from store.trajectory_record import Trajectory

ExportFormat = Literal["jsonl", "parquet", "trl"]
FORMATS: tuple[str, ...] = get_args(ExportFormat)
PARQUET_BATCH = 1024  # rows held in memory before a row group is written


class SampleRow(TrajectoryFields):
    """A Parquet row: one training sequence (`_schema`'s columns)."""

    trajectory_id: str
    sample_index: int
    policy_versions: list[str]
    token_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    trained_tokens: int
    truncated: bool
    temperature: float
    top_p: float
    top_k: int


class TrlFunction(TypedDict):
    name: Any  # as the body gave it
    arguments: JsonValue  # a mapping where the JSON text parses to one, else the text


class TrlToolCall(TypedDict):
    type: Literal["function"]
    function: TrlFunction


class TrlMessage(TypedDict):
    role: str
    content: str
    tool_calls: NotRequired[list[TrlToolCall]]


class TrlRow(TypedDict):
    """TRL's conversational prompt-completion row, with what we know of it."""

    prompt: list[TrlMessage]
    completion: list[TrlMessage]
    reward: float | None
    trajectory_id: str
    task_key: str | None
    interaction_type: str | None
    policy_versions: list[str]


def sample_rows(trajectories: Iterable[Trajectory]) -> Iterator[SampleRow]:
    """One row per training sequence of each trajectory (parquet rows out)."""
    for trajectory in trajectories:
        for index, sample in enumerate(build_samples(trajectory)):
            yield {
                "trajectory_id": trajectory.id,
                "sample_index": index,
                **trajectory_fields(trajectory),
                "policy_versions": sorted(v for v in sample.policy_versions if v is not None),
                "token_ids": sample.token_ids,
                "loss_mask": sample.loss_mask,
                "logprobs": sample.logprobs,
                "trained_tokens": sample.trained_tokens,
                "truncated": sample.truncated,
                "temperature": sample.sampling.temperature,
                "top_p": sample.sampling.top_p,
                "top_k": sample.sampling.top_k,
            }


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("trajectory_id", pa.string()),
            ("sample_index", pa.int32()),
            ("session", pa.string()),
            ("task_key", pa.string()),
            ("group_key", pa.string()),
            ("interaction_type", pa.string()),
            ("status", pa.string()),
            ("reward", pa.float64()),
            ("started_at", pa.string()),
            ("ended_at", pa.string()),
            ("policy_versions", pa.list_(pa.string())),
            ("token_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.bool_())),
            ("logprobs", pa.list_(pa.float32())),
            ("trained_tokens", pa.int32()),
            ("truncated", pa.bool_()),
            ("temperature", pa.float64()),
            ("top_p", pa.float64()),
            ("top_k", pa.int32()),
        ]
    )


def write_parquet(rows: Iterable[SampleRow], path: Path) -> int:
    """Rows into one Parquet file, a row group per PARQUET_BATCH rows; how many."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise SystemExit(
            "onthejob export --format parquet needs pyarrow: pip install 'onthejob[export]'"
        ) from exc
    schema = _schema()
    count = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        batch: list[SampleRow] = []
        for row in rows:
            batch.append(row)
            if len(batch) == PARQUET_BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count, batch = count + len(batch), []
        if batch or count == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count


def _trl_message(message: Message) -> TrlMessage:
    out: TrlMessage = {"role": message["role"], "content": message["text"]}
    if message["tool_calls"]:
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {"name": call["name"], "arguments": _arguments(call["arguments"])},
            }
            for call in message["tool_calls"]
        ]
    return out


def _arguments(raw: str) -> JsonValue:
    # chat templates render arguments from a mapping
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return raw
    return parsed if isinstance(parsed, dict) else raw


def trl_rows(trajectories: Iterable[Trajectory]) -> Iterator[TrlRow]:
    """TRL's conversational prompt-completion rows: the messages of the trajectory's last
    context (after a restart of the conversation, only what follows it) up to the model's
    last reply as `prompt`, that reply as `completion`."""
    for trajectory in trajectories:
        messages = conversation(trajectory.calls)
        starts = [i for i, m in enumerate(messages) if m["role"] == "context"]
        messages = messages[starts[-1] + 1 :] if starts else messages
        messages = [m for m in messages if m["role"] in ("system", "user", "assistant", "tool")]
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if last is None or last == 0:
            continue  # no reply, or a reply to nothing: nothing to learn from
        versions = sorted({c.policy_version for c in trajectory.calls if c.policy_version})
        yield {
            "prompt": [_trl_message(m) for m in messages[:last]],
            "completion": [_trl_message(messages[last])],
            "reward": trajectory.reward,
            "trajectory_id": trajectory.id,
            "task_key": trajectory.task_key,
            "interaction_type": trajectory.interaction_type,
            "policy_versions": versions,
        }


def write_lines(rows: Iterable[TrlRow], out: IO[bytes]) -> int:
    count = 0
    for row in rows:
        out.write(orjson.dumps(row) + b"\n")
        count += 1
    out.flush()
    return count
