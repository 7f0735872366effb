"""The report of bench/swap_transport.py: wall-clock per swap, both arms warmed alike and
interleaved, medians and their ratio (issue 42)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.swap_transport import (
    Phases,
    arm_medians,
    replaced,
    report_lines,
    round_order,
    round_ratios,
    speedup,
    speedup_line,
    swap_row,
)


def phases(**seconds: float) -> Phases:
    measured = Phases()
    for name, value in seconds.items():
        measured.add(name.replace("_", " "), value)
    return measured


def rows() -> list[dict]:
    """One warm-up round (slow, as a first swap is), then three measured rounds."""
    out = [
        swap_row("disk", 0, True, 9.0, phases(reload=8.0)),
        swap_row("transfer", 0, True, 9.0, phases(transfer=8.0)),
    ]
    for round_, (disk, transfer) in enumerate(((1.5, 0.5), (1.2, 0.4), (2.0, 0.6)), 1):
        for arm in round_order(round_):
            wall = disk if arm == "disk" else transfer
            out.append(swap_row(arm, round_, False, wall, phases(swap=wall - 0.1)))
    return out


def test_the_arms_take_turns_going_first() -> None:
    assert round_order(0) == ("disk", "transfer")
    assert round_order(1) == ("transfer", "disk")
    firsts = [round_order(r)[0] for r in range(6)]
    assert firsts.count("disk") == firsts.count("transfer") == 3


def test_the_figure_is_the_median_wall_clock_of_the_measured_swaps() -> None:
    assert arm_medians(rows()) == {"disk": 1.5, "transfer": 0.5}
    assert speedup(rows()) == pytest.approx(3.0)


def test_each_rounds_own_ratio_gives_the_spread() -> None:
    assert round_ratios(rows()) == pytest.approx([3.0, 3.0, 2.0 / 0.6])
    assert report_lines(rows())[-1] == (
        "transfer vs disk, round by round: 3.00x, 3.00x, 3.33x (min 3.00x, max 3.33x)"
    )
    unpaired = [r for r in rows() if not (r["round"] == 2 and r["arm"] == "disk")]
    assert round_ratios(unpaired) == pytest.approx([3.0, 2.0 / 0.6])


def test_the_last_line_stays_a_ratio() -> None:
    line = speedup_line(speedup(rows()))
    assert line == "swap speed-up, transfer vs disk: 3.0x"
    assert re.fullmatch(r"swap speed-up, transfer vs disk: \d+\.\dx", line)


def test_the_report_gives_each_arm_its_wall_clock_then_its_phases_as_detail() -> None:
    lines = report_lines(rows())
    text = "\n".join(lines)
    assert (
        "disk: step end -> first answer, wall-clock: median 1.500s of 3 swaps (after 1 warm-up)"
        in text
    )
    assert "transfer: step end -> first answer, wall-clock: median 0.500s of 3 swaps" in text
    assert "each: 0.500, 0.400, 0.600" in text  # in the order they ran
    # the warm-up's phases are not in the medians; what no phase covers is shown
    assert not any(line.strip().startswith("reload") for line in lines)
    other = [line for line in lines if line.strip().startswith("other (in no phase)")]
    assert len(other) == 2 and all(line.endswith("0.100") for line in other)


def test_phases_inside_another_do_not_count_twice_in_what_is_left() -> None:
    inner = phases(swap=0.3)
    inner.add("  of which: write", 0.2)
    lines = report_lines([swap_row("transfer", 0, False, 0.5, inner)])
    assert lines[-1].strip().startswith("other (in no phase)")
    assert lines[-1].endswith("0.200")


def test_each_arm_keeps_its_latest_checkpoint_while_the_other_swaps() -> None:
    """Its publisher checks the next checkpoint against it: deleting it when the other arm
    swapped failed the interleaved run ("disk-0: no .safetensors weights")."""
    latest: dict[str, Path] = {}
    deleted = [
        replaced(latest, arm, Path(f"{arm}-{round_}"))
        for round_ in range(3)
        for arm in round_order(round_)
    ]
    assert deleted == [
        None,
        None,
        Path("transfer-0"),
        Path("disk-0"),
        Path("disk-1"),
        Path("transfer-1"),
    ]
    assert latest == {"disk": Path("disk-2"), "transfer": Path("transfer-2")}
