"""The proxy stands alone: torch, transformers, vLLM and matplotlib are extras (learn, cpu,
demo), and `onthejob serve` answers and records without any of them importable."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

from sqlalchemy import func, select

from learner.vllm_server import free_port
from store import db
from store.models import Call
from tests.support.fake_vllm import ANSWER, FakeVLLM
from tests.support.paths import ROOT

HEAVY = ("torch", "transformers", "vllm", "matplotlib", "peft")

# Runs `onthejob serve` with the heavy packages made unimportable (None in sys.modules
# makes `import x` raise ImportError), as on a machine where only the core is installed.
SERVE_WITHOUT_HEAVY = """
import sys
for name in {heavy!r}:
    sys.modules[name] = None
from cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_core_dependencies_leave_out_the_learner_and_the_demo() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    for name in HEAVY:
        assert name not in core, f"{name} is a core dependency"
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["learn"])
    assert any(d.startswith("matplotlib") for d in extras["demo"])
    assert "onthejob[learn,demo]" in extras["cpu"]


def test_the_proxy_serves_and_records_without_the_heavy_packages(tmp_path: Path) -> None:
    with FakeVLLM() as upstream:
        _serve_one_call(upstream.url, tmp_path)


def _serve_one_call(upstream: str, tmp_path: Path) -> None:
    """`onthejob serve` without the heavy packages answers a chat call from ``upstream``
    (the fake vLLM, a thread of this process) and records it."""
    proxy_port = free_port()
    db_url = f"sqlite:///{tmp_path / 'core.db'}"
    command = [
        sys.executable,
        "-c",
        SERVE_WITHOUT_HEAVY.format(heavy=HEAVY),
        "serve",
        "--upstream",
        upstream,
        "--port",
        str(proxy_port),
        "--db",
        db_url,
        "--spool",
        str(tmp_path / "spool.jsonl"),
    ]
    log = tmp_path / "proxy.log"
    with open(log, "wb") as out:
        proxy = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{proxy_port}"
        _wait_healthy(base, proxy, log)
        request = urllib.request.Request(
            base + "/v1/chat/completions",
            data=json.dumps(
                {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["choices"][0]["message"]["content"] == ANSWER
    finally:
        proxy.terminate()
        assert proxy.wait(timeout=30) in (0, -15), log.read_text()[-2000:]
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(Call)).scalar() == 1
    finally:
        engine.dispose()


def _wait_healthy(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(log.read_text()[-3000:])
