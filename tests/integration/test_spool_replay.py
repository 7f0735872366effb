"""A row the database refuses in the middle of a session, and `onthejob spool replay`, on
SQLite and PostgreSQL with a real proxy process.

The database refuses one call of three (an operator's rule its row breaks); the other two
are written, the refused one waits in `<spool>.rejected`. A replay while the rule stands
writes nothing and says so; once the rule is gone it writes the row, and the session is
whole again: the later call's prompt, stored relative to the refused one, rebuilds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
from sqlalchemy import Engine, select, text

from learner.proxy_process import ProxyServer
from store import db
from store.models import Call
from tests.support.cli import onthejob
from tests.support.fake_vllm import PROMPT_IDS, TOKEN_IDS, FakeVLLM
from tests.support.records import count_calls, export, wait_for_calls

BANNED = "banned-agent/1.0"


def _ban(engine: Engine, url: str) -> None:
    with engine.begin() as conn:
        if db.is_sqlite(url):
            conn.execute(
                text(
                    "CREATE TRIGGER no_agent BEFORE INSERT ON calls "
                    f"WHEN NEW.user_agent = '{BANNED}' BEGIN SELECT RAISE(ABORT, 'no_agent'); END"
                )
            )
        else:
            conn.execute(
                text(
                    "ALTER TABLE calls ADD CONSTRAINT no_agent "
                    f"CHECK (user_agent IS DISTINCT FROM '{BANNED}')"
                )
            )


def _lift(engine: Engine, url: str) -> None:
    statement = (
        "DROP TRIGGER no_agent"
        if db.is_sqlite(url)
        else "ALTER TABLE calls DROP CONSTRAINT no_agent"
    )
    with engine.begin() as conn:
        conn.execute(text(statement))


def test_a_refused_row_mid_session_is_written_by_spool_replay_once_its_cause_is_fixed(
    db_url: str, engine: Engine, start_proxy: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    _ban(engine, db_url)
    spool = tmp_path / "spool.jsonl"
    rejected = tmp_path / "spool.jsonl.rejected"
    with FakeVLLM() as upstream:
        proxy = start_proxy([upstream.url], db_url, spool=spool)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for agent in ("agent/1.0", BANNED, "agent/1.0"):
            answer = httpx.post(
                proxy.url + "/s/run-1/v1/chat/completions",
                json=body,
                headers={"User-Agent": agent},
            )
            assert answer.status_code == 200, answer.text
        proxy.wait_for(lambda h: h["recording"]["backlog_calls"] == 0, "all three handled")
        assert proxy.health()["recording"]["rejected"] == 1
        assert count_calls(engine) == 2 and rejected.exists()
        (trajectory,) = export(engine)
        assert trajectory["calls"][-1]["prompt_token_ids"] is None  # its parent is missing

        still = onthejob("spool", "replay", "--db", db_url, "--spool", str(spool))
        assert still.returncode == 1, still.stdout + still.stderr
        assert "0 rows written, 1 still refused" in still.stdout and "no_agent" in still.stdout
        assert count_calls(engine) == 2 and rejected.exists()

        _lift(engine, db_url)  # the cause is fixed; the proxy keeps running meanwhile
        fixed = onthejob("spool", "replay", "--db", db_url, "--spool", str(spool))
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "1 rows written, 0 still refused" in fixed.stdout
        assert not rejected.exists()
        again = onthejob("spool", "replay", "--db", db_url, "--spool", str(spool))
        assert again.returncode == 0 and "0 rows written, 0 still refused" in again.stdout

        wait_for_calls(engine, 3)
        (trajectory,) = export(engine)
        calls = trajectory["calls"]
        assert [c["user_agent"] for c in calls] == ["agent/1.0", BANNED, "agent/1.0"]
        assert calls[-1]["prompt_token_ids"] == PROMPT_IDS  # rebuilt through the replayed row
        with engine.connect() as conn:
            parent = conn.execute(select(Call.prompt_parent_id).where(Call.id == calls[2]["id"]))
            assert parent.scalar() == calls[1]["id"]
        assert calls[1]["completion_token_ids"] == TOKEN_IDS
