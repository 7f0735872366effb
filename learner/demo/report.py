"""What `onthejob demo` shows at the end: a table per policy version and a PNG chart.

Numbers come from the database the demo recorded into (policy versions, training steps)
and from the rollout runs (which version answered each run, and its reward), so the table
says what really happened, not what was planned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store import db, policy_versions, training_steps


@dataclass(frozen=True)
class VersionRow:
    ordinal: int | None  # None: failed verification, never served
    version: str
    status: str
    trajectories: int  # training-round runs this version answered
    success_rate: float | None
    mean_reward: float | None
    tokens_trained: int | None  # by the step that made this version
    swap_seconds: float | None


@dataclass(frozen=True)
class EvalPoint:
    label: str  # "before" / "after"
    version: str | None
    success_rate: float
    runs: int


def version_rows(database_url: str, runs: Iterable[Any]) -> list[VersionRow]:
    """One row per policy version, joined with the runs (objects with ``policy_version``
    and ``reward``) that version answered."""
    by_version: dict[str, list[float]] = {}
    for run in runs:
        if run.policy_version is not None and run.reward is not None:
            by_version.setdefault(run.policy_version, []).append(float(run.reward))
    engine = db.make_engine(database_url)
    try:
        with engine.connect() as conn:
            versions = policy_versions.versions_created_order(conn)
            steps = training_steps.metrics_by_version(conn)
    finally:
        engine.dispose()
    rows = []
    for version in versions:
        rewards = by_version.get(version["version"], [])
        tokens = (steps.get(version["version"]) or {}).get("trained_tokens")
        rows.append(
            VersionRow(
                ordinal=version["ordinal"],
                version=version["version"],
                status=version["status"],
                trajectories=len(rewards),
                success_rate=_rate(rewards),
                mean_reward=sum(rewards) / len(rewards) if rewards else None,
                tokens_trained=int(tokens) if tokens is not None else None,
                swap_seconds=version["swap_seconds"],
            )
        )
    return rows


def _rate(rewards: list[float]) -> float | None:
    return sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else None


def format_table(rows: list[VersionRow]) -> str:
    header = ("version", "status", "trajectories", "success", "mean reward", "tokens", "swap s")
    lines = [header]
    for row in rows:
        lines.append(
            (
                row.version,
                row.status,
                str(row.trajectories),
                _pct(row.success_rate),
                "-" if row.mean_reward is None else f"{row.mean_reward:.3f}",
                "-" if row.tokens_trained is None else str(row.tokens_trained),
                "-" if row.swap_seconds is None else f"{row.swap_seconds:.2f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def write_chart(rows: list[VersionRow], evals: list[EvalPoint], path: Path) -> Path:
    """Success rate per policy version (training rounds) and held-out before/after."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    shown = [r for r in rows if r.success_rate is not None]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 1]}, constrained_layout=True
    )
    left.plot(
        [r.ordinal for r in shown],
        [100 * (r.success_rate or 0.0) for r in shown],
        marker="o",
        color="#2b6cb0",
    )
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("policy version (0 = the model before learning)")
    left.set_ylabel("success on training tasks (%)")
    left.set_ylim(0, 100)
    left.grid(alpha=0.3)
    left.set_title("success per policy version")
    right.bar(
        [e.label for e in evals],
        [100 * e.success_rate for e in evals],
        color=["#a0aec0", "#38a169"][: len(evals)],
    )
    right.set_ylim(0, 100)
    right.set_title("held-out tasks")
    for index, point in enumerate(evals):
        right.text(
            index, 100 * point.success_rate + 2, f"{100 * point.success_rate:.0f}%", ha="center"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
