"""How fast this host runs Python on a given CPU right now: a fixed piece of interpreter work
(dicts, strings, lists and orjson, like a recorded call's), timed in CPU µs per round.

Why: on shared virtual machines the same code's CPU per call moves 10-20% from minute to
minute with what the neighbours do. bench/volume_series.py measures this before each
segment, so a cost that grows with volume reads apart from a host that got slower.
"""

from __future__ import annotations

import os
import time

import orjson

_ROUNDS = 4000


def _one_round(i: int) -> int:
    call = {
        "id": f"{i:032x}",
        "messages": [{"role": "user", "content": f"question {i} " * 8}] * 3,
        "capture": {"prompt_token_ids": list(range(i, i + 40)), "logprobs": [-0.5] * 20},
        "latency_ms": i / 7,
    }
    line = orjson.dumps(call)
    back = orjson.loads(line)
    text = " ".join(m["content"].lower() for m in back["messages"])
    return len(text) + sum(back["capture"]["prompt_token_ids"]) % 7


def python_us_per_round(cpu: int | None, rounds: int = _ROUNDS) -> float:
    """CPU µs per round of the fixed work, in a child process pinned to `cpu` (None: where
    the scheduler puts it); the best of three passes, so a stray interruption counts less."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: measure, report, leave without cleanup handlers
        try:
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            best = float("inf")
            for _ in range(3):
                start = time.thread_time()
                for i in range(rounds):
                    _one_round(i)
                best = min(best, (time.thread_time() - start) / rounds * 1e6)
            os.write(write_end, repr(best).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = b""
        while chunk := os.read(read_end, 64):
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return float(data)


if __name__ == "__main__":
    print(f"{python_us_per_round(None):.2f} us of CPU per round of Python work")
