"""Where the learner's in-memory files go: shared memory where it can be written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from learner.swap.shared_memory import shared_memory_problem


def test_a_writable_directory_can_hold_them(tmp_path: Path) -> None:
    assert shared_memory_problem(tmp_path) is None


def test_a_missing_one_or_a_file_cannot(tmp_path: Path) -> None:
    assert "is not a directory" in str(shared_memory_problem(tmp_path / "shm"))
    (tmp_path / "file").write_text("")
    assert "is not a directory" in str(shared_memory_problem(tmp_path / "file"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the mode says")
def test_an_unwritable_one_cannot(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o500)
    assert "is not writable" in str(shared_memory_problem(shm))
