"""Per-turn credit: each judged reply trains on its own signal, the others not at all."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from learner.trainer import Trainer, TrainerConfig
from learner.turn_credit import credited, turn_advantages, turn_values
from store.samples import Sample, build_samples
from store.trajectory_record import Trajectory, TrajectoryCall

SIGNALS = [{"call_id": "b", "turn": 3, "value": -1.0, "rule": "corrected", "evidence": "No."}]


def test_signals_are_read_from_the_grader_or_its_entry_in_a_combination() -> None:
    assert turn_values({"signals": SIGNALS}) == {"b": -1.0}
    combined = {"rollout_run": "r1", "next_turn": {"reward": 0.3, "detail": {"signals": SIGNALS}}}
    assert turn_values(combined) == {"b": -1.0}
    assert turn_values({"reference": "42"}) == {} and turn_values(None) == {}


def test_a_judged_reply_is_compared_with_its_type_s_mean_reply() -> None:
    advantages = turn_advantages(
        replies={"t1": ["a", "b", "c"], "t2": ["d", "e"], "t3": ["f"]},
        values={"t1": {"b": -1.0}, "t2": {"d": 1.0, "zz": 1.0}, "t3": {"f": 1.0}},
        types={"t1": "chat", "t2": "chat", "t3": "other"},
    )
    # chat replies: -1, 0, 0 (t1) and 1, 0 (t2): mean 0; "zz" is no reply of t2's
    assert advantages == {"t1": {"b": -1.0}, "t2": {"d": 1.0}, "t3": {"f": 0.0}}


def test_answers_to_one_prompt_are_compared_with_each_other_first() -> None:
    """A GRPO group's judged replies are their own baseline (a hard prompt all got wrong
    teaches nothing, as in GRPO); a trajectory alone in its group falls back to its type."""
    replies = {"g1": ["a", "b"], "g2": ["c", "d"], "g3": ["e"], "h1": ["f"], "h2": ["g"]}
    values = {"g1": {"a": 1.0}, "g2": {"c": -1.0}, "g3": {"e": -1.0},
              "h1": {"f": -1.0}, "h2": {"g": -1.0}}  # fmt: skip
    groups = {"g1": "group:g", "g2": "group:g", "g3": "group:g", "h1": "group:h", "h2": "group:h"}
    types = dict.fromkeys(replies, "chat")
    advantages = turn_advantages(replies, values, types, groups)
    assert advantages["g1"] == {"a": pytest.approx(1 + 1 / 3)}
    assert advantages["g2"] == {"c": pytest.approx(-1 + 1 / 3)}
    assert advantages["h1"] == {"f": 0.0} and advantages["h2"] == {"g": 0.0}
    alone = turn_advantages({"s": ["x", "y"]}, {"s": {"x": -1.0}}, {"s": "chat"}, {"s": "task:s"})
    assert alone == {"s": {"x": -0.5}}  # its type's mean reply: (-1 + 0) / 2


def _trajectory() -> Trajectory:
    """Two calls stitched into one sample: a (prompt 1 2, reply 3 4) then b (5, reply 6 7)."""

    def call(cid: str, prompt: list[int], completion: list[int]) -> TrajectoryCall:
        return TrajectoryCall(
            cid,
            "completions",
            capture_complete=True,
            sampling={},
            finish_reason="stop",
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=[-1.0] * len(completion),
        )

    return Trajectory("t1", (call("a", [1, 2], [3, 4]), call("b", [1, 2, 3, 4, 5], [6, 7])))


def test_only_the_credited_reply_carries_loss_with_its_own_advantage() -> None:
    [sample] = build_samples(_trajectory())
    assert sample.call_ids == ["a", "b"] and sample.completions == [(2, 4), (5, 7)]
    turned = credited(sample, {"b": -0.5})
    assert turned.loss_mask == [False] * 5 + [True, True]
    assert turned.token_advantages == [0.0] * 5 + [-0.5, -0.5]
    assert sample.loss_mask == [False, False, True, True, False, True, True]  # untouched
    assert credited(sample, {}).trained_tokens == 0


def test_a_per_turn_step_trains_only_the_credited_turn(tmp_path: Path) -> None:
    """The step on a credited sample is the step on the same tokens with only that turn's
    completion in the mask: the other turn's tokens contribute nothing to the gradient."""
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    model = load_model(build_tiny_model(tmp_path / "m", seed=0))
    ids = [1, 10, 20, 30, 40, 50, 60, 70]
    completions = [(2, 4), (5, 8)]
    on_policy = Trainer(copy.deepcopy(model), TrainerConfig(), device="cpu")
    logprobs = [0.0, 0.0, *on_policy.logprobs_of(ids[:2], ids[2:])]
    sample = Sample("t", ids, [False, False, True, True, False, True, True, True], logprobs,
                    completions=completions, call_ids=["a", "b"])  # fmt: skip
    only_b = Sample("t", ids, [False] * 5 + [True] * 3, logprobs, completions=completions,
                    call_ids=["a", "b"])  # fmt: skip
    moved = []
    for trained, advantage in ((credited(sample, {"b": -1.0}), 0.0), (only_b, -1.0)):
        trainer = Trainer(copy.deepcopy(model), TrainerConfig(learning_rate=1e-2), device="cpu")
        metrics = trainer.step([trained], [advantage])
        assert metrics["trained_tokens"] == 3
        moved.append(torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
    assert torch.allclose(moved[0], moved[1], atol=1e-7)
    original = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.allclose(moved[0], original)
    with pytest.raises(ValueError, match="advantages must be"):
        from learner.loss import LossBatch, LossConfig, policy_loss

        bad = LossBatch(torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(2, 3),
                        torch.ones(1, 3, dtype=torch.bool))  # fmt: skip
        policy_loss(bad, LossConfig(), total_tokens=3)
