"""bench/tenants.py at its smallest setting on the tiny model (issue 42): the letter toy, one
tenant alone (``alone:more-a``) and both tenants sharing one policy (``shared``), one seed,
one learner step of 16 calls per arm, 8 measuring calls per tenant before and after; it
prints a row per arm and tenant, the gains over the seeds, the shared arm's shares of the
gains alone, and last that no per-tenant arm ran.

Against the session's vLLM (``--upstream``: the full-weight arms need no LoRA, so no vLLM of
their own): every arm swaps its weights into it and the bench puts the original back after
each (``restore_vllm`` checks). The per_tenant arm (LoRA adapters, a vLLM serving them) is
tests/e2e/test_lora_vllm.py's ground. One seed makes no interval: each gain says "(seed 3:
no interval)", as expected of a smoke run (not a learning figure).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from learner.vllm_server import VLLMServer
from tests.support.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SEED = 3
MORE_A, FEWER_A = "more-a", "fewer-a"
# each arm and the tenants it serves
ARMS = {"alone:more-a": (MORE_A,), "shared": (MORE_A, FEWER_A)}
NUMBER = r"[+-]?\d+\.\d{3}"


def test_the_smallest_setting_reports_every_arm_and_tenant_and_ends_with_the_headline(
    vllm: VLLMServer, tiny_model: Path, restore_vllm: str, tmp_path: Path
) -> None:
    result = tmp_path / "result.json"
    command = [
        *(sys.executable, "-m", "bench.tenants"),
        *("--upstream", vllm.url, "--model", str(tiny_model)),
        *("--arms", ",".join(ARMS), "--seeds", str(SEED), "--steps", "1"),
        *("--measure", "8", "--clients", "2", "--minutes", "5"),
        *("--work", str(tmp_path / "work"), "--json", str(result)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420, cwd=ROOT)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    data = json.loads(result.read_text())

    # every arm, with its tenants' rewards before and after, and the one step it was allowed
    arms = {row["arm"]: row for row in data["arms"]}
    assert list(arms) == list(ARMS)
    for name, tenants in ARMS.items():
        row = arms[name]
        assert row["seed"] == SEED and row["steps"] == 1 and 0 < row["minutes"] < 7
        assert tuple(row["before"]) == tuple(row["after"]) == tenants
        for tenant in tenants:
            assert 0.0 <= row["before"][tenant] <= 1.0 and 0.0 <= row["after"][tenant] <= 1.0
            assert re.search(
                rf"^{re.escape(name)} +{SEED} {tenant} +\d\.\d{{3}} +\d\.\d{{3}} +{NUMBER} +1 ",
                done.stdout,
                re.M,
            ), (name, tenant)
    # the same base model measured with the same seeds: more-a starts alike in both arms
    assert arms["alone:more-a"]["before"][MORE_A] == arms["shared"]["before"][MORE_A]
    assert data["settings"]["upstream"] == vllm.url

    # a gain over the seeds for every arm and tenant: one seed, no interval
    at = lines.index("gain over the seeds, held-out prompts:")
    gains = [(name, tenant) for name, tenants in ARMS.items() for tenant in tenants]
    for line, (name, tenant) in zip(lines[at + 1 : at + 1 + len(gains)], gains, strict=True):
        assert re.fullmatch(
            rf"  {re.escape(name)} +{tenant} +{NUMBER} \(seed {SEED}: no interval\)", line
        ), line
    # the shared arm against the tenants alone: fewer-a never ran alone
    share = rf"(\d+\.\d\d \(seed {SEED}: no interval\)|no gain alone)"
    assert re.fullmatch(rf"shared, {MORE_A}: share of its gain alone {share}", lines[-3])
    assert lines[-2] == f"shared, {FEWER_A}: share of its gain alone no gain alone"
    # no per_tenant arm: the shared arm's line is the headline
    assert re.fullmatch(
        r"shared policy gain vs alone, the slower tenant: not measured \(needs both tenants' "
        rf"gains alone\) \(left out, no gain alone: seeds {SEED}\)",
        lines[-1],
    ), lines[-1]
    assert "shared_vs_alone" not in data
