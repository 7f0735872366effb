"""Training samples built from recorded token ids (never re-tokenised text).

A Sample is flat `token_ids` + `loss_mask` + `logprobs` of equal length. Stitching rule:
within a trajectory, a call's prompt + completion is merged with the next call when the next
call's prompt starts with exactly those tokens (the next turn extends the conversation);
otherwise a new sample starts. Loss is only on tokens the model sampled (completions);
prompt, tool output and environment tokens are masked. A call whose capture is incomplete
or failed, or whose sampling the trainer cannot reproduce, or that a teacher answered (not
the student's tokens), contributes no trainable tokens and breaks the chain.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from store.trajectory_record import RecordedSampling, Trajectory, TrajectoryCall

# vLLM samples greedily below this temperature (and then ignores top-p, top-k and min-p)
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class Sampling:
    """The processing vLLM applied before it reported a token's logprob
    (`--logprobs-mode processed_logprobs`), in its order: repetition, frequency and presence
    penalties, then temperature, min-p, top-k and top-p. A top-k of 0 or less is off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def penalised(self) -> bool:
        """Whether the tokens seen before a position change its logprobs."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @classmethod
    def from_record(cls, recorded: RecordedSampling) -> Sampling:
        """From a call's recorded effective sampling (proxy/upstream/sampling.py)."""

        def value(found: float | None, default: float) -> float:
            return default if found is None else float(found)

        penalties = {
            "repetition_penalty": value(recorded.get("repetition_penalty"), 1.0),
            "presence_penalty": value(recorded.get("presence_penalty"), 0.0),
            "frequency_penalty": value(recorded.get("frequency_penalty"), 0.0),
        }
        temperature = value(recorded.get("temperature"), 1.0)
        if temperature < GREEDY_BELOW:
            # greedy: vLLM's logprobs are the penalised logits' plain log-softmax
            return cls(**penalties)
        return cls(
            temperature=temperature,
            top_p=value(recorded.get("top_p"), 1.0),
            top_k=int(value(recorded.get("top_k"), 0)),
            min_p=value(recorded.get("min_p"), 0.0),
            **penalties,
        )


@dataclass
class Sample:
    trajectory_id: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    # recorded vLLM logprob of each sampled token; 0.0 where the mask is False
    logprobs: list[float] = field(default_factory=list)
    sampling: Sampling = field(default_factory=Sampling)
    # [start, end) of each call's completion in token_ids: what vLLM's penalties count as
    # that call's output (its prompt is everything before start)
    completions: list[tuple[int, int]] = field(default_factory=list)
    # the call each of `completions` came from
    call_ids: list[str] = field(default_factory=list)
    policy_versions: set[str | None] = field(default_factory=set)
    truncated: bool = False  # some completion hit max_tokens
    # a completion that hit max_tokens is not its trajectory's last reply: later turns, not
    # that cut reply, earned the trajectory's grade (learner/trainer.py truncated_trains)
    cut_before_last: bool = False
    # per-token advantages (per-turn credit, learner/turn_credit.py); None: the sample's
    # one advantage applies to every token
    token_advantages: list[float] | None = None

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)

    def extend(
        self, prompt: list[int], completion: list[int], logprobs: list[float], call_id: str = ""
    ) -> None:
        """Append a call whose prompt starts with this sample's tokens."""
        new_context = prompt[len(self.token_ids) :]
        self.token_ids += new_context
        start = len(self.token_ids)
        self.token_ids += completion
        self.completions.append((start, len(self.token_ids)))
        self.call_ids.append(call_id)
        self.loss_mask += [False] * len(new_context) + [True] * len(completion)
        self.logprobs += [0.0] * len(new_context) + list(logprobs)


def call_sampling(call: TrajectoryCall) -> Sampling | str:
    """The sampling vLLM applied to a call, or why the trainer cannot reproduce it.

    The proxy records what vLLM applied (the request's parameters, else the replica's
    defaults, whatever its `--generation-config`); a call recorded without it is not
    guessed at. Other logits processing (logit bias, structured output, ...) is not
    reproduced.
    """
    recorded = call.sampling
    if recorded is None:
        return "sampling unknown"
    constraints = recorded.get("constraints") or []
    if constraints:
        return str(constraints[0])
    return Sampling.from_record(recorded)


def _capture_problem(call: TrajectoryCall) -> str | None:
    if call.teacher is not None:
        # another model's tokens: the supervised stage renders them again for the student
        return "teacher answered"
    if call.status != "ok":
        return "failed"
    if not call.capture_complete or call.prompt_token_ids is None:
        return "incomplete capture"
    if not call.completion_token_ids:
        return "no completion"
    return None


def build_samples(trajectory: Trajectory, *, skipped: Counter[str] | None = None) -> list[Sample]:
    """Samples of one trajectory. A call that cannot be trained on is counted in `skipped`
    by its reason."""
    samples: list[Sample] = []
    current: Sample | None = None
    last = len(trajectory.calls) - 1
    for index, call in enumerate(trajectory.calls):
        problem = _capture_problem(call)
        sampling = call_sampling(call) if problem is None else problem
        if isinstance(sampling, str):
            if skipped is not None:
                skipped[sampling] += 1
            current = None  # unknown tokens in between: nothing may extend across them
            continue
        # a capture problem otherwise: both are there
        prompt = list(call.prompt_token_ids or [])
        completion = list(call.completion_token_ids or [])
        extends = (
            current is not None
            and current.sampling == sampling
            and prompt[: len(current.token_ids)] == current.token_ids
        )
        if not extends:
            current = Sample(trajectory_id=trajectory.id, sampling=sampling)
            samples.append(current)
        assert current is not None
        current.extend(prompt, completion, call.completion_logprobs or [], call.id)
        current.policy_versions.add(call.policy_version)
        cut = call.finish_reason == "length"
        current.truncated |= cut
        current.cut_before_last |= cut and index < last
    return samples
