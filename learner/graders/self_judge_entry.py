"""What a self-judge verdict leaves in a grade's detail, under "self_judge": the reward it
gave, or why it gave none, and for a shadow verdict the ground truth beside it (the admin
API's /self-judge reads them back: proxy/admin/selfjudge.py)."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from learner.graders.base import Grade
from store.json_types import JsonObject

SELF_JUDGE = "self_judge"  # its key in a grade's detail


class Truth(TypedDict):
    source: str  # what graded it: "reference", "python+reference", "feedback", ...
    reward: float


class SelfJudgeEntry(TypedDict):
    type: str | None  # the trajectory's interaction type
    rubric: str | None  # whose rubric judged it: "type" (its own) or "default"
    reward: float | None
    detail: JsonObject  # the judge grader's own
    error: NotRequired[str]
    transient: NotRequired[bool]  # with `error`: the judge may answer later
    shadow: NotRequired[bool]  # judged beside a ground truth: never the reward
    truth: NotRequired[Truth]


def entry_of(
    interaction_type: str | None, rubric_source: str | None, grade: Grade
) -> SelfJudgeEntry:
    entry: SelfJudgeEntry = {
        "type": interaction_type,
        "rubric": rubric_source,
        "reward": grade.reward,
        "detail": grade.detail,
    }
    if grade.error is not None:
        entry["error"] = grade.error
        entry["transient"] = grade.transient
    return entry


def shadow_entry(entry: SelfJudgeEntry, truth: Truth) -> SelfJudgeEntry:
    """A verdict given beside a ground truth, with that truth."""
    shadowed = entry.copy()
    shadowed["shadow"] = True
    shadowed["truth"] = truth
    return shadowed


def as_grade(entry: SelfJudgeEntry) -> Grade:
    """A self-judge entry as the trajectory's grade."""
    detail: JsonObject = {SELF_JUDGE: entry}
    if "error" in entry:
        error = f"{SELF_JUDGE}: {entry['error']}"
        return Grade(None, detail, error=error, transient=bool(entry.get("transient")))
    return Grade(entry["reward"], detail)
