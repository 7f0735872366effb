"""Eval numbers: per-task success of a policy version (mean reward, pass@1, pass@k), and the
`onthejob eval-report` table of policy versions x task sets.

A run succeeds when its reward reaches the success threshold. pass@k is the unbiased
estimator 1 - C(n-c, k) / C(n, k) over the n graded runs of a task, c of them successes
(k is at most n). Runs without a reward (cancelled, ungradable) are not counted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from math import comb
from typing import TypedDict


class GradedRun(TypedDict):
    """What `summarise` reads of a rollout run (store.rollouts.runs_of's rows)."""

    rollout_id: str
    task_set: str
    task_key: str
    policy_version: str | None
    reward: float | None


class RunOrigin(TypedDict):
    rollout_id: str
    task_set: str


class EvalResult(RunOrigin):
    """One row of eval_results: a task's runs by one policy version."""

    policy_version: str | None
    task_key: str
    runs: int
    successes: int
    mean_reward: float
    pass_at_1: float
    k: int
    pass_at_k: float


class VersionSetResult(TypedDict):
    """A policy version's results on a task set (`eval-report`)."""

    policy_version: str | None
    task_set: str
    tasks: int
    runs: int
    mean_reward: float
    pass_at_1: float
    k: int
    pass_at_k: float


def pass_at_k(n: int, c: int, k: int) -> float:
    if n <= 0 or k <= 0:
        return 0.0
    k = min(k, n)
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarise(runs: Iterable[GradedRun], *, k: int, threshold: float) -> list[EvalResult]:
    """One row per (task, policy version) from rollout runs: the eval_results columns."""
    rewards: dict[tuple[str, str | None], list[float]] = defaultdict(list)
    meta: dict[tuple[str, str | None], RunOrigin] = {}
    for run in runs:
        if run["reward"] is None:
            continue
        key = (run["task_key"], run["policy_version"])
        rewards[key].append(float(run["reward"]))
        meta[key] = {"rollout_id": run["rollout_id"], "task_set": run["task_set"]}
    rows: list[EvalResult] = []
    for (task_key, version), values in rewards.items():
        n = len(values)
        c = sum(1 for value in values if value >= threshold)
        rows.append(
            {
                **meta[(task_key, version)],
                "policy_version": version,
                "task_key": task_key,
                "runs": n,
                "successes": c,
                "mean_reward": sum(values) / n,
                "pass_at_1": c / n,
                "k": min(k, n),
                "pass_at_k": pass_at_k(n, c, k),
            }
        )
    return sorted(rows, key=lambda r: (r["task_key"], r["policy_version"] or ""))


def by_version_and_set(
    results: Iterable[EvalResult], *, order: dict[str, int]
) -> list[VersionSetResult]:
    """eval_results rows combined per (policy version, task set), oldest version first.

    mean reward and pass@1 are weighted by runs; pass@k is the mean over tasks.
    """
    cells: dict[tuple[str | None, str], list[EvalResult]] = defaultdict(list)
    for row in results:
        cells[(row["policy_version"], row["task_set"])].append(row)
    out: list[VersionSetResult] = []
    for (version, task_set), rows in cells.items():
        runs = sum(r["runs"] for r in rows)
        out.append(
            {
                "policy_version": version,
                "task_set": task_set,
                "tasks": len({r["task_key"] for r in rows}),
                "runs": runs,
                "mean_reward": sum(r["mean_reward"] * r["runs"] for r in rows) / runs,
                "pass_at_1": sum(r["successes"] for r in rows) / runs,
                "k": max(r["k"] for r in rows),
                "pass_at_k": sum(r["pass_at_k"] for r in rows) / len(rows),
            }
        )
    unknown = len(order) + 1
    return sorted(
        out,
        key=lambda r: (
            order.get(r["policy_version"] or "", unknown),
            r["policy_version"] or "",
            r["task_set"],
        ),
    )


def format_table(
    rows: Sequence[EvalResult] | Sequence[VersionSetResult], *, per_task: bool = False
) -> str:
    """A plain text table: per version and task set (`eval-report`), or per version and
    task (the end of an eval rollout)."""
    second, third = ("task", "task_key") if per_task else ("task set", "task_set")
    header = ["policy version", second, "tasks", "runs", "mean reward", "pass@1", "pass@k"]
    lines = [header]
    for r in rows:
        lines.append(
            [
                str(r.get("policy_version") or "?"),
                str(r.get(third, "")),
                str(r.get("tasks", 1)),
                str(r["runs"]),
                f"{r['mean_reward']:.3f}",
                f"{r['pass_at_1']:.3f}",
                f"{r['pass_at_k']:.3f} (k={r['k']})",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = ("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines)
    return "\n".join(text.rstrip() for text in rendered)
