"""Why does the demo model not learn? GRPO on the demo's tasks in one process, in a minute.

No vLLM, proxy or harness: the warmed-up demo model (learner/demo/warmup.py, built or taken from
the cache) samples calculator episodes with transformers (the harness's protocol: tool call
-> calculator -> answer), the learner's own `build_samples`, advantages and `Trainer` take
the step, and held-out success (per task kind) is measured every ``--eval-every`` steps at
the sampling temperature. One run of 30 steps takes about a minute on one core, so learning
rates, optimizers, temperatures and advantage rules can be compared before a 10-minute
`onthejob demo` run. ``--advantage`` also gives two controls: ``random`` (rewards shuffled
within each group: what noise alone does) and ``sft`` (the warm-up's ideal dialogues,
advantage 1: plain supervised fine-tuning with the same optimizer).

Each seed (``--seeds``, 3, 4, 5 by default: the demo's learning rate was chosen on 0-2, which
are flagged) has its own task sets and warm-up, as `onthejob demo --seed` has. It prints
every seed's run, then held-out success before and after and the gain, each a mean over the
seeds with its 95% interval (bench/stats.py); the last line is the gain.

Run: .venv/bin/python -m bench.demo_rl_offline [--lr 1e-4] [--temperature 1.0] [--seeds 3,4,5]
     [--advantage grpo|rft|random|sft] [--lora RANK] [--warmup '{"sharpen": 1.0}']
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.stats import seeds_are_fresh, summarise
from learner.demo.probe import render, tool_turn
from learner.demo.tasks import dialogue_for, make_task_sets
from learner.demo.warmup import (
    WarmupSettings,
    build_demo_model,
    encode_dialogue,
)
from learner.real_models import warmup_cache_dir
from learner.trainer import Trainer, TrainerConfig
from store.export import from_export
from store.samples import Sample, build_samples

Call = tuple[list[int], list[int], list[float], str, str]  # prompt, completion, lps, finish, text


class Agent:
    """The calculator agent, sampled in-process; records calls like the proxy does."""

    def __init__(self, model: Any, tokenizer: Any, temperature: float) -> None:
        self.model, self.tokenizer, self.temperature = model, tokenizer, temperature

    def generate(self, conversations: list[list[dict[str, Any]]], greedy: bool) -> list[Call]:
        tok = self.tokenizer
        texts = [render(tok, c, add_generation_prompt=True) for c in conversations]
        batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                **batch,
                do_sample=not greedy,
                temperature=None if greedy else self.temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=48,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                return_dict_in_generate=True,
                output_scores=True,
            )
        width = batch["input_ids"].shape[1]
        # scores are the processed logits (divided by the temperature), as vLLM reports
        logprobs = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
        calls: list[Call] = []
        for row, generated in enumerate(out.sequences[:, width:].tolist()):
            prompt = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
            completion, lps, finish = [], [], "length"
            for t, token in enumerate(generated):
                completion.append(token)
                lps.append(logprobs[row, t, token].item())
                if token == tok.eos_token_id:
                    finish = "stop"
                    break
            text = tok.decode(completion, skip_special_tokens=True)
            calls.append((prompt, completion, lps, finish, text))
        return calls

    def episodes(
        self, tasks: list[dict[str, Any]], greedy: bool = False
    ) -> list[tuple[dict[str, Any], float]]:
        """(trajectory in the export format, reward 1/0) per task."""
        conversations = [[{"role": "user", "content": t["prompt"]}] for t in tasks]
        first = self.generate(conversations, greedy)
        calls = [[c] for c in first]
        follow = []
        for i, call in enumerate(first):
            turn = tool_turn(call[4])
            if turn is not None:
                conversations[i] += turn
                follow.append(i)
        if follow:
            second = self.generate([conversations[i] for i in follow], greedy)
            for i, call in zip(follow, second, strict=True):
                calls[i].append(call)
        results = []
        for task, task_calls in zip(tasks, calls, strict=True):
            trajectory = {
                "id": f"t{random.random()}",
                "calls": [
                    {
                        "status": "ok",
                        "capture_complete": True,
                        "prompt_token_ids": c[0],
                        "completion_token_ids": c[1],
                        "completion_logprobs": c[2],
                        # what the proxy records: the sampling the tokens were drawn with
                        "sampling": {"temperature": self.temperature},
                        "finish_reason": c[3],
                    }
                    for c in task_calls
                ],
            }
            results.append((trajectory, float(task_calls[-1][4].strip() == task["answer"])))
        return results


def success_by_kind(
    agent: Agent, tasks: list[dict[str, Any]], samples: int, greedy: bool = False
) -> tuple[float, dict[str, float]]:
    runs = [t for t in tasks for _ in range(1 if greedy else samples)]
    rewards: list[float] = []
    for i in range(0, len(runs), 120):
        rewards += [r for _, r in agent.episodes(runs[i : i + 120], greedy)]
    kinds: dict[str, list[float]] = defaultdict(list)
    for task, reward in zip(runs, rewards, strict=True):
        kinds[task["metadata"]["kind"]].append(reward)
    return statistics.mean(rewards), {k: round(statistics.mean(v), 2) for k, v in kinds.items()}


def step_batch(
    agent: Agent, tasks: list[dict[str, Any]], args: argparse.Namespace, rng: random.Random
) -> tuple[list[Sample], list[float], float]:
    """Samples and advantages of one step, and the batch's mean reward."""
    if args.advantage == "sft":
        samples = []
        for task in tasks:
            ids, mask = encode_dialogue(agent.tokenizer, dialogue_for(task))
            with torch.no_grad():
                logits = agent.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])
            samples.append(Sample("sft", list(ids), list(mask), [0.0, *picked[:, 0].tolist()]))
        return samples, [1.0] * len(samples), 1.0
    runs = agent.episodes([t for t in tasks for _ in range(args.group_size)])
    samples, advantages = [], []
    for start in range(0, len(runs), args.group_size):
        group = runs[start : start + args.group_size]
        rewards = [r for _, r in group]
        if args.advantage == "random":
            rng.shuffle(rewards)
        if max(rewards) == min(rewards):
            continue  # a flat group carries no signal (as learner/grouping.py drops it)
        mean = statistics.mean(rewards)
        for (trajectory, _), reward in zip(group, rewards, strict=True):
            advantage = reward if args.advantage == "rft" else reward - mean
            for sample in build_samples(from_export(trajectory)):
                samples.append(sample)
                advantages.append(advantage)
    return samples, advantages, statistics.mean(r for _, r in runs)


DEFAULT_SEEDS = "3,4,5"
TUNED_ON = (0, 1, 2)  # the demo's learning rate was chosen on these (bench/demo_seeds.py)


@dataclass(frozen=True)
class Curve:
    """One seed's run: held-out success at each evaluated step (step 0 first)."""

    seed: int
    points: tuple[tuple[int, float], ...]

    @property
    def before(self) -> float:
        return self.points[0][1]

    @property
    def after(self) -> float:
        return self.points[-1][1]


def summary_lines(arm: str, curves: list[Curve], steps: int) -> list[str]:
    """Every seed's run, then held-out success before and after and the gain over the
    seeds, each a mean with its 95% interval; the last line is the gain."""
    lines = [
        f"[offline] {arm} seed {c.seed}: held-out {c.before:.3f} -> {c.after:.3f} "
        f"({c.after - c.before:+.3f}) in {steps} steps"
        for c in curves
    ]
    seeds = [c.seed for c in curves]
    for name, values in (
        ("before", [c.before for c in curves]),
        ("after", [c.after for c in curves]),
    ):
        lines.append(f"[offline] {arm} held-out {name}: {summarise(values, seeds).format()}")
    gain = summarise([c.after - c.before for c in curves], seeds)
    last = f"[offline] {arm} gain in {steps} steps: {gain.format('+.3f')}"
    if not seeds_are_fresh(seeds, TUNED_ON):
        last += f" -- seeds {TUNED_ON} chose the demo's learning rate: no learning figure"
    return [*lines, last]


def arm_name(args: argparse.Namespace) -> str:
    """The setting a run compares, as its report names it."""
    name = f"{args.advantage} lr {args.lr:g} {args.optimizer} t {args.temperature:g}"
    return name + (f" lora {args.lora}" if args.lora else "")


def run_seed(args: argparse.Namespace, seed: int) -> Curve:
    """One run from the seed's warmed-up demo model; its held-out curve."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    # the same task sets (and so the same cached warm-up) as `onthejob demo`'s with this seed
    train, heldout = make_task_sets(seed, 200, max(args.heldout, 60))
    settings = WarmupSettings(**{"seed": seed, **json.loads(args.warmup)})
    model_dir = build_demo_model(
        args.cache, settings, exclude=[t["prompt"] for t in train + heldout], progress=True
    )
    heldout = heldout[: args.heldout]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if args.lora:
        from learner.lora import LoraSettings, wrap

        model = wrap(model, LoraSettings(rank=args.lora, alpha=2.0 * args.lora))
    agent = Agent(model, tokenizer, args.temperature)
    trainer = Trainer(model, TrainerConfig(learning_rate=args.lr), device="cpu")
    if args.optimizer == "sgd":
        trainer.optimizer = torch.optim.SGD(trainer.parameters, lr=args.lr)

    started = time.monotonic()
    greedy, greedy_kinds = success_by_kind(agent, heldout, 1, greedy=True)
    print(f"[offline] seed {seed} {model_dir.name}: greedy held-out {greedy:.3f} {greedy_kinds}")
    curve = []
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            score, kinds = success_by_kind(agent, heldout, args.eval_samples)
            curve.append((step, score))
            print(
                f"[offline] seed {seed} step {step:3d} held-out {score:.3f} {kinds} "
                f"({time.monotonic() - started:.0f}s)",
                flush=True,
            )
        if step == args.steps:
            break
        samples, advantages, reward = step_batch(
            agent, rng.sample(train, args.tasks_per_step), args, rng
        )
        keep = [i for i, s in enumerate(samples) if trainer.trainable([s])]
        if keep:
            info = trainer.step([samples[i] for i in keep], [advantages[i] for i in keep])
            print(
                f"[offline] seed {seed} step {step + 1:3d} batch reward {reward:.2f} "
                f"samples {len(keep)} grad norm {info.get('grad_norm', 0.0):.3f}",
                flush=True,
            )
    return Curve(seed, tuple(curve))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache",
        type=Path,
        default=warmup_cache_dir(),
        help="warmed-up demo models (default: the demo's own cache, so a seed `onthejob demo` "
        "warmed up is reused)",
    )
    parser.add_argument("--warmup", default="{}", help="WarmupSettings overrides as JSON")
    parser.add_argument(
        "--seeds", default=DEFAULT_SEEDS, help=f"comma-separated; {TUNED_ON} are flagged"
    )
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--advantage", choices=["grpo", "rft", "random", "sft"], default="grpo")
    parser.add_argument("--lora", type=int, default=0, help="train a LoRA adapter of this rank")
    parser.add_argument("--heldout", type=int, default=60)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    curves = [run_seed(args, seed) for seed in seeds]
    for line in summary_lines(arm_name(args), curves, args.steps):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
