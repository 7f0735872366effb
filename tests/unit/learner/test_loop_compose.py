"""The learner's loop (issue 43): the Learner holds its parts and the parts hold the loop's
state and one another; no class in learner/loop inherits another of ours (the functions'
length: test_loop_length.py)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any

import learner.loop
from learner.config import LearnerConfig
from learner.loop.state import Lineage, LoopState
from learner.loop.tenants import Tenants
from learner.loop.weights import Weights


def _loop_classes() -> list[type]:
    modules = [
        importlib.import_module(f"learner.loop.{info.name}")
        for info in pkgutil.iter_modules(learner.loop.__path__)
    ]
    return [
        cls
        for module in modules
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__
    ]


def test_no_class_of_the_loop_inherits_one_of_ours() -> None:
    classes = _loop_classes()
    names = {c.__name__ for c in classes}
    assert {"Learner", "LoopState", "Lineage", "Stepping", "Publishing", "Tenants"} <= names
    for cls in classes:
        bases = [b for b in cls.__bases__ if b is not object]
        # an error is an exception; nothing else has a base
        assert bases == [] or issubclass(cls, BaseException), (cls, bases)


def _state(tmp_path: Path) -> LoopState:
    config = LearnerConfig(
        database_url=f"sqlite:///{tmp_path / 'db'}",
        model=str(tmp_path),
        checkpoints=str(tmp_path / "ckpt"),
        graders=["feedback"],
    )
    return LoopState(config, None, engine=None, grader=None)  # type: ignore[arg-type]


def test_a_tenants_turn_makes_its_lineage_the_parts_lineage_and_gives_it_back(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    shared = state.lineage
    assert shared is state.shared and state.tenant is None
    weights = Weights(state)
    tenants = Tenants(state, weights, *([None] * 3))  # type: ignore[arg-type]
    own = Lineage.fresh_for(state.config, "acme")
    with contextlib.suppress(RuntimeError), tenants.as_lineage(own):
        assert state.lineage is own and state.tenant == "acme"
        own.needs_restore = True  # a part writes the tenant's own state
        raise RuntimeError("whatever the block raised")
    assert state.lineage is shared and state.tenant is None
    assert own.needs_restore and not shared.needs_restore


def test_each_lineage_has_its_own_waits(tmp_path: Path) -> None:
    state = _state(tmp_path)
    one: Any = Lineage.fresh_for(state.config, "a")
    two: Any = Lineage.fresh_for(state.config, "b")
    assert one.fresh is not two.fresh and one.traffic is not two.traffic
    assert one.baselines is not two.baselines
