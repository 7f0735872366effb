"""bench/gpu_check.sh, the GPU check prepared for a session lent a GPU, runs its CPU half
here as it is: one summary line per figure, each saying that no GPU is present and that its
figures are smoke, not measurements (issue 46, item 4). Under a minute on 2 cores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

NO_GPU = r"\[no GPU: CPU smoke figures, not measurements\]"
NUMBER = r"[\d,]+(?:\.\d+)?"
SHAPES = {
    "step": rf"Trainer\.step \(bf16, full weights\) on a SmolLM2-shaped model of {NUMBER} M "
    rf"parameters: {NUMBER} tokens/s against a bare forward\+backward's {NUMBER} "
    rf"\({NUMBER}x\); 2 x 64 tokens a step, p50 of 2",
    "tenants": rf"8 LoRA tenants on one base: {NUMBER} tokens/s per tenant step against "
    rf"{NUMBER} for one adapter alone \({NUMBER}x; its bare forward\+backward {NUMBER}\); "
    rf"memory of 8 against 1: {NUMBER}x \(held tensors {NUMBER} GB vs {NUMBER} GB\)",
    "transfer": rf"gloo broadcast, trainer -> receiver process, {NUMBER} GB bf16 in \d+ "
    rf"buckets \(4 MiB, a larger tensor alone\): {NUMBER} GB/s \(p50 of 2\) against the "
    rf"device's own copy {NUMBER} GB/s \({NUMBER}x\)",
}


def test_the_cpu_half_prints_one_summary_line_per_figure_and_says_no_gpu(
    tmp_path: Path,
) -> None:
    out = tmp_path / "figures.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    done = subprocess.run(
        ["sh", str(ROOT / "bench" / "gpu_check.sh"), "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("summary ")]
    assert [line.split()[1] for line in lines] == list(SHAPES), done.stdout
    for line, (name, shape) in zip(lines, SHAPES.items(), strict=True):
        assert re.fullmatch(rf"summary {name} {NO_GPU}: {shape}; took \d+ s", line), line
    figures = {f["name"]: f["values"] for f in json.loads(out.read_text())}
    assert figures["step"]["step_tokens_per_s"] > 0 and figures["step"]["bare_tokens_per_s"] > 0
    memory = figures["tenants"]["memory_bytes"]
    # one base under all: 8 tenants hold far less than 8 times one
    assert memory["1"] < memory["8"] < 2 * memory["1"]
    assert figures["transfer"]["way"] == "gloo" and figures["transfer"]["refused"] is None


def test_imports_nothing_the_gpu_machine_lacks() -> None:
    # there: torch, transformers and peft; not the store's database, nor the proxy, nor vLLM
    code = (
        "import sys, bench.gpu_check; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'proxy', "
        "'psycopg', 'fastapi', 'vllm')); "
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
