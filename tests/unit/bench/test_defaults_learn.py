"""The defaults bench's report and verdict (bench/defaults_learn.py), on hand-made rows: the
last line's form and numbers, the per-seed ratio, the order of the arms, the requests."""

from __future__ import annotations

import dataclasses
import math
import os
import re

import pytest

from bench.defaults_learn import (
    ArmRow,
    Endpoint,
    GradedReply,
    arm_order,
    merged_rows,
    per_seed,
    percentile,
    provenance,
    ratio_summary,
    report,
    settings_differences,
    verdict,
    verdict_line,
)
from bench.defaults_tasks import sum_pattern

LAST_LINE = re.compile(
    r"defaults: gain per minute (\d+\.\d\d) x the bare loop \(live (-?\d+\.\d{3}) "
    r"\[(-?\d+\.\d{3}), (-?\d+\.\d{3})\], bare (-?\d+\.\d{3}) \[(-?\d+\.\d{3}), "
    r"(-?\d+\.\d{3})\]; seeds ([\d, ]+); models (.+); families (.+)\)"
)


def row(seed: int, arm: str, gain: float, *, family: str = "arithmetic", minutes: float = 2.0,
        model: str = "smollm2-135m") -> ArmRow:  # fmt: skip
    return ArmRow(model, family, seed, arm, before=0.2, after=0.2 + gain, minutes=minutes,
                  steps=5)  # fmt: skip


def rows_of(live: dict[int, float], bare: dict[int, float], **kwargs: object) -> list[ArmRow]:
    return [row(s, "live", g, **kwargs) for s, g in live.items()] + [  # type: ignore[arg-type]
        row(s, "bare", g, **kwargs)  # type: ignore[arg-type]
        for s, g in bare.items()
    ]


def test_gain_per_minute_is_the_held_out_gain_over_the_arms_own_minutes() -> None:
    r = ArmRow("m", "sentiment", 3, "live", before=0.25, after=0.75, minutes=2.5, steps=4)
    assert r.gain == pytest.approx(0.5) and r.gain_per_minute == pytest.approx(0.2)
    assert math.isnan(ArmRow("m", "f", 3, "bare", 0.1, 0.2, 0.0, 0).gain_per_minute)


def test_the_last_line_names_the_ratio_both_arms_seeds_models_and_families() -> None:
    rows = rows_of({3: 0.4, 4: 0.6, 5: 0.8}, {3: 0.8, 4: 0.8, 5: 0.8})  # gain/min: halves
    rows += rows_of({3: 0.4, 4: 0.6, 5: 0.8}, {3: 0.8, 4: 0.8, 5: 0.8}, family="sentiment")
    last = report(rows).splitlines()[-1]
    found = LAST_LINE.fullmatch(last)
    assert found, last
    ratio, live, lo, hi, bare, bare_lo, bare_hi, seeds, models, families = found.groups()
    assert float(ratio) == pytest.approx(0.75)  # live 0.3 a minute, bare 0.4
    assert float(live) == pytest.approx(0.3) and float(bare) == pytest.approx(0.4)
    # live per seed 0.2, 0.3, 0.4: sd 0.1, t(2) 4.303
    assert float(hi) - float(live) == pytest.approx(4.303 * 0.1 / math.sqrt(3), abs=1e-3)
    assert float(lo) < float(live) < float(hi)
    assert float(bare_lo) == float(bare_hi) == pytest.approx(0.4)  # no spread
    assert seeds == "3, 4, 5" and models == "smollm2-135m"
    assert families == "arithmetic, sentiment"


def test_the_verdict_passes_at_0_8_and_needs_three_seeds_families_and_two_models() -> None:
    families = ("sentiment", "destination", "arithmetic")
    full = [
        r
        for f in families
        for m in ("smollm2-135m", "gemma3-270m")
        for r in rows_of({3: 0.8, 4: 0.9, 5: 1.0}, {3: 1.0, 4: 1.0, 5: 1.0}, family=f, model=m)
    ]
    v = verdict(full)
    assert v.ratio == pytest.approx(0.9) and not v.shortfalls and v.passed
    slow = [r for f in families for r in rows_of({3: 0.7, 4: 0.7, 5: 0.7},
            {3: 1.0, 4: 1.0, 5: 1.0}, family=f)]  # fmt: skip
    assert not verdict(slow).passed
    one = verdict(rows_of({3: 2.0}, {3: 1.0}))
    assert one.ratio == pytest.approx(2.0) and not one.passed
    assert one.shortfalls == [
        "1 seed(s), 3 needed",
        "1 family(ies), 3 needed",
        "1 model(s), 2 needed",
    ]
    assert "FAIL" in report(rows_of({3: 2.0}, {3: 1.0}))


def test_the_ratio_is_nan_when_the_bare_loop_gained_nothing() -> None:
    v = verdict(rows_of({3: 0.1, 4: 0.1, 5: 0.1}, {3: -0.1, 4: 0.0, 5: 0.0}))
    assert math.isnan(v.ratio)
    assert "gain per minute nan x the bare loop" in verdict_line(v)


def test_the_ratio_per_seed_leaves_out_seeds_where_bare_gained_nothing() -> None:
    rows = rows_of({3: 0.2, 4: 0.4, 5: 0.3}, {3: 0.4, 4: 0.4, 5: 0.0})
    summary, left_out = ratio_summary(rows)
    assert summary is not None and summary.seeds == (3, 4)
    assert summary.values == pytest.approx((0.5, 1.0))
    assert left_out == [5]
    assert "left out, the bare loop gained nothing: seeds [5]" in report(rows)


def test_a_seeds_overall_value_is_its_mean_over_models_and_families() -> None:
    rows = rows_of({3: 0.2}, {3: 0.4}) + rows_of({3: 0.6}, {3: 0.4}, model="gemma3-270m")
    assert per_seed(rows, "live") == pytest.approx({3: 0.2})  # (0.1 + 0.3) / 2 a minute
    text = report(rows)
    assert "smollm2-135m / arithmetic:" in text and "gemma3-270m / arithmetic:" in text


def test_arms_alternate_per_seed_bare_first() -> None:
    assert [arm_order(i) for i in range(4)] == [
        ("bare", "live"),
        ("live", "bare"),
        ("bare", "live"),
        ("live", "bare"),
    ]


def test_rows_print_the_live_arms_client_figures_only() -> None:
    live = ArmRow("tiny", "arithmetic", 3, "live", 0.0, 0.125, 0.5, 2, calls=40, errors=1,
                  p50_s=0.05, p99_s=1.5)  # fmt: skip
    bare = ArmRow("tiny", "arithmetic", 3, "bare", 0.0, 0.0, 0.52, 3)
    text = report([live, bare])
    (live_line,) = [
        line for line in text.splitlines() if line.startswith("tiny") and " live " in line
    ]
    assert live_line.split()[-4:] == ["40", "1", "0.05", "1.50"]
    (bare_line,) = [
        line for line in text.splitlines() if line.startswith("tiny") and " bare " in line
    ]
    assert bare_line.split()[-4:] == ["-", "-", "-", "-"]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None


def test_a_model_without_a_chat_template_is_sent_a_plain_prompt() -> None:
    chat = Endpoint("http://x", "m", chat=True, max_tokens=32).body("What is 1 + 2?", 4)
    plain = Endpoint("http://x", "m", chat=False, max_tokens=32)
    assert chat["messages"] == [{"role": "user", "content": "What is 1 + 2?"}]
    assert plain.body("What is 1 + 2?", 1)["prompt"] == "Q: What is 1 + 2?\nA:"
    assert plain.path == "/v1/completions" and "seed" not in chat
    # a base model's answer ends with its line; a chat reply ends with the turn
    assert plain.body("What is 1 + 2?", 1)["stop"] == ["\n"] and "stop" not in chat
    assert chat["temperature"] == 1.0 and chat["n"] == 4 and chat["max_tokens"] == 32


def test_a_reply_is_rewarded_by_its_tasks_reference() -> None:
    def reply(text: str) -> GradedReply:
        return GradedReply(0, [1], [2], [-0.1], text, answer=sum_pattern(3, 4))

    assert reply(" 7").reward == 1.0 and reply("17").reward == 0.0


def test_the_clients_first_and_last_64_rewards_need_128_calls() -> None:
    from bench.defaults_learn import first_and_last

    assert first_and_last([0.0] * 127) is None
    rewards = [0.0] * 64 + [0.5] * 10 + [1.0] * 64
    assert first_and_last(rewards) == (0.0, 1.0)
    assert first_and_last([0.0, 1.0] * 4, n=2) == (0.5, 0.5)


def test_the_verdict_needs_both_models() -> None:
    families = ("sentiment", "destination", "arithmetic")
    one_model = [
        r
        for f in families
        for r in rows_of({3: 0.9, 4: 0.9, 5: 0.9}, {3: 1.0, 4: 1.0, 5: 1.0}, family=f)
    ]
    assert verdict(one_model).shortfalls == ["1 model(s), 2 needed"]
    both = one_model + [
        r
        for f in families
        for r in rows_of(
            {3: 0.9, 4: 0.9, 5: 0.9}, {3: 1.0, 4: 1.0, 5: 1.0}, family=f, model="gemma3-270m"
        )
    ]
    assert verdict(both).passed


def test_gain_per_step_is_printed_beside_gain_per_minute() -> None:
    r = ArmRow("m", "sentiment", 3, "live", before=0.2, after=0.6, minutes=2.0, steps=8)
    assert r.gain_per_step == pytest.approx(0.05)
    assert math.isnan(ArmRow("m", "f", 3, "live", 0.1, 0.2, 1.0, 0).gain_per_step)
    text = report(rows_of({3: 0.4, 4: 0.5, 5: 0.6}, {3: 0.2, 4: 0.2, 5: 0.2}))
    # row() makes 5 steps: live 0.08, 0.10, 0.12 a step
    assert "live gain/step 0.1000" in text and "bare gain/step 0.0400" in text


def _payload(rows: list[ArmRow], commit: str, **settings: object) -> dict[str, object]:
    return {
        "rows": [dataclasses.asdict(r) for r in rows],
        "settings": {"minutes": 4.0, "dtype": "float32", **settings},
        "provenance": {"commit": commit, "host": "2 cores, AMD EPYC"},
    }


def test_runs_split_over_sessions_merge_into_one_report() -> None:
    first = rows_of({3: 0.4, 4: 0.5, 5: 0.6}, {3: 0.2, 4: 0.2, 5: 0.2})
    second = rows_of({3: 0.4, 4: 0.5, 5: 0.6}, {3: 0.2, 4: 0.2, 5: 0.2}, family="sentiment")
    rows, lines = merged_rows(
        [("a.json", _payload(first, "abc1234")), ("b.json", _payload(second, "def5678"))]
    )
    assert rows == first + second
    assert lines == [
        "rows from a.json: 6, at abc1234 on 2 cores, AMD EPYC",
        "rows from b.json: 6, at def5678 on 2 cores, AMD EPYC",
    ]
    assert verdict(rows).families == ("arithmetic", "sentiment")


def test_a_merged_run_with_other_settings_is_warned_of() -> None:
    rows = rows_of({3: 0.4}, {3: 0.2})
    _, lines = merged_rows(
        [("a.json", _payload(rows, "abc")), ("b.json", _payload(rows, "def", minutes=7.0))]
    )
    assert lines[-1] == "  warning: not the first run's settings: minutes (4.0 vs 7.0)"
    assert settings_differences({"dtype": "bfloat16"}, {"dtype": "float32"}) == [
        "dtype ('bfloat16' vs 'float32')"
    ]


def test_an_earlier_run_s_proxy_idle_timeout_is_compared_as_the_flag_it_gave() -> None:
    earlier, now = {"idle_timeout": 2.0}, {"proxy_args": []}
    assert settings_differences(earlier, now) == ["proxy_args (['--idle-timeout', '2.0'] vs [])"]
    assert settings_differences(earlier, {"proxy_args": ["--idle-timeout", "2.0"]}) == []


def test_provenance_names_the_commit_and_the_host() -> None:
    made = provenance()
    assert re.fullmatch(r"[0-9a-f]{7,}|unknown", made["commit"])
    assert made["host"].startswith(f"{os.cpu_count()} cores, ")
