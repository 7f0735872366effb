"""bench/tenants.py's report over seeds, its defaults, and the toys' held-out prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import tenants as bench
from bench.tenants import ArmResult, choose_arms, report, shares_vs_alone, slower_tenant
from learner.toys.tenants import SPLITS, TOYS

YES, NO = TOYS["yesno"]


def arm(name: str, seed: int, **gains: float) -> ArmResult:
    """A row whose tenants (yes, no) start at 0.2 and gain what is given."""
    return ArmResult(
        name,
        seed,
        before={t: 0.2 for t in gains},
        after={t: 0.2 + g for t, g in gains.items()},
        steps=6,
        minutes=5.0,
    )


def run(seeds: tuple[int, ...] = (3, 4, 5)) -> list[ArmResult]:
    rows = []
    for seed in seeds:
        rows += [
            arm("alone:yes", seed, yes=0.6),
            arm("alone:no", seed, no=0.4),
            arm("shared", seed, yes=0.6, no=-0.2),
            arm("per_tenant", seed, yes=0.3 + 0.1 * (seed - 3), no=0.4),
        ]
    return rows


@pytest.mark.parametrize("toy", sorted(TOYS))
def test_each_toy_is_measured_on_prompts_it_never_trains_on(toy: str) -> None:
    train, heldout = SPLITS[toy]
    assert len(train) == len(heldout) == 8
    assert not set(train) & set(heldout)


def test_every_row_is_printed_and_the_headline_is_the_per_tenant_arms_slower_tenant() -> None:
    lines, out = report(run(), (YES, NO))
    rows = [line for line in lines if len(line.split()) == 8 and line.split()[1].isdigit()]
    assert len(rows) == 18
    # per seed the slower tenant's share is yes's: 0.5, 0.667, 0.833
    assert lines[-1] == (
        "per-tenant gain vs alone, the slower tenant: 0.67 [0.25, 1.08] (seeds 3, 4, 5)"
    )
    shared = "shared policy gain vs alone, the slower tenant: -0.50 [-0.50, -0.50] (seeds 3, 4, 5)"
    assert shared in lines
    assert out["per_tenant_vs_alone"]["seeds"] == (3, 4, 5)


def test_a_gain_over_the_seeds_is_printed_for_every_arm_and_tenant() -> None:
    lines, _ = report(run(), (YES, NO))
    gains = [line for line in lines if line.startswith("  ")]
    assert len(gains) == 6
    assert gains[0].split()[:3] == ["alone:yes", "yes", "+0.600"]


def test_a_seed_where_a_tenant_gained_nothing_alone_is_left_out_and_named() -> None:
    rows = run()
    rows[1 + 4] = arm("alone:no", 4, no=0.0)  # seed 4: no did not learn alone
    shares = shares_vs_alone(rows, "per_tenant")
    assert set(shares[4]) == {YES}
    summary, left_out = slower_tenant(shares, (YES, NO))
    assert summary is not None and summary.seeds == (3, 5) and left_out == [4]
    lines, _ = report(rows, (YES, NO))
    assert lines[-1].endswith("(left out, no gain alone: seeds 4)")
    assert "not a learning figure" in lines[-1]


def test_without_a_per_tenant_arm_the_headline_is_the_shared_arms() -> None:
    rows = [r for r in run() if r.arm != "per_tenant"]
    lines, _ = report(rows, (YES, NO))
    assert lines[-1] == (
        "shared policy gain vs alone, the slower tenant: -0.50 [-0.50, -0.50] (seeds 3, 4, 5)"
    )
    alone = [r for r in rows if r.arm.startswith("alone:")]
    assert report(alone, (YES, NO))[0][-1].endswith("not measured (no shared or per_tenant arm)")


def test_the_default_arms_are_consistent_and_the_per_tenant_arm_implies_lora() -> None:
    alone = ["alone:more-a", "alone:fewer-a"]
    assert choose_arms("letter", None, lora=False) == ([*alone, "shared"], False)
    assert choose_arms("letter", None, lora=True) == ([*alone, "shared", "per_tenant"], True)
    assert choose_arms("yesno", "shared,per_tenant", lora=False) == (
        ["shared", "per_tenant"],
        True,
    )
    with pytest.raises(ValueError, match="unknown arms"):
        choose_arms("letter", "alone:yes", lora=False)


def test_a_plain_run_gets_past_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m bench.tenants` failed at once on its defaults; now it reaches the model."""

    class Reached(Exception):
        pass

    def reached(*_: object, **__: object) -> None:
        raise Reached

    monkeypatch.setattr(bench, "build_tiny_model", reached)
    with pytest.raises(Reached):
        bench.main([])


def test_an_upstream_is_used_as_it_is_and_needs_the_model_it_serves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--upstream", "http://127.0.0.1:1"])
    assert "--upstream needs --model" in capsys.readouterr().err

    class Reached(Exception):
        pass

    seen: list[tuple[str, Path]] = []

    def served(url: str, model_dir: Path, work: Path) -> None:
        seen.append((url, model_dir))
        raise Reached

    def started(*_: object, **__: object) -> None:
        pytest.fail("a vLLM was started beside the upstream")

    monkeypatch.setattr(bench, "VLLMServer", started)
    monkeypatch.setattr(bench, "Served", served)
    with pytest.raises(Reached):
        bench.main(["--upstream", "http://127.0.0.1:1", "--model", str(tmp_path)])
    assert seen == [("http://127.0.0.1:1", tmp_path.resolve())]
