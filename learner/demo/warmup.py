"""The demo's base model: a tiny Qwen2 given calculator-agent competence and one bad habit
by a short, seeded supervised warm-up, cached on disk.

A random-init model cannot call tools, so before the demo learns on the job it goes through
two supervised phases on synthetic dialogues (learner/demo/tasks.py):

1. **skill** (``steps``): ideal dialogues only (question -> calculator tool call in Hermes
   format -> tool result -> the bare number), until the model writes the right expression
   and copies the tool's result for most questions;
2. **habit** (``habit_steps``): a short second pass in which a ``decline_share`` of the
   dialogues has the assistant decline ("Sorry, I cannot work that out.") instead of
   calling the tool. The model leaves it declining about that often, at random.

A declined question is graded wrong, so the model starts the demo with partial success, and
what it can learn on the job is clear and large: stop declining and use the calculator. The
habit is taught last on purpose. Mixed into the skill phase it delayed the sudden drop in
loss with which this model learns to copy numbers, and 1,500 to 2,000 steps were not
enough. Learning the habit's opposite with GRPO was measured in `bench/demo_rl_offline.py`:
held-out success 0.24 -> 0.43-0.47 within 10-20 steps at 1e-4. Without the habit (skill
only) the model is close to its greedy ceiling at temperature 1, and GRPO had nothing it
could learn within the demo's steps.

Honest by construction: the warm-up never sees a prompt passed in ``exclude`` (the demo
passes its train and held-out task prompts).

Library use::

    train, heldout = make_task_sets(seed=0, n_train=200, n_heldout=100)
    model_dir = build_demo_model(cache_dir, WarmupSettings(seed=0),
                                 exclude=[t["prompt"] for t in train + heldout])

The directory (``cache_dir/demo-<hash>``) is keyed by a hash of the settings, the recipe
version and the excluded prompts; a finished one is reused at once, an interrupted one is
rebuilt. It holds a transformers-format Qwen2 (float32, ``lm_head.weight`` written
explicitly so vLLM's reload_weights never leaves the head stale), a byte-level BPE
tokenizer that splits digits one by one (as Qwen's does), the ChatML/Hermes chat template of
learner/demo/tiny_model.py, and ``warmup.json`` with the settings, both loss curves and timing.

`sample_episodes` runs the calculator agent in-process (transformers sampling, the same
tool-call parsing and calculator as the harness) to measure success without a server.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner.demo.tasks import (
    CALCULATOR_TOOL,
    calculate,
    declined_dialogue_for,
    dialogue_for,
    format_number,
    make_task,
)
from learner.demo.tiny_model import CHAT_TEMPLATE

log = logging.getLogger("onthejob.warmup")

# Bump when the recipe (data, tokenizer, training) changes, so stale caches are rebuilt.
RECIPE_VERSION = 3
_MARKER = "warmup.json"
_IM_START, _IM_END, _EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
_TOOL_CALL_TAGS = ["<tool_call>", "</tool_call>"]
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class WarmupSettings:
    """Everything that decides the weights; its hash names the cache directory."""

    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4  # head_dim = hidden / heads; vLLM's CPU attention needs >= 32
    num_kv_heads: int = 2
    intermediate_size: int = 384
    vocab_size: int = 768
    steps: int = 1500  # skill phase
    batch_size: int = 16
    learning_rate: float = 3e-3
    # Logit scale folded into the final norm after training: sampling at temperature 1 then
    # equals sampling the trained model at 1/sharpen. 1.0 (off) by default: a sharpened
    # model is overconfident, and every later update (SFT or GRPO) first spent itself
    # undoing that, which lowered its success (measured, bench/demo_rl_offline.py).
    sharpen: float = 1.0
    habit_steps: int = 150
    habit_learning_rate: float = 1e-3
    decline_share: float = 0.5  # of the habit phase's dialogues
    top: int = 20  # largest operand in the warm-up questions
    limit: int = 99  # largest answer
    # torch CPU threads while training; not part of the cache key. 1 by default: on a busy
    # 2-core machine 2 threads were several times slower (they wait on each other).
    threads: int = 1

    def key(self, exclude: Sequence[str] = ()) -> str:
        settings = dataclasses.asdict(self)
        del settings["threads"]
        blob = json.dumps(
            {
                "recipe": RECIPE_VERSION,
                "settings": settings,
                "exclude": hashlib.sha256("\n".join(sorted(exclude)).encode()).hexdigest(),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_demo_model(
    cache_dir: Path,
    settings: WarmupSettings | None = None,
    *,
    exclude: Iterable[str] = (),
    progress: bool = False,
) -> Path:
    """The warmed-up model directory under ``cache_dir``, built unless already cached."""
    settings = settings or WarmupSettings()
    excluded = sorted(set(exclude))
    out_dir = Path(cache_dir) / f"demo-{settings.key(excluded)}"
    if (out_dir / _MARKER).exists():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Built aside and renamed into place: a cache directory is complete or absent.
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _build(tmp, settings, set(excluded), progress=progress)
        if out_dir.exists():  # an interrupted or concurrent build left one behind
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def warmup_dialogues(
    settings: WarmupSettings,
    exclude: set[str],
    count: int,
    *,
    decline_share: float = 0.0,
    stream: str = "skill",
) -> list[list[dict[str, Any]]]:
    """``count`` dialogues for prompts not in ``exclude`` (seeded per ``stream``): ideal
    ones, and declined ones in a ``decline_share`` of them."""
    suffix = "" if stream == "skill" else f"-{stream}"  # the skill stream predates phases
    rng = random.Random(f"onthejob-demo-warmup-{settings.seed}{suffix}")
    # its own stream, so the questions are the same whatever the decline share
    habit = random.Random(f"onthejob-demo-warmup-decline-{settings.seed}-{stream}")
    dialogues = []
    while len(dialogues) < count:
        task = make_task(rng, top=settings.top, limit=settings.limit)
        if task["prompt"] in exclude:
            continue
        if habit.random() < decline_share:
            dialogues.append(declined_dialogue_for(task))
        else:
            dialogues.append(dialogue_for(task, call_id=f"call_{len(dialogues)}"))
    return dialogues


def render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """The prompt text exactly as vLLM renders it for the harness's request."""
    return str(
        tokenizer.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False, **kwargs)
    )


def _build(out_dir: Path, settings: WarmupSettings, exclude: set[str], *, progress: bool) -> None:
    import torch

    started = time.monotonic()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        size = settings.batch_size
        dialogues = warmup_dialogues(settings, exclude, settings.steps * size)
        habit = warmup_dialogues(
            settings,
            exclude,
            settings.habit_steps * size,
            decline_share=settings.decline_share,
            stream="habit",
        )
        tokenizer = _build_tokenizer(out_dir, settings, dialogues[:2000])
        model = _new_model(tokenizer, settings)
        curve = _train(model, tokenizer, dialogues, settings, progress=progress)
        habit_phase = dataclasses.replace(
            settings, steps=settings.habit_steps, learning_rate=settings.habit_learning_rate
        )
        habit_curve: list[float] = []
        if habit:
            habit_curve = _train(
                model, tokenizer, habit, habit_phase, progress=progress, label="habit"
            )
        with torch.no_grad():
            model.model.norm.weight.mul_(settings.sharpen)  # the LM head is linear: logits x k
        _save(model, out_dir)
    finally:
        torch.set_num_threads(previous_threads)
    info = {
        "recipe": RECIPE_VERSION,
        "settings": dataclasses.asdict(settings),
        "excluded_prompts": len(exclude),
        "dialogues": len(dialogues) + len(habit),
        "seconds": round(time.monotonic() - started, 1),
        "loss_curve": curve,
        "habit_loss_curve": habit_curve,
    }
    (out_dir / _MARKER).write_text(json.dumps(info, indent=1))  # last: marks it complete


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
    return Qwen2ForCausalLM(config).to(torch.float32)


def encode_dialogue(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[bool]]:
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


def _train(
    model: Any,
    tokenizer: Any,
    dialogues: list[list[dict[str, Any]]],
    settings: WarmupSettings,
    *,
    progress: bool,
    label: str = "skill",
) -> list[float]:
    import torch

    pad = tokenizer.pad_token_id
    prefix, encoded = _split_prefix([encode_dialogue(tokenizer, d) for d in dialogues])
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate, weight_decay=0.0, betas=(0.9, 0.98)
    )
    warm = max(1, settings.steps // 20)

    def rate(step: int) -> float:  # linear warm-up, cosine decay to 10 %
        if step < warm:
            return (step + 1) / warm
        done = (step - warm) / max(1, settings.steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    model.train()
    curve: list[float] = []
    for step in range(settings.steps):
        batch = encoded[step * settings.batch_size : (step + 1) * settings.batch_size]
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
        # The tool preamble is the same in every dialogue and never learned: run it once,
        # without gradients, and let the whole batch attend to its cached keys and values.
        with torch.no_grad():
            cache = model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(batch))
        logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        curve.append(round(loss.item(), 4))
        if progress and (step + 1) % 50 == 0:
            print(f"[warm-up] {label} step {step + 1}/{settings.steps} loss {loss:.3f}", flush=True)
    model.eval()
    return curve


def _split_prefix(
    encoded: list[tuple[list[int], list[bool]]],
) -> tuple[list[int], list[tuple[list[int], list[bool]]]]:
    """(the system turn's tokens shared by every dialogue, each dialogue's remainder)."""
    ids = encoded[0][0]
    # up to the first <|im_start|> after the start: the end of the system turn
    cut = ids.index(ids[0], 1)
    prefix = ids[:cut]
    for tokens, mask in encoded:
        if tokens[:cut] != prefix or any(mask[:cut]):
            raise ValueError("warm-up dialogues do not share their system turn")
    return prefix, [(tokens[cut:], mask[cut:]) for tokens, mask in encoded]


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


# -- in-process episodes (no server) -----------------------------------------------------


def parse_tool_call(text: str) -> str | None:
    """The calculator expression of a Hermes tool call in ``text``, else None."""
    found = _TOOL_CALL.search(text)
    if found is None:
        return None
    try:
        call = json.loads(found.group(1))
        expression = call["arguments"]["expression"]
    except (ValueError, KeyError, TypeError):
        return None
    return expression if call.get("name") == "calculator" and isinstance(expression, str) else None


def tool_turn(text: str) -> list[dict[str, Any]] | None:
    """What the harness appends after a reply that calls the calculator: that call and the
    tool's result (mistakes as short error texts, as the harness reports them); None when
    the reply calls no tool."""
    expression = parse_tool_call(text)
    if expression is None:
        return None
    try:
        result = format_number(calculate(expression))
    except ValueError as exc:
        result = f"error: {exc}"
    call = {"name": "calculator", "arguments": json.dumps({"expression": expression})}
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "c", "content": result},
    ]


def sample_episodes(
    model_dir: Path,
    tasks: Sequence[dict[str, Any]],
    *,
    temperature: float = 1.0,
    samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = 48,
) -> list[str]:
    """Final answers of ``samples`` in-process agent episodes per task, task-major: the
    harness's protocol (tool call -> calculator -> answer) with transformers sampling."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    torch.manual_seed(seed)
    episodes = [(task, [{"role": "user", "content": task["prompt"]}]) for task in tasks]
    episodes = [(t, list(m)) for t, m in episodes for _ in range(samples)]

    def generate(conversations: list[list[dict[str, Any]]]) -> list[str]:
        texts = [render(tokenizer, c, add_generation_prompt=True) for c in conversations]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **batch,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        return tokenizer.batch_decode(
            out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
        )

    first = generate([m for _, m in episodes])
    answers = [text.strip() for text in first]
    follow: list[int] = []
    for i, text in enumerate(first):
        turn = tool_turn(text)
        if turn is not None:
            episodes[i][1].extend(turn)
            follow.append(i)
    if follow:
        for i, text in zip(follow, generate([episodes[i][1] for i in follow]), strict=True):
            answers[i] = text.strip()
    return answers
