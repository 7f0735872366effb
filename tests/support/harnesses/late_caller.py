"""A harness whose model call is recorded only after its run was finished (for the test of
the runner picking such runs up at the end of a rollout).

Prompt with LATE: starts a detached helper and exits at once; the helper waits until the
runner has finished the run (ONTHEJOB_HARNESS_DB, the runner's database), then calls the
model under the run's session and, once that call is in the database, writes the marker
ONTHEJOB_HARNESS_MARKERS/called. Prompt with WAIT: exits when that marker exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from store import db
from store.models import Call, RolloutRun
from tests.support.harnesses import urllib_answerer

DEADLINE = 60.0


def wait_until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"late_caller: {what} never happened")
        time.sleep(0.05)


def helper() -> int:
    engine = db.make_engine(os.environ["ONTHEJOB_HARNESS_DB"])
    session = os.environ["ONTHEJOB_SESSION"]

    def run_finished() -> bool:
        with engine.connect() as conn:
            status = conn.execute(
                select(RolloutRun.status).where(RolloutRun.session_key == session)
            ).scalar()
        return status not in (None, "running")

    def call_recorded() -> bool:
        with engine.connect() as conn:
            query = select(func.count()).select_from(Call).where(Call.session_key == session)
            return bool(conn.execute(query).scalar_one())

    wait_until(run_finished, "the run's end")
    sys.stdin = open(os.devnull)  # the prompt comes from ONTHEJOB_PROMPT
    urllib_answerer.main()
    wait_until(call_recorded, "the late call's record")
    (Path(os.environ["ONTHEJOB_HARNESS_MARKERS"]) / "called").touch()
    engine.dispose()
    return 0


def main() -> int:
    if sys.argv[1:] == ["--helper"]:
        return helper()
    prompt = sys.stdin.read()
    if "LATE" in prompt:
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.harnesses.late_caller", "--helper"],
            start_new_session=True,  # outlives the run's process group
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    elif "WAIT" in prompt:
        marker = Path(os.environ["ONTHEJOB_HARNESS_MARKERS"]) / "called"
        wait_until(marker.exists, "the late call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
