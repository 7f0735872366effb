"""The regression guard (`onthejob learn --guard FILE`): its decisions, and the operator's say.

Read: what the running learner guards with, every decision (per type: before, after, drop,
the drop allowed, regressed, waived), the waiver waiting for the next version and the types
an operator pinned. Write: a waiver for the next version, a type pinned protected (or not),
and the acceptance of a version the guard rolled back (it is served again, like promote,
and its scores become the baseline the next version is judged against).
See learner/guard.py for the rule and store/guard_records.py for where it is kept.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from proxy.admin.deps import EngineDep, StateDep
from proxy.admin.errors import AdminError, not_found
from proxy.admin.schemas import Key, Text
from proxy.admin.swaps import serve_again
from store import guard_records, learner_state, policy_versions
from store.json_types import JsonObject

router = APIRouter(tags=["guard"])


class WaiverIn(BaseModel):
    """Let the next version through the guard: for these types, or (null) every
    unprotected type. A protected type is waived only when named."""

    model_config = ConfigDict(extra="forbid")

    types: list[Key] | None = Field(None, max_length=100)
    reason: Text = Field("", max_length=2000)


class Waiver(TypedDict):
    """The waiver as kept for the next version (the learner consumes it)."""

    types: list[str] | None  # None: every unprotected type
    reason: str
    at: str


class GuardView(TypedDict):
    config: JsonObject | None  # what the running learner guards with (learner/guard.py)
    protected: dict[str, bool]  # type -> pinned protected (or not), over the file
    waiver: Waiver | None
    decisions: list[JsonObject]  # newest first, as recorded


class WaiverChanged(TypedDict):
    ok: bool
    waiver: Waiver | None


class ProtectedChanged(TypedDict):
    ok: bool
    protected: dict[str, bool]


class ProtectedIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    protected: bool = Field(description="no drop beyond the eval's noise is let through")


@router.get(
    "/guard",
    summary="The regression guard: settings, waiver, decisions",
    response_model=dict,  # serialised as returned (GuardView)
)
def get_guard(engine: EngineDep, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> GuardView:
    """`decisions`: newest first; `outcome` is kept, rolled_back, waived or accepted. `config`
    is null until a learner ran with --guard."""
    with engine.connect() as conn:
        return {
            "config": learner_state.get_state(conn, guard_records.CONFIG),
            "protected": guard_records.protected_overrides(conn),
            "waiver": learner_state.get_state(conn, guard_records.WAIVER),
            "decisions": guard_records.decisions(conn)[::-1][:limit],
        }


@router.put(
    "/guard/waiver",
    summary="Let the next version through the guard",
    response_model=dict,  # serialised as returned (WaiverChanged)
)
def put_waiver(engine: EngineDep, waiver: WaiverIn) -> WaiverChanged:
    state: Waiver = {"types": waiver.types, "reason": waiver.reason, "at": guard_records.now_iso()}
    with engine.begin() as conn:
        learner_state.set_state(conn, guard_records.WAIVER, state)
    return {"ok": True, "waiver": state}


@router.delete(
    "/guard/waiver",
    summary="Withdraw the waiver",
    response_model=dict,  # serialised as returned (WaiverChanged)
)
def delete_waiver(engine: EngineDep) -> WaiverChanged:
    with engine.begin() as conn:
        learner_state.set_state(conn, guard_records.WAIVER, None)
    return {"ok": True, "waiver": None}


@router.put(
    "/guard/types/{name}/protected",
    summary="Pin a type protected, or unpin it",
    response_model=dict,  # serialised as returned (ProtectedChanged)
)
def put_protected(
    engine: EngineDep, name: Annotated[Key, Path()], body: ProtectedIn
) -> ProtectedChanged:
    """Overrides the guard file's `protected` for this type from the next decision on."""
    with engine.begin() as conn:
        overrides = guard_records.protected_overrides(conn)
        overrides[name] = body.protected
        learner_state.set_state(conn, guard_records.PROTECTED, overrides)
    return {"ok": True, "protected": overrides}


@router.delete(
    "/guard/types/{name}/protected",
    summary="Back to the guard file's setting",
    response_model=dict,  # serialised as returned (ProtectedChanged)
)
def delete_protected(engine: EngineDep, name: Annotated[Key, Path()]) -> ProtectedChanged:
    with engine.begin() as conn:
        overrides = guard_records.protected_overrides(conn)
        if name not in overrides:
            raise not_found("protected override", name)
        del overrides[name]
        learner_state.set_state(conn, guard_records.PROTECTED, overrides)
    return {"ok": True, "protected": overrides}


@router.post("/guard/accept/{version}", summary="Serve a version the guard rolled back")
async def accept(engine: EngineDep, state: StateDep, version: Annotated[Key, Path()]):
    """The regression is wanted: the version serves again (as `VERSION+rollback-N`, like
    promote), the acceptance is recorded as a decision, and the learner trains on from it."""
    with engine.connect() as conn:
        row = policy_versions.version(conn, version=version)
    if row is None:
        raise not_found("policy version", version)
    guard = (row["metrics"] or {}).get("guard")
    if row["status"] != "rolled_back" or not isinstance(guard, dict):
        raise AdminError(409, f"version {version!r} was not rolled back by the guard")
    label = await serve_again(engine, version, "promote", state.settings.gate_wait)
    entry = {
        "version": version,
        "kept": guard.get("kept"),
        "step": guard.get("step"),
        "outcome": "accepted",
        "reason": "accepted by an operator: " + str(guard.get("reason", "")),
        "trained_types": guard.get("trained_types", []),
        "waiver": None,
        "types": guard.get("types", []),
        "serving_after": label,
        "at": guard_records.now_iso(),
    }
    with engine.begin() as conn:
        guard_records.append_decision(conn, entry)
    return {"ok": True, "action": "accept", "from": version, "serving": label}
