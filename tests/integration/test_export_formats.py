"""`onthejob export --format parquet | trl` on both databases: Parquet that datasets reads
as one training sequence per row, and TRL conversational rows that TRL's own data helpers
accept and render with the model's chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from cli.main import main
from store.export_formats import sample_rows
from store.trajectory_loading import load_trajectories
from tests.support.admin import N, kind_of, seed


def _load(kind: str, path: Path, tmp_path: Path) -> Any:
    from datasets import load_dataset

    return load_dataset(kind, data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_parquet_holds_one_training_sequence_per_row(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    seed(engine)  # N two-turn trajectories; traj004's second call failed
    out = tmp_path / "samples.parquet"
    assert main(["export", "--db", db_url, "--format", "parquet", "--output", str(out)]) == 0
    data = _load("parquet", out, tmp_path)
    expected = {r["trajectory_id"]: r for r in sample_rows(load_trajectories(engine))}
    assert len(data) == len(expected) == N
    rows = {row["trajectory_id"]: row for row in data}
    row = rows["traj002"]
    # the learner's own sequence: both calls stitched, loss on what vLLM sampled
    assert row["token_ids"] == [1, 2, 3, 12, 20, 21, 22, 4, 5, 30, 31]
    assert row["loss_mask"] == [False] * 4 + [True] * 3 + [False] * 2 + [True] * 2
    assert row["logprobs"] == pytest.approx(expected["traj002"]["logprobs"])
    assert row["reward"] == pytest.approx(2 / N) and row["trained_tokens"] == 5
    assert row["interaction_type"] == kind_of(2) and row["policy_versions"] == ["v0"]
    assert rows["traj004"]["trained_tokens"] == 3  # the failed call trains nothing
    assert rows["traj003"]["reward"] is None  # not graded
    with pytest.raises(SystemExit, match="--output"):
        main(["export", "--db", db_url, "--format", "parquet"])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_trl_rows_are_what_trl_takes(
    db_url: str, engine: Engine, tmp_path: Path, tokenizer: Any
) -> None:
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    seed(engine)
    out = tmp_path / "trl.jsonl"
    assert main(["export", "--db", db_url, "--format", "trl", "--output", str(out)]) == 0
    data = _load("json", out, tmp_path)
    rows = {row["trajectory_id"]: row for row in data}
    row = rows["traj002"]
    assert [(m["role"], m["content"]) for m in row["prompt"]] == [
        ("user", "question number 2"),
        ("assistant", "answer 2"),
        ("user", "and then?"),
    ]
    assert [(m["role"], m["content"]) for m in row["completion"]] == [("assistant", "the end")]
    assert row["reward"] == pytest.approx(2 / N) and row["policy_versions"] == ["v0"]
    assert is_conversational(row)
    rendered = maybe_apply_chat_template(
        {"prompt": row["prompt"], "completion": row["completion"]}, tokenizer
    )
    assert "and then?" in rendered["prompt"] and rendered["completion"].startswith("the end")
    # the failed call of traj004 left its first reply as the last one
    assert [m["content"] for m in rows["traj004"]["completion"]] == ["answer 4"]
