"""The demo's base model: a tiny Qwen2 given calculator-agent competence and one bad habit
by a short, seeded supervised warm-up, judged by a probe of what it can do, cached on disk.

A random-init model cannot call tools, so before the demo learns on the job it goes through
two supervised phases on synthetic dialogues (learner/demo/tasks.py):

1. **skill**: ideal dialogues only (question -> calculator tool call in Hermes format ->
   tool result -> the bare number), until the probe (learner/demo/probe.py) finds the model
   answering at least ``skill_target`` of its questions right at temperature 1;
2. **habit**: then, in chunks of ``habit_chunk`` steps at a tenth of the rate, dialogues of
   which a ``decline_share`` has the assistant decline ("Sorry, I cannot work that out.")
   instead of calling the tool, until the probe finds it declining inside ``decline_band``
   while still right in at least ``skill_floor`` of the episodes where it uses the tool, and
   answering right inside ``start_band``: where the demo's learning can show.

A declined question is graded wrong, so the model starts the demo with partial success, and
what it can learn on the job is clear and large: stop declining and use the calculator.

Judged by outcome, not by step count: the same seed trains differently on different CPUs
(AVX2, AVX-512 and AMX kernels sum in different orders, and this model learns to copy
numbers in a sudden drop of its loss whose timing is sensitive to that), so a fixed number
of steps gave a good model on one machine and 0% success on another. The probe runs every
``probe_every`` steps; a phase ends when its target is met, and a build that cannot meet
it within ``max_steps`` and ``max_habit_steps`` raises `WarmupFailed` with what was
reached. The attention starts as a copier (value and output projections at the identity,
``copy_init``), which is the circuit the skill needs: with random projections the model sat
on a loss plateau for over a thousand steps on some seeds and not on others.

Honest by construction: neither the warm-up nor its probe ever sees a prompt passed in
``exclude`` (the demo passes its train and held-out task prompts).

Library use::

    train, heldout = make_task_sets(seed=0, n_train=200, n_heldout=100)
    model_dir = build_demo_model(cache_dir, WarmupSettings(seed=0),
                                 exclude=[t["prompt"] for t in train + heldout])

The directory (``cache_dir/demo-<hash>``) is keyed by a hash of the settings, the recipe
version, the source of the modules that build it, the torch version and the excluded
prompts. It holds a transformers-format Qwen2 (float32,
``lm_head.weight`` written explicitly so vLLM's reload_weights never leaves the head stale),
a byte-level BPE tokenizer that splits digits one by one (as Qwen's does), the
ChatML/Hermes chat template of learner/tiny_model.py, and ``warmup.json`` with the
settings, both loss curves, every probe result, whether it passed, and timing. A cached
model whose recorded probe passed is reused at once; one that failed, or an interrupted
build, is rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from learner.demo.probe import ProbeFigures, ProbeResult, probe, probe_tasks, render
from learner.demo.tasks import ChatMessage, declined_dialogue_for, dialogue_for, make_task
from learner.file_lock import locked
from learner.tiny_model import CHAT_TEMPLATE
from store.json_types import JsonObject

log = logging.getLogger("onthejob.warmup")

# Bump when the recipe (data, tokenizer, training, probe) changes, so stale caches rebuild.
RECIPE_VERSION = 6
# what a build is made by, besides its settings: a cache shared across clones and runs
# (`onthejob demo` and the tests keep theirs in the user's model cache) is used only by the
# same code on the same torch
# (paths in learner/)
_RECIPE_SOURCES = ("demo/warmup.py", "demo/probe.py", "demo/tasks.py", "tiny_model.py")
_MARKER = "warmup.json"
_IM_START, _IM_END, _EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
_TOOL_CALL_TAGS = ["<tool_call>", "</tool_call>"]


@dataclass(frozen=True)
class WarmupSettings:
    """Everything that decides the weights; its hash names the cache directory."""

    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 2
    # One 128-wide head: a head can copy a number token's whole embedding (what the skill
    # is); split into 4 heads of 32 the same model learned it far later or not at all.
    num_heads: int = 1
    num_kv_heads: int = 1
    intermediate_size: int = 384
    vocab_size: int = 768
    copy_init: float = 1.0  # value = identity, output = copy_init x identity; 0: random
    steps: int = 1000  # the skill phase's first learning-rate cycle
    restart_steps: int = 500  # each further cycle, at half the previous peak
    max_steps: int = 3000  # skill-phase cap
    batch_size: int = 16
    learning_rate: float = 3e-3
    skill_target: float = 0.45  # probe success that ends the skill phase
    first_probe: int = 1000  # the end of the first cycle: a model probed earlier passed weak
    probe_every: int = 250
    habit_learning_rate: float = 3e-4  # 1e-3 unlearned the skill along with teaching the habit
    habit_chunk: int = 25
    max_habit_steps: int = 500  # on an AMD EPYC seeds 0, 1, 2 reached the habit at 225, 125, 175
    decline_share: float = 0.75  # of the habit phase's dialogues
    decline_band: tuple[float, float] = (0.6, 0.8)  # 85% gave 8% probed, 3% held out
    skill_floor: float = 0.4  # right among tool calls, after the habit
    # probe success after the habit: low enough that the demo can double it. The demo's
    # held-out success through vLLM came out -5 to +11 points off the probe's (6 runs), and
    # learning tops out at 46-59% with this model, so a probe of 23% (30% held out) could
    # only reach 1.97x; the decline share's equilibrium (25% x ~55% right) sits inside.
    start_band: tuple[float, float] = (0.1, 0.2)
    probe_tasks: int = 64
    probe_samples: int = 3
    probe_temperature: float = 1.0
    top: int = 20  # largest operand in the warm-up questions
    limit: int = 99  # largest answer
    # torch CPU threads while training; not part of the cache key. 1 by default: on a busy
    # 2-core machine 2 threads were several times slower (they wait on each other).
    threads: int = 1

    def key(self, exclude: Sequence[str] = ()) -> str:
        settings = dataclasses.asdict(self)
        # not part of what is built: the threads do not change the result, and a cap only
        # decides whether a build passes (a build that failed its probe is rebuilt anyway)
        for name in ("threads", "max_steps", "max_habit_steps"):
            del settings[name]
        blob = json.dumps(
            {
                "recipe": RECIPE_VERSION,
                "code": recipe_code_digest(),
                "settings": settings,
                "exclude": hashlib.sha256("\n".join(sorted(exclude)).encode()).hexdigest(),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def skill_reached(self, result: ProbeResult) -> bool:
        return result.success >= self.skill_target

    def habit_reached(self, result: ProbeResult) -> bool:
        low, high = self.decline_band
        start_low, start_high = self.start_band
        return (
            low <= result.declined <= high
            and result.skill >= self.skill_floor
            and start_low <= result.success <= start_high
        )

    def targets(self) -> str:
        low, high = self.decline_band
        start_low, start_high = self.start_band
        return (
            f"skill: success >= {100 * self.skill_target:.0f}%; habit: declined "
            f"{100 * low:.0f}-{100 * high:.0f}%, right with the tool >= "
            f"{100 * self.skill_floor:.0f}% and success {100 * start_low:.0f}-"
            f"{100 * start_high:.0f}%"
        )


class ProbeRecord(ProbeFigures):
    """One probe of a build, with the phase and step it was taken at."""

    phase: str  # skill | habit
    step: int


class WarmupInfo(TypedDict, total=False):
    """A build's record, ``warmup.json`` in its directory (read back as written)."""

    recipe: int
    settings: JsonObject  # the WarmupSettings it was built with
    excluded_prompts: int
    seconds: float
    passed: bool
    reason: str
    probe: ProbeRecord | None  # the last one
    probes: list[ProbeRecord]
    loss_curve: list[float]
    habit_loss_curve: list[float]


class WarmupFailed(RuntimeError):
    """The warm-up could not bring the model to its intended starting point."""

    def __init__(self, message: str, info: WarmupInfo) -> None:
        super().__init__(message)
        self.info = info


def build_demo_model(
    cache_dir: Path,
    settings: WarmupSettings | None = None,
    *,
    exclude: Iterable[str] = (),
    progress: bool = False,
) -> Path:
    """The warmed-up model directory under ``cache_dir``, built unless a passing build is
    cached; `WarmupFailed` when the build cannot reach the probe's targets."""
    settings = settings or WarmupSettings()
    excluded = sorted(set(exclude))
    out_dir = Path(cache_dir) / f"demo-{settings.key(excluded)}"
    recorded = read_info(out_dir)
    if recorded is not None and recorded.get("passed"):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # one build of a key at a time: the cache is shared by demos and test runs. The lock
    # file goes once the build is done: a waiter holding the old one finds the build made
    lock = out_dir.parent / f".{out_dir.name}.lock"
    try:
        with locked(lock):
            return _build_cached(out_dir, settings, excluded, progress=progress)
    finally:
        lock.unlink(missing_ok=True)


def _build_cached(
    out_dir: Path, settings: WarmupSettings, excluded: list[str], *, progress: bool
) -> Path:
    recorded = read_info(out_dir)
    if recorded is not None and recorded.get("passed"):
        return out_dir  # built by whoever held the lock before
    if recorded is not None and progress:
        print(f"[warm-up] the cached build failed its probe; rebuilding {out_dir}", flush=True)
    # Built aside and renamed into place: a cache directory is complete or absent.
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        info = _build(tmp, settings, set(excluded), progress=progress)
        if out_dir.exists():  # a failed, interrupted or concurrent build left one behind
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not info["passed"]:
        raise WarmupFailed(
            f"the warm-up did not reach its targets ({settings.targets()}): {info['reason']}; "
            f"the failed build is kept in {out_dir} (warmup.json says what it reached)",
            info,
        )
    return out_dir


def recipe_code_digest() -> str:
    """sha256 of the modules that make a build and the torch that runs them."""
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    learner = Path(__file__).resolve().parents[1]
    for name in _RECIPE_SOURCES:
        digest.update((learner / name).read_bytes())
    return digest.hexdigest()[:16]


def read_info(model_dir: Path) -> WarmupInfo | None:
    """The build record (``warmup.json``) of a finished build, else None."""
    try:
        info = json.loads((Path(model_dir) / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def warmup_dialogues(
    settings: WarmupSettings,
    exclude: set[str],
    count: int,
    *,
    decline_share: float = 0.0,
    stream: str = "skill",
) -> list[list[ChatMessage]]:
    """``count`` dialogues of `dialogue_stream` as a list."""
    stream_ = dialogue_stream(settings, exclude, decline_share=decline_share, stream=stream)
    return [next(stream_) for _ in range(count)]


def dialogue_stream(
    settings: WarmupSettings, exclude: set[str], *, decline_share: float = 0.0, stream: str
) -> Iterator[list[ChatMessage]]:
    """Endless dialogues for prompts not in ``exclude`` (seeded per ``stream``): ideal ones,
    and declined ones in a ``decline_share`` of them."""
    rng = random.Random(f"onthejob-demo-warmup-{settings.seed}-{stream}")
    # its own stream, so the questions are the same whatever the decline share
    habit = random.Random(f"onthejob-demo-warmup-decline-{settings.seed}-{stream}")
    made = 0
    while True:
        task = make_task(rng, top=settings.top, limit=settings.limit)
        if task["prompt"] in exclude:
            continue
        made += 1
        if habit.random() < decline_share:
            yield declined_dialogue_for(task)
        else:
            yield dialogue_for(task, call_id=f"call_{made % 1000}")


def _build(
    out_dir: Path, settings: WarmupSettings, exclude: set[str], *, progress: bool
) -> WarmupInfo:
    import torch

    started = time.monotonic()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        skill = dialogue_stream(settings, exclude, stream="skill")
        corpus = [next(skill) for _ in range(2000)]
        tokenizer = _build_tokenizer(out_dir, settings, corpus)
        model = _new_model(tokenizer, settings)
        questions = probe_tasks(settings.seed, settings.probe_tasks, exclude)
        probes: list[ProbeRecord] = []

        def check(phase: str, step: int) -> ProbeResult:
            result = probe(
                model,
                tokenizer,
                questions,
                temperature=settings.probe_temperature,
                samples=settings.probe_samples,
                seed=settings.seed,
            )
            probes.append({"phase": phase, "step": step, **result.as_dict()})
            if progress:
                print(f"[warm-up] {phase} step {step}: {result.describe()}", flush=True)
            return result

        trainer = _Trainer(model, tokenizer, settings, progress=progress)
        passed, reason = _skill_phase(trainer, settings, skill, check)
        if passed:
            habit = dialogue_stream(
                settings, exclude, decline_share=settings.decline_share, stream="habit"
            )
            passed, reason = _habit_phase(trainer, settings, habit, check)
        _save(model, out_dir)
    finally:
        torch.set_num_threads(previous_threads)
    info: WarmupInfo = {
        "recipe": RECIPE_VERSION,
        "settings": dataclasses.asdict(settings),
        "excluded_prompts": len(exclude),
        "seconds": round(time.monotonic() - started, 1),
        "passed": passed,
        "reason": reason,
        "probe": probes[-1] if probes else None,
        "probes": probes,
        "loss_curve": trainer.curves.get("skill", []),
        "habit_loss_curve": trainer.curves.get("habit", []),
    }
    (out_dir / _MARKER).write_text(json.dumps(info, indent=1))  # last: marks it complete
    return info


def _skill_phase(
    trainer: _Trainer,
    settings: WarmupSettings,
    dialogues: Iterator[list[ChatMessage]],
    check: Callable[[str, int], ProbeResult],
) -> tuple[bool, str]:
    """Train on ideal dialogues, probing as it goes, until the skill target is met."""
    peak, cycle, cycle_start = settings.learning_rate, settings.steps, 0
    trainer.reset_optimizer(peak)
    step = 0
    result: ProbeResult | None = None
    while step < settings.max_steps:
        if step - cycle_start >= cycle:  # a warm restart at half the peak
            peak, cycle, cycle_start = peak / 2, settings.restart_steps, step
        next_probe = (
            settings.first_probe
            if step < settings.first_probe
            else step + settings.probe_every - (step - settings.first_probe) % settings.probe_every
        )
        until = min(next_probe, cycle_start + cycle, settings.max_steps)
        trainer.train(
            "skill", dialogues, until - step, _cosine(peak, cycle, cycle_start), first_step=step
        )
        step = until
        if step >= settings.first_probe and (
            (step - settings.first_probe) % settings.probe_every == 0 or step == settings.max_steps
        ):
            result = check("skill", step)
            if settings.skill_reached(result):
                return True, f"skill reached at step {step}"
    reached = result.describe() if result else "never probed"
    return False, f"skill phase: after {step} steps, {reached}"


def _habit_phase(
    trainer: _Trainer,
    settings: WarmupSettings,
    dialogues: Iterator[list[ChatMessage]],
    check: Callable[[str, int], ProbeResult],
) -> tuple[bool, str]:
    """Teach the decline habit in short chunks until the probe puts it inside the band.
    The skill phase's optimizer goes on (its moment estimates are what keep the steps small:
    a fresh AdamW moved every weight by its full rate from the first step, and 25 such steps
    at 1e-4 halved the skill)."""
    rate = settings.habit_learning_rate
    step = 0
    result: ProbeResult | None = None
    while step < settings.max_habit_steps:
        chunk = min(settings.habit_chunk, settings.max_habit_steps - step)
        trainer.train("habit", dialogues, chunk, lambda _: rate, first_step=step)
        step += chunk
        result = check("habit", step)
        if settings.habit_reached(result):
            return True, f"skill and habit reached ({step} habit steps)"
    reached = result.describe() if result else "never probed"
    return False, f"habit phase: after {step} steps, {reached}"


def _cosine(peak: float, cycle: int, start: int) -> Callable[[int], float]:
    """Linear warm-up over 5% of the cycle, then cosine decay to 10% of ``peak``."""
    warm = max(1, cycle // 20)

    def rate(step: int) -> float:
        at = step - start
        if at < warm:
            return peak * (at + 1) / warm
        done = min(1.0, (at - warm) / max(1, cycle - warm))
        return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))

    return rate


def _build_tokenizer(out_dir: Path, settings: WarmupSettings, dialogues: list[Any]) -> Any:
    """Byte-level BPE trained on rendered dialogues, so the long tool preamble is few tokens,
    plus one token for each number 0-999 (longer digit runs split into such chunks)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab_size,
        special_tokens=[_EOT, _IM_START, _IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any UTF-8 text tokenizes
        show_progress=False,
    )
    # The template itself supplies the corpus: render with a throwaway tokenizer first.
    plain = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    plain.chat_template = CHAT_TEMPLATE
    corpus = [render(plain, d) for d in dialogues]
    tok.train_from_iterator(corpus, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=_IM_END,
        pad_token=_EOT,
        unk_token=None,
        additional_special_tokens=[_IM_START, _IM_END],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    # Every number up to 999 is one token, so copying a number from the question into the
    # expression, or the tool's result into the answer, is copying one token: a skill a
    # tiny model picks up in a few hundred steps (digit by digit it does not).
    # Not special: vLLM strips special tokens from text and the Hermes parser needs these.
    hf.add_tokens([str(n) for n in range(1000)] + _TOOL_CALL_TAGS, special_tokens=False)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(out_dir))
    return hf


def _new_model(tokenizer: Any, settings: WarmupSettings) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids([_IM_END, _EOT])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_kv_heads,
        num_hidden_layers=settings.num_layers,
        intermediate_size=settings.intermediate_size,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    torch.manual_seed(settings.seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    if settings.copy_init:
        # Attention starts as a copier: what a position attends to is added to it as is,
        # and the tied head reads a copied number token straight back out.
        with torch.no_grad():
            for layer in model.model.layers:
                attention = layer.self_attn
                value = attention.v_proj.weight
                value.copy_(torch.eye(*value.shape))
                attention.v_proj.bias.zero_()
                output = attention.o_proj.weight
                output.copy_(settings.copy_init * torch.eye(*output.shape))
    return model


def encode_dialogue(tokenizer: Any, messages: list[ChatMessage]) -> tuple[list[int], list[bool]]:
    """Token ids of the rendered dialogue and which of them the assistant wrote (its
    replies up to and including <|im_end|>): the tokens the warm-up learns."""
    text = render(tokenizer, messages)
    spans = []
    opener = _IM_START + "assistant\n"
    start = text.find(opener)
    while start >= 0:
        begin = start + len(opener)
        end = text.index(_IM_END, begin) + len(_IM_END)
        spans.append((begin, end))
        start = text.find(opener, end)
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    mask = [any(b <= s and e <= end for b, end in spans) for s, e in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), mask


class _Trainer:
    """AdamW on batches drawn from a dialogue stream; the optimizer is reset per phase."""

    def __init__(self, model: Any, tokenizer: Any, settings: WarmupSettings, *, progress: bool):
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.progress = progress
        self.curves: dict[str, list[float]] = {}
        self.optimizer: Any = None
        self.prefix: list[int] | None = None

    def reset_optimizer(self, rate: float) -> None:
        import torch

        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=rate, weight_decay=0.0, betas=(0.9, 0.98)
        )

    def _batch(self, dialogues: Iterator[list[ChatMessage]]) -> list[tuple[list[int], list[bool]]]:
        encoded = [
            encode_dialogue(self.tokenizer, next(dialogues))
            for _ in range(self.settings.batch_size)
        ]
        if self.prefix is None:
            ids = encoded[0][0]
            self.prefix = ids[: ids.index(ids[0], 1)]  # up to the end of the system turn
        cut = len(self.prefix)
        for tokens, mask in encoded:
            if tokens[:cut] != self.prefix or any(mask[:cut]):
                raise ValueError("warm-up dialogues do not share their system turn")
        return [(tokens[cut:], mask[cut:]) for tokens, mask in encoded]

    def train(
        self,
        label: str,
        dialogues: Iterator[list[ChatMessage]],
        steps: int,
        rate: Callable[[int], float],
        *,
        first_step: int,
    ) -> None:
        import torch

        model, pad = self.model, self.tokenizer.pad_token_id
        curve = self.curves.setdefault(label, [])
        model.train()
        for step in range(first_step, first_step + steps):
            batch = self._batch(dialogues)
            prefix = self.prefix or []
            width = max(len(ids) for ids, _ in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            attention = torch.zeros((len(batch), len(prefix) + width), dtype=torch.long)
            attention[:, : len(prefix)] = 1
            for row, (tokens, mask) in enumerate(batch):
                ids[row, : len(tokens)] = torch.tensor(tokens)
                attention[row, len(prefix) : len(prefix) + len(tokens)] = 1
                labels[row, : len(tokens)] = torch.tensor(
                    [t if m else -100 for t, m in zip(tokens, mask, strict=True)]
                )
            # The tool preamble is the same in every dialogue and never learned: run it
            # once, without gradients, and let the batch attend to its keys and values.
            with torch.no_grad():
                cache = model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
            cache.batch_repeat_interleave(len(batch))
            logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
            )
            for group in self.optimizer.param_groups:
                group["lr"] = rate(step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
            curve.append(round(loss.item(), 4))
            if self.progress and (step + 1) % 50 == 0:
                print(f"[warm-up] {label} step {step + 1} loss {loss:.3f}", flush=True)
        model.eval()


def _save(model: Any, out_dir: Path) -> None:
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    # Explicit, though tied: vLLM's reload_weights leaves the head stale otherwise.
    tensors["lm_head.weight"] = model.get_input_embeddings().weight.detach().clone()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(str(out_dir))
    config = model.config
    GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(str(out_dir))
