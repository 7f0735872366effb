"""bench/tenant_scale.py's report: the ratios against one tenant, the verdict of each figure
against the issue's goal, and the last line, with what was not measured said so."""

from __future__ import annotations

from bench.tenant_scale import ratio, summary_line, verdicts


def test_ratios_are_against_one_tenant_and_none_where_unmeasured() -> None:
    memory = {1: 800.0, 8: 1040.0, 32: 1600.0}
    assert ratio(memory, 8) == 1.3
    assert ratio(memory, 32) == 2.0
    assert ratio({8: 1.0}, 8) is None  # no one-tenant figure
    assert ratio({1: 0.0, 8: 1.0}, 8) is None
    assert ratio(memory, 4) is None


def test_the_last_line_names_both_counts_and_both_ways() -> None:
    line = summary_line({1: 800.0, 8: 1040.0, 32: 1680.0}, {"memory": 31.6, "disk": 118.2})
    assert (
        line == "tenants: 8 -> 1.30x memory of 1, 32 -> 2.10x; adapter publish 32 ms (disk 118 ms)"
    )


def test_the_last_line_says_what_was_not_measured() -> None:
    line = summary_line({1: 800.0, 8: 900.0}, {"disk": 120.0})
    assert line == (
        "tenants: 8 -> 1.12x memory of 1, 32 -> not measured; "
        "adapter publish not measured (disk 120 ms)"
    )


def test_each_figure_is_judged_against_its_goal() -> None:
    lines = verdicts(
        {1: 800.0, 8: 1040.0, 32: 1680.0}, {1: 100.0, 8: 89.0}, {"memory": 50.0, "disk": 90.0}
    )
    assert lines == [
        "PASS memory, 8 tenants against 1: 1.30x (<= 1.30x)",
        "FAIL memory, 32 tenants against 1: 2.10x (<= 2.00x)",
        "FAIL step throughput, 8 against 1: 0.89x (>= 0.90x)",
        "PASS adapter publish from memory: 50 ms median (<= 50 ms)",
    ]


def test_an_unmeasured_figure_fails_its_goal() -> None:
    lines = verdicts({1: 800.0}, {}, {"disk": 90.0})
    assert lines == [
        "FAIL memory, 8 tenants against 1: not measured (goal <= 1.30x)",
        "FAIL memory, 32 tenants against 1: not measured (goal <= 2.00x)",
        "FAIL step throughput, 8 against 1: not measured (goal >= 0.90x)",
        "FAIL adapter publish from memory: not measured (<= 50 ms)",
    ]
