"""The publish lease and the swap fence on both databases (no vLLM: the proxies here are
their rows in the store, as a real proxy's GateKeeper writes them)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import Engine, update

from learner.config import LearnerConfig
from learner.loop import Learner
from learner.swap import lease
from learner.swap.fence import Fence, FenceError
from store import gates
from store.models import ProxyInstance, PublishLease
from tests.support.drills import wait_until

A, B = "http://a:8000", "http://b:8000"


def proxy(engine: Engine, name: str, upstreams: list[str], acks: dict[str, int]) -> None:
    with engine.begin() as conn:
        gates.register(
            conn, instance_id=name, host=name, upstreams=upstreams, acks=acks, now=datetime.now(UTC)
        )


def test_one_publisher_at_a_time_and_a_dead_one_expires(engine: Engine) -> None:
    assert lease.try_acquire(engine, "learner@x:1:a")
    assert lease.try_acquire(engine, "learner@x:1:a")  # ours already
    assert not lease.try_acquire(engine, "rollback@y:2:b")
    with pytest.raises(lease.LeaseBusy, match="learner@x:1:a"):
        lease.acquire(engine, "rollback@y:2:b", wait=0.2)
    # a restarted learner takes over its predecessor's lease at once
    assert lease.try_acquire(engine, "learner@x:9:c", steal_prefix="learner@")
    assert lease.who(engine)["holder"] == "learner@x:9:c"
    # a holder killed without releasing: its lease expires
    with engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(seconds=1)
        conn.execute(update(PublishLease).values(expires_at=past))
    assert lease.who(engine) is None
    with lease.held(engine, "rollback@y:2:b", wait=1):
        assert not lease.renew(engine, "learner@x:9:c")
        assert lease.renew(engine, "rollback@y:2:b")
    assert lease.who(engine) is None  # released


def test_a_waiting_publisher_hears_who_holds_the_lease_and_outwaits_a_dead_holder(
    engine: Engine,
) -> None:
    """`onthejob rollback` right after a learner was killed holding the lease (the CI run at
    2ac3455 gave up at 30 s of a 60 s lease): it waits the lease out, saying whose it is."""
    assert lease.OUTLASTS_TTL > lease.TTL.total_seconds()
    assert lease.try_acquire(engine, "learner@x:1:a")
    with engine.begin() as conn:  # the killed learner's lease, close to its end
        soon = datetime.now(UTC) + timedelta(seconds=0.5)
        conn.execute(update(PublishLease).values(expires_at=soon))
    heard: list[dict] = []
    lease.acquire(engine, "rollback@y:2:b", wait=lease.OUTLASTS_TTL, on_wait=heard.append)
    assert [h["holder"] for h in heard] == ["learner@x:1:a"]  # told once, not at every look
    assert lease.who(engine)["holder"] == "rollback@y:2:b"
    # free at once: nobody to hear about
    lease.release(engine, "rollback@y:2:b")
    lease.acquire(engine, "rollback@y:3:c", wait=1, on_wait=heard.append)
    assert len(heard) == 1


def test_a_holder_plainly_dead_is_taken_over_at_once_and_no_other(engine: Engine) -> None:
    """A learner killed holding the lease, on this host: `onthejob rollback` need not wait
    out its 60 s. Whatever cannot be judged dead here is waited out as before."""
    named = [sys.executable, "-c", "from learner.swap import lease; print(lease.holder_name('x'))"]
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; from learner.swap import lease; "
         "print(lease.holder_name('learner'), flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as live:  # fmt: skip
        assert live.stdout is not None
        holder = live.stdout.readline().strip()
        assert lease.try_acquire(engine, holder)
        assert not lease.try_acquire(engine, "rollback@y:2:b")  # alive: it is its lease
        host, pid, random, space = holder.partition("@")[2].split(":")
        boot, namespace = space.split("-")
        for elsewhere in (
            f"learner@other-host:{pid}:{random}:{space}",  # another machine
            f"learner@{host}:{pid}:{random}:{boot}-1",  # another container, the host's network
            f"learner@{host}:{pid}:{random}:{'0' * 16}-{namespace}",  # a machine of that name
            f"learner@{host}:{pid}:{random}",  # a name from before names said their namespace
        ):
            assert not lease.is_dead_here(elsewhere)
        live.kill()  # SIGKILL, not reaped yet: a zombie is dead too
        deadline = time.monotonic() + 10
        while not lease.is_dead_here(holder):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert lease.try_acquire(engine, "rollback@y:2:b")
    assert lease.who(engine)["holder"] == "rollback@y:2:b"
    lease.release(engine, "rollback@y:2:b")
    # a process that ended and was reaped
    gone = subprocess.run(named, capture_output=True, text=True, check=True).stdout.strip()
    assert lease.is_dead_here(gone) and not lease.is_dead_here(lease.holder_name("me"))
    assert lease.try_acquire(engine, gone)
    assert lease.try_acquire(engine, "rollback@y:3:c")


def test_the_fence_waits_for_every_live_proxy_to_drain(engine: Engine) -> None:
    proxy(engine, "p1", [A, B], {})
    proxy(engine, "p2", [A], {})
    proxy(engine, "gone", [A], {})
    with engine.begin() as conn:  # a proxy that stopped reporting is not waited for
        old = datetime.now(UTC) - gates.PROXY_TTL - timedelta(seconds=1)
        conn.execute(update(ProxyInstance).where(ProxyInstance.id == "gone").values(seen_at=old))
    fence = Fence(engine, "learner@t", drain_timeout=30, poll=0.01)
    closed = threading.Event()

    def drain_like_proxies() -> None:
        # what each proxy's GateKeeper does once its calls to the replicas have ended
        def epochs() -> dict[str, int]:
            with engine.connect() as conn:
                return {u: g["epoch"] for u, g in gates.read_gates(conn).items() if g["closed"]}

        wait_until(lambda: len(epochs()) == 2, "both gates closed")
        closed.set()
        proxy(engine, "p1", [A, B], epochs())
        proxy(engine, "p2", [A], {A: epochs()[A]})

    helper = threading.Thread(target=drain_like_proxies)
    helper.start()
    fence.close([A, B])
    helper.join()
    assert closed.is_set()
    with engine.connect() as conn:
        assert {u for u, g in gates.read_gates(conn).items() if g["closed"]} == {A, B}
    fence.open([A, B], "v7")
    with engine.connect() as conn:
        state = gates.read_gates(conn)
    assert not state[A]["closed"] and state[A]["version"] == "v7" and state[B]["epoch"] == 1


def test_the_fence_aborts_stragglers_then_gives_up_and_reopens(engine: Engine) -> None:
    proxy(engine, "p1", [A], {})
    aborted: list[list[str]] = []
    fence = Fence(engine, "learner@t", drain_timeout=0.05, abort_grace=0.05, poll=0.01)
    with pytest.raises(FenceError, match="proxies p1 still have requests in flight"):
        fence.close([A], abort_stragglers=aborted.append)
    assert aborted == [[A]]
    with engine.connect() as conn:
        assert not gates.read_gates(conn)[A]["closed"]  # nothing was touched: open again


def test_the_fence_refuses_a_proxy_routing_to_a_replica_it_does_not_know(
    engine: Engine,
) -> None:
    proxy(engine, "p1", [A, "http://localhost:8000"], {})
    with pytest.raises(FenceError, match="same --upstream list"):
        Fence(engine, "learner@t", poll=0.01).close([A])


def test_the_fence_closes_some_of_the_replicas_it_knows_and_no_other(engine: Engine) -> None:
    """A canary's full-weight candidate goes to some of the replicas: the proxies routing to
    all of them are known, the others' gates stay open, an unknown replica is refused."""
    proxy(engine, "p1", [A, B], {})
    fence = Fence(engine, "learner@t", drain_timeout=30, poll=0.01)

    def drain_like_the_proxy() -> None:
        def closed() -> dict[str, int]:
            with engine.connect() as conn:
                return {u: g["epoch"] for u, g in gates.read_gates(conn).items() if g["closed"]}

        wait_until(lambda: B in closed(), "the second gate closed")
        proxy(engine, "p1", [A, B], closed())

    helper = threading.Thread(target=drain_like_the_proxy)
    helper.start()
    fence.close([B], known=[A, B])
    helper.join()
    with engine.connect() as conn:
        assert {u for u, g in gates.read_gates(conn).items() if g["closed"]} == {B}
    fence.open([B], "candidate")
    with pytest.raises(FenceError, match="same --upstream list"):
        fence.close([B])  # the proxy routes to A too, which this close does not know


def test_a_learner_restores_gates_a_dead_publisher_left_closed_not_a_finished_swap_s(
    db_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI: an admin rollback's swap ended between the learner's read of the gates
    (closed) and of the lease (free), the learner swapped the same weights in again, and
    holding the lease for it blocked the operator's next rollback."""
    config = LearnerConfig(
        database_url=db_url, model=str(tmp_path), graders=["feedback"],
        checkpoints=str(tmp_path / "ckpt"),
    )  # fmt: skip
    learner = Learner(config)
    learner.state.shared.publisher = SimpleNamespace(upstreams=[A])  # type: ignore[assignment]
    restored: list[str | None] = []
    # the verified swap itself needs vLLM (tests/e2e/test_learning_vllm.py): record who asked
    monkeypatch.setattr(
        learner.startup,
        "_restore_locked",
        lambda: restored.append((lease.who(engine) or {})["holder"]),
    )
    now = datetime.now(UTC)
    with engine.begin() as conn:  # another publisher swaps: its lease, its gate closed
        gates.close_gate(conn, upstream=A, holder="swap-requests@x:1:a", now=now)
    assert lease.try_acquire(engine, "swap-requests@x:1:a")
    assert not learner.startup.gates_left_closed()  # its swap is running: not ours to restore

    # it ends after the learner read the gates and before it read the lease
    with engine.begin() as conn:
        gates.open_gate(conn, upstream=A, version="v1", now=now)
    lease.release(engine, "swap-requests@x:1:a")
    learner.startup.restore()
    assert restored == []
    assert lease.who(engine) is None  # and the lease is free for the operator's next one

    # a publisher that died mid-swap: its gate stays closed, its lease expired
    with engine.begin() as conn:
        gates.close_gate(conn, upstream=A, holder="learner@x:2:b", now=now)
    assert learner.startup.gates_left_closed()
    learner.startup.restore()
    assert restored == [learner.state.holder]  # restored under the lease
    assert lease.who(engine) is None
