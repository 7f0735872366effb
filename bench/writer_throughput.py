"""The recording path without the proxy around it: what a call costs on the event loop, and
how many calls a second the writer moves from the call log into each database.

1. The event loop's share (`Recorder.record`: the record as JSON, one write() to the call
   log), per call, split into its steps, for the calls the proxy bench sends (the constant
   upstream's answer: 20 prompt and 6 completion tokens, every call its own trajectory).
2. The writer alone: the call log filled with N such calls first, then the writer thread
   started on it and timed until every call is in the database, on PostgreSQL (a scratch
   database on --db's server, dropped afterwards) and on SQLite (a temporary file).

Each figure is repeated --repeat times, printed each time, then as median (min-max). The
machine's other load moves these numbers: pin with --cpus (e.g. `--cpus 0`) and compare
figures from one run.

Run: .venv/bin/python -m bench.writer_throughput [--calls 50000] [--repeat 3] [--cpus 0]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from bench.fake_upstream import chat_body
from bench.proxy_overhead import MESSAGES, parse_cpus, plain_pg_url, scratch_database
from proxy.base.capture import CHAT, capture_response, prepare_upstream_body, strip_response
from proxy.base.record import CallRecord
from proxy.recording.calllog import CallLog
from proxy.recording.recorder import Recorder, log_directory, rejected_path
from proxy.recording.rows import entry_of
from proxy.recording.spool import Spool
from proxy.recording.stitching import TrajectoryTracker, new_id
from proxy.recording.writer import Writer
from store import db


def a_call() -> CallRecord:
    """One call as the proxy records it for the bench's request to the constant upstream."""
    request = {"model": "fake", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    upstream, asked = prepare_upstream_body(CHAT, request)
    data = orjson.loads(chat_body(upstream))
    capture = capture_response(CHAT, data)
    strip_response(CHAT, data, asked)
    return CallRecord(
        id=new_id(),
        api=CHAT,
        session_key=None,
        started_at=time.time(),
        request=request,
        response=data,
        chat_messages=request["messages"],
        upstream="http://127.0.0.1:9000",
        model="fake",
        policy_version="v0",
        capture=capture,
        latency_ms=0.4,
    )


def per_call_us(step: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - start) / calls * 1e6


def loop_costs(calls: int, workdir: Path) -> dict[str, float]:
    """µs per call of each step of Recorder.record, and of the whole."""
    call = a_call()
    entry = entry_of(call)
    line = orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)
    log = CallLog(workdir / "cost.d")
    log.open()
    try:
        costs = {
            "entry_of": per_call_us(lambda: entry_of(call), calls),
            "orjson.dumps": per_call_us(
                lambda: orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE), calls
            ),
            "write()": per_call_us(lambda: log.append(line), calls),
        }
    finally:
        log.close()
    recorder = Recorder(
        None,  # type: ignore[arg-type]  # no writer is started: the loop's share alone
        workdir / "record.jsonl",
        idle_timeout=300,
        flush_interval=0.05,
    )
    recorder.log.open()
    try:
        costs["Recorder.record"] = per_call_us(lambda: recorder.record(call), calls)
    finally:
        recorder.log.close()
    costs["bytes per call"] = float(len(line))
    return costs


def fill_log(spool: Path, calls: int) -> None:
    log = CallLog(log_directory(spool))
    log.open()
    template = a_call()
    try:
        for _ in range(calls):
            template.id = new_id()
            template.started_at = time.time()
            log.append(orjson.dumps(entry_of(template), option=orjson.OPT_APPEND_NEWLINE))
    finally:
        log.close()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def writer_rate(url: str, calls: int, workdir: Path, batch: int) -> tuple[float, float]:
    """(calls per second, CPU µs per call in this process) of the writer moving a filled
    call log into the database at url. The CPU figure leaves out the database server's and
    is less moved by other load than the rate: 1e6 / it is what one free core would do."""
    spool = workdir / f"writer-{new_id()}.jsonl"
    fill_log(spool, calls)
    engine = db.make_engine(url)
    log = CallLog(log_directory(spool))
    log.open()
    writer = Writer(
        engine,
        log,
        tracker=TrajectoryTracker(idle_timeout=300),
        rejected=Spool(rejected_path(spool)),
        flush_interval=0.05,
        batch_calls=batch,
        batch_bytes=8 << 20,
    )
    writer.replay_until = writer.cursor  # the log is this run's own: nothing to look up
    done = threading.Event()
    try:
        start, cpu = time.perf_counter(), cpu_seconds()
        writer.start()
        while writer.processed < calls:
            done.wait(0.005)
        elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    finally:
        writer.stop(drain_seconds=0)
        log.close()
        engine.dispose()
    if writer.written != calls:
        raise RuntimeError(f"the writer wrote {writer.written} of {calls} calls")
    return calls / elapsed, cpu / calls * 1e6


def summary(values: list[float], unit: str, digits: int = 0) -> str:
    fmt = f"{{:,.{digits}f}}"
    spread = f"{fmt.format(min(values))}-{fmt.format(max(values))}"
    return f"{fmt.format(statistics.median(values))} {unit} (min-max {spread})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.writer_throughput", description=(__doc__ or "").split("\n\nRun:")[0]
    )
    parser.add_argument("--calls", type=int, default=50_000, help="calls per writer run")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each figure (default 3)")
    parser.add_argument("--batch", type=int, default=500, help="writer batch in calls")
    parser.add_argument(
        "--db",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="PostgreSQL server for the scratch database (default %(default)s)",
    )
    parser.add_argument("--cpus", metavar="LIST", help="run pinned to these CPUs, e.g. 0")
    parser.add_argument("--skip", choices=["postgres", "sqlite"], action="append", default=[])
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, parse_cpus(args.cpus))
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="onthejob-writer-") as tmp:
        workdir = Path(tmp)
        print(f"{os.cpu_count()} CPUs, pinned to {args.cpus or 'none'}, 1-min load {load:.1f}")
        costs: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for name, value in loop_costs(20_000, workdir).items():
                costs.setdefault(name, []).append(value)
        print("event loop, per call (Recorder.record and its steps):")
        for name, values in costs.items():
            unit = "bytes" if name == "bytes per call" else "us"
            print(f"  {name:<16} {summary(values, unit, 0 if unit == 'bytes' else 1)}")
        targets = []
        if "postgres" not in args.skip:
            targets.append(("PostgreSQL", plain_pg_url(args.db)))
        if "sqlite" not in args.skip:
            targets.append(("SQLite", f"sqlite:///{workdir / 'bench.db'}"))
        for name, url in targets:
            with scratch_database(url, name == "PostgreSQL") as scratch:
                db.upgrade(scratch)
                rates, cpus = [], []
                for _ in range(args.repeat):
                    rate, cpu = writer_rate(scratch, args.calls, workdir, args.batch)
                    rates.append(rate)
                    cpus.append(cpu)
                    print(
                        f"  {name} writer: {rate:,.0f} calls/s, {cpu:.0f} us CPU per call "
                        f"({args.calls:,} calls)"
                    )
                print(f"{name} writer alone: {summary(rates, 'calls/s')}")
                print(f"{name} writer CPU: {summary(cpus, 'us per call', 0)}")
    print(f"1-min load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
