"""The rollout runner: learn from a closed harness *command* over a set of known tasks.

Command line: `onthejob rollout`, `onthejob eval-report`, `onthejob tasks load|list`
(cli/rollout.py). As a library::

    from learner.rollout import RolloutConfig, load_task_set, run_rollout

    summary = run_rollout(
        RolloutConfig(
            proxy_url="http://127.0.0.1:8080",
            command=["python", "agent.py", "{prompt}"],
            tasks=load_task_set("tasks.jsonl"),
            database_url="sqlite:///onthejob.db",   # the proxy's database
            group_size=4, concurrency=4, epochs=1, timeout=600, eval=False,
        ),
        on_progress=lambda p: print(p.done, p.total, p.running, p.failed, p.mean_reward),
        stop=threading.Event(),   # set it (from any thread) to cancel cleanly
    )
    summary.runs        # [RunResult(run_id, task_key, status, reward, policy_version, ...)]
    summary.eval_rows   # eval mode: per task and policy version (also in eval_results)

`on_progress` is called on the calling thread whenever a run starts or ends. Ctrl-C
(KeyboardInterrupt) or `stop` terminates running harnesses and returns what finished.

How runs become GRPO groups: each run's harness talks to the proxy under its own session
key, `rollout-<run id>` (base URL `PROXY/s/rollout-<run id>/v1`), and a `rollout_runs` row
joins that session key to the task, round and rollout. When the run has ended, the runner
grades it and, in one transaction, stamps its trajectories with task key = the task id and
group_key = `rollout:<rollout id>:<round>:<hash of task and policy version>`, finishes them
and writes their Grade. The learner never grades a rollout run's trajectory itself and holds
back a rollout group while any run of it is still running (store/grade_queue.py).
Modules: taskset (task sets, the task table), harness (one bounded process), grading (the
reward of a run), runner (the pool; its database writes are store/rollouts.py), report (eval
numbers), progress (the bar), curriculum (curriculum files and promotion rules),
curriculum_runner (`rollout --curriculum`: stages, rounds, evals, promotions; where a
curriculum stands is store/curricula.py), cli; tool_tasks, a bundled task family for agents
(multi-turn tool tasks with their tools, grader, stand-in teacher and agent).
"""

from __future__ import annotations

import importlib
from typing import Any

# imported on first use, so `onthejob --help` does not load the runner's dependencies
_EXPORTS = {
    "Progress": "learner.rollout.runner",
    "RolloutConfig": "learner.rollout.runner",
    "RolloutSummary": "learner.rollout.runner",
    "RunResult": "learner.rollout.runner",
    "run_rollout": "learner.rollout.runner",
    "TaskSet": "learner.rollout.taskset",
    "load_task_set": "learner.rollout.taskset",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'learner.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
