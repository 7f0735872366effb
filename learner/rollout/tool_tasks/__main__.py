"""Write the tool tasks' train and held-out sets as task-set files (JSONL).

python -m learner.rollout.tool_tasks --out DIR [--seed 0] [--train 240] [--heldout 60]
writes DIR/tools-train.jsonl and DIR/tools-heldout.jsonl, ready for `onthejob rollout
--tasks` (or `onthejob tasks load`), and prints what it wrote.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from learner.rollout.tool_tasks.tasks import FAMILY, make_task_sets, write_jsonl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m learner.rollout.tool_tasks", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="the directory to write to")
    parser.add_argument("--seed", type=int, default=0, help="which tasks (default 0)")
    parser.add_argument("--train", type=int, default=240, help="train tasks (default 240)")
    parser.add_argument("--heldout", type=int, default=60, help="held-out tasks (default 60)")
    args = parser.parse_args(argv)
    if args.seed < 0 or args.train < 0 or args.heldout < 0:
        parser.error("--seed, --train and --heldout must be 0 or more")
    try:
        train, heldout = make_task_sets(args.seed, args.train, args.heldout)
    except ValueError as exc:
        parser.error(str(exc))
    for split, tasks in (("train", train), ("heldout", heldout)):
        path = write_jsonl(tasks, args.out / f"{FAMILY}-{split}.jsonl")
        kinds = Counter(task.kind for task in tasks)
        print(f"{path}: {len(tasks)} tasks ({', '.join(f'{k} {n}' for k, n in kinds.items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
