"""The supervised stage on a real store (SQLite and PostgreSQL): a recorded trajectory (an
Anthropic Messages call after a tool call, a chat call that calls a tool) becomes a sample
token-exact to the student's own rendering of the same messages; `learn --supervised-steps`
trains the tiny model on the passed ones, lowering its loss, publishes the result through
the usual publish (a stand-in publisher: no vLLM) and records it as a step, once; GRPO goes
on after it; the teacher's trajectories are found by calls.teacher."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from transformers import AutoTokenizer

from learner.config import LearnerConfig
from learner.loop import Learner
from learner.loop.supervised import ran_before
from learner.supervised.render import Renderer
from learner.swap.publisher import PublishResult
from learner.trainer import Trainer, TrainerConfig
from store import grade_queue, policy_versions, recording, supervised_sources, training_steps
from store.trajectory_loading import load_trajectories

CALCULATOR = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
}
AS_FUNCTION = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": CALCULATOR["input_schema"],
    },
}


def _messages_call(a: int, b: int) -> dict[str, Any]:
    """A Messages API call answered after the calculator's result."""
    return {
        "api": "messages",
        "request": {
            "model": "teacher",
            "system": "Use the calculator.",
            "tools": [CALCULATOR],
            "messages": [
                {"role": "user", "content": f"What is {a}+{b}?"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "c1",
                            "name": "calculator",
                            "input": {"expression": f"{a}+{b}"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "c1", "content": str(a + b)}
                    ],
                },
            ],
        },
        "response": {"type": "message", "content": [{"type": "text", "text": f"It is {a + b}."}]},
    }


def _chat_call(a: int, b: int) -> dict[str, Any]:
    """A chat call whose reply is the calculator call."""
    arguments = f'{{"expression": "{a}*{b}"}}'
    return {
        "api": "chat.completions",
        "request": {
            "model": "teacher",
            "tools": [AS_FUNCTION],
            "messages": [{"role": "user", "content": f"What is {a}*{b}?"}],
        },
        "response": {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "calculator", "arguments": arguments},
                            }
                        ],
                    }
                }
            ]
        },
    }


def _record(engine: Engine, trajectories: dict[str, tuple[dict[str, Any], float | None]]) -> None:
    """Finished trajectories of one call each; graded where a reward is given."""
    now = time.time()
    rows, calls = [], []
    for i, (tid, (call, _)) in enumerate(trajectories.items()):
        rows.append(
            {"id": tid, "session_key": f"s-{tid}", "task_key": None, "group_key": None,
             "status": "finished", "started_at": now + i, "last_call_at": now + i}
        )  # fmt: skip
        calls.append(
            {"id": f"{tid}-0", "trajectory_id": tid, "session_key": None, "status": "ok",
             "http_status": 200, "stream": False, "prompt_prefix_len": 0,
             "capture_complete": False, "started_at": now + i, "policy_version": None,
             "teacher": None, **call}
        )  # fmt: skip
    with engine.begin() as conn:
        recording.write_batch(conn, trajectories=rows, calls=calls)  # type: ignore[arg-type]
        for tid, (_, reward) in trajectories.items():
            if reward is not None:
                grade_queue.save_grade(
                    conn, trajectory_id=tid, reward=reward, detail={}, error=None
                )


def _own_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tools=[AS_FUNCTION], tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_a_recorded_tool_trajectory_is_token_exact_to_the_student_s_rendering(
    engine: Engine, tiny_model: Path
) -> None:
    _record(engine, {"m": (_messages_call(2, 3), 1.0), "c": (_chat_call(4, 5), None)})
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    renderer = Renderer(tokenizer, max_tokens=2048)
    loaded = {t.id: t for t in load_trajectories(engine, ids=["m", "c"])}
    call = {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "2+3"}},
    }
    expected_m = _own_ids(
        tokenizer,
        [
            {"role": "system", "content": "Use the calculator."},
            {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "It is 5."},
        ],
    )
    sample = renderer.render(loaded["m"])
    assert not isinstance(sample, str), sample
    assert sample.token_ids == expected_m
    trained = tokenizer.decode(
        [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
    )
    assert trained == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n'
        "</tool_call><|im_end|>It is 5.<|im_end|>"
    )
    multiplied = {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "4*5"}},
    }
    expected_c = _own_ids(
        tokenizer,
        [
            {"role": "user", "content": "What is 4*5?"},
            {"role": "assistant", "content": "", "tool_calls": [multiplied]},
        ],
    )
    sample = renderer.render(loaded["c"])
    assert not isinstance(sample, str) and sample.token_ids == expected_c


class _Publisher:
    """Stands in for vLLM: the checkpoint is taken as verified and the record committed."""

    def __init__(self) -> None:
        self.published: list[Path] = []
        self.upstreams = ["http://127.0.0.1:9"]  # one replica: no full-weight canary

    def publish(self, checkpoint: Path, version: str, *, expected: Any, commit: Any) -> Any:
        self.published.append(checkpoint)
        result = PublishResult(
            version=version, ok=True, swap_seconds=0.0, max_logprob_diff=0.0, error=None,
            weight_sums_compared=1,
        )  # fmt: skip
        commit(result)
        return result

    def close(self) -> None:
        pass


def _learner(db_url: str, tmp_path: Path, tiny_model: Path, **extra: Any) -> Learner:
    from learner.checkpoint import load_model

    config = LearnerConfig(
        database_url=db_url,
        model=str(tiny_model),
        graders=["feedback"],
        checkpoints=str(tmp_path / "ckpt"),
        **extra,
    )
    learner = Learner(config)
    with learner.state.engine.begin() as conn:
        if policy_versions.serving_version(conn) is None:
            policy_versions.add_version(
                conn, version="v0", ordinal=0, parent=None, checkpoint_path=str(tiny_model),
                status="serving",
            )  # fmt: skip
        learner.state.shared.serving = policy_versions.serving_version(conn)
    trainer = Trainer(load_model(tiny_model), TrainerConfig(), device="cpu")
    learner.state.shared.trainer = trainer
    learner.state.shared.publisher = _Publisher()  # type: ignore[assignment]
    return learner


def test_a_short_supervised_stage_lowers_the_loss_publishes_once_then_grpo_goes_on(
    db_url: str, engine: Engine, tmp_path: Path, tiny_model: Path
) -> None:
    _record(
        engine,
        {
            "m1": (_messages_call(2, 3), 1.0),
            "m2": (_messages_call(7, 1), 1.0),
            "c1": (_chat_call(4, 5), 1.0),
            "c2": (_chat_call(6, 2), 1.0),
            "failed": (_chat_call(1, 1), 0.0),  # below --supervised-min-reward
            "broken": (
                {**_chat_call(3, 3), "response": {"choices": [{"message": {
                    "role": "assistant", "tool_calls": [{"type": "function", "function": {
                        "name": "calculator", "arguments": "{3*3"}}]}}]}},
                1.0,
            ),  # a malformed tool call: a counted drop
        },
    )  # fmt: skip
    learner = _learner(
        db_url, tmp_path, tiny_model,
        supervised_steps=8, supervised_batch=4, supervised_learning_rate=1e-3,
    )  # fmt: skip
    try:
        assert learner.supervising.pending()
        assert learner.maybe_train()
        with learner.state.engine.connect() as conn:
            step = training_steps.latest_step(conn)
            assert ran_before(conn)
        assert step is not None and step["version"] is not None and step["step"] == 1
        metrics = step["metrics"]
        assert metrics["stage"] == "supervised" and metrics["supervised_trajectories"] == 5
        assert metrics["samples"] == 4
        assert metrics["supervised_dropped"] == {"malformed tool call": 1}
        assert metrics["loss"] < 0.8 * metrics["loss_first"], metrics
        assert learner.state.step == 1 and learner.state.shared.serving is not None
        assert learner.state.shared.serving["version"] == step["version"]
        assert not learner.supervising.pending()
        assert learner.state.shared.trainer is not None
        assert not learner.state.shared.trainer.optimizer.state  # GRPO starts afresh
        # the next look goes to GRPO: nothing of its own traffic yet, no step
        assert not learner.maybe_train()
        with learner.state.engine.connect() as conn:
            assert training_steps.step_count(conn) == 1
    finally:
        learner.state.engine.dispose()
    # a learner started again on the same store does not run the stage again
    again = _learner(db_url, tmp_path / "again", tiny_model, supervised_steps=8)
    try:
        assert not again.supervising.pending()
    finally:
        again.state.engine.dispose()


def test_the_teacher_s_trajectories_are_found_by_the_calls_it_answered(engine: Engine) -> None:
    _record(
        engine,
        {
            "taught": ({**_chat_call(2, 2), "teacher": "stand-in teacher"}, None),
            "own": (_chat_call(3, 3), 1.0),
        },
    )
    with engine.connect() as conn:
        assert supervised_sources.teacher_answered(conn, limit=10) == ["taught"]
        assert supervised_sources.passed(conn, min_reward=1.0, limit=10) == ["own"]
        assert supervised_sources.passed(conn, min_reward=1.5, limit=10) == []
