"""`python -m learner.rollout.tool_tasks`: writes both splits as task-set files."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.rollout.tool_tasks.__main__ import main
from learner.rollout.tool_tasks.tasks import make_task_sets, read_jsonl


def test_it_writes_both_splits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path), "--seed", "2", "--train", "12", "--heldout", "6"]) == 0
    train, heldout = make_task_sets(2, 12, 6)
    assert read_jsonl(tmp_path / "tools-train.jsonl") == train
    assert read_jsonl(tmp_path / "tools-heldout.jsonl") == heldout
    out = capsys.readouterr().out
    assert "tools-train.jsonl: 12 tasks (arithmetic 2, convert 2, lookup 2," in out


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--train", "-1"], "--seed, --train and --heldout must be 0 or more"),
        (["--heldout", "400"], "the heldout split has no new"),
    ],
)
def test_bad_sizes_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--out", str(tmp_path), *args])
    assert exited.value.code == 2 and error in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
