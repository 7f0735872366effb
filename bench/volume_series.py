"""The flat-cost series of bench/proxy_overhead.py (`--series N`): one proxy under one
continuous load, measured per segment of `--per` calls (default 100,000).

Each segment is one wrk run at `--connections` whose threads stop after their share of the
segment's answers, so segments follow each other with no pause and the writer never gets
time off. Per segment: req/s, p50 and p99, the proxy's CPU per call (loop and writer
together; less moved by other load on the machine than req/s), its RSS, and the recording
backlog at the segment's end (calls answered but not yet in the database: growing means
the writer does not keep up). At the end, every segment against the first: the aim is
req/s and p50 within 10%.

On a shared virtual machine the host itself speeds up and slows down by 10-20% over
minutes, and the proxy's req/s and CPU per call move with it, either way. So before each
segment the series also times a fixed piece of Python work on the proxy's CPU
(bench/host_speed.py) and reports CPU per call in those rounds too: a cost that grows with
volume shows there, a slower host does not.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.host_speed import python_us_per_round
from bench.proxy_overhead import (
    CLK_TCK,
    HOST,
    PROXY_LOOP,
    PROXY_TOTAL,
    cpu_snapshot,
    http_get_json,
    request_body,
    run_wrk,
    write_wrk_script,
)

if TYPE_CHECKING:
    from bench.proxy_overhead import Bench

FLAT_WITHIN = 0.10
SEGMENT_CAP_S = 600.0  # a segment that has not finished by then is cut short


@dataclass
class Segment:
    index: int
    calls: int  # sent in this segment
    rps: float
    p50_ms: float | None
    p99_ms: float | None
    cpu_us_per_call: float
    # of which the event loop's thread (the rest: the writer and the call log's fsync)
    loop_us_per_call: float
    # the host's speed just before: CPU µs per round of fixed Python work on the proxy's
    # CPU (bench/host_speed.py); what the host's other tenants move, the proxy not at all
    host_us: float
    cpu_share: float  # of one core, over the segment: under ~95% the proxy was not all busy
    rss_mib: float
    backlog_calls: int
    written: int


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def run_series(bench: Bench, segments: int, per: int) -> list[Segment]:
    assert bench.proxy is not None and bench.upstream is not None
    args = bench.args
    threads = min(args.wrk_threads, args.connections)
    script = bench.workdir / "series.lua"
    write_wrk_script(script, request_body(False), args.session, stop_after=max(1, per // threads))
    out: list[Segment] = []
    sent = completed = 0
    print(
        f"series: {segments} x {per:,} calls at c={args.connections}, no pause between "
        "segments (wrk stops each after its share of answers)"
    )
    print(
        f"  {'segment':>7} {'calls':>11} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'CPU/call':>9} {'loop':>7} {'host':>7} {'CPU':>5} {'RSS MiB':>8} {'backlog':>8}"
    )
    cpu = _single_cpu(args.proxy_cpus)
    for index in range(1, segments + 1):
        host_us = python_us_per_round(cpu)
        before = cpu_snapshot(bench.proxy.pid, bench.upstream.pid)
        result = run_wrk(
            script,
            bench.proxy_port,
            args.connections,
            threads,
            SEGMENT_CAP_S,
            args.load_cpus,
            until_threads_stop=True,
        )
        after = cpu_snapshot(bench.proxy.pid, bench.upstream.pid)
        bench.proxy.check_alive()
        health: dict[str, Any] = http_get_json(f"http://{HOST}:{bench.proxy_port}/healthz")
        recording = health.get("recording", {})
        cpu_ticks = after[PROXY_TOTAL] - before[PROXY_TOTAL]
        loop_ticks = after[PROXY_LOOP] - before[PROXY_LOOP]
        segment = Segment(
            index=index,
            calls=result.sent,
            rps=result.rps,
            p50_ms=result.p50_ms,
            p99_ms=result.p99_ms,
            cpu_us_per_call=_ticks_to_us(cpu_ticks) / max(1, result.completed),
            loop_us_per_call=_ticks_to_us(loop_ticks) / max(1, result.completed),
            host_us=host_us,
            cpu_share=_ticks_to_us(cpu_ticks) / 1e6 / max(result.seconds, 1e-9),
            rss_mib=rss_mib(bench.proxy.pid),
            backlog_calls=int(recording.get("backlog_calls", -1)),
            written=int(recording.get("written", -1)),
        )
        out.append(segment)
        sent += result.sent
        completed += result.completed
        print(
            f"  {index:>7} {sent:>11,} {segment.rps:>8,.0f} {_ms(segment.p50_ms):>7} "
            f"{_ms(segment.p99_ms):>7} {segment.cpu_us_per_call:>6.0f} us "
            f"{segment.loop_us_per_call:>4.0f} us {segment.host_us:>5.2f}us "
            f"{segment.cpu_share:>5.0%} {segment.rss_mib:>8.0f} {segment.backlog_calls:>8,}"
            + (
                f"  ({result.non_2xx} non-2xx, {result.socket_errors} socket errors)"
                if result.non_2xx or result.socket_errors
                else ""
            )
        )
    waited = bench.after_proxy_load(sent, completed)
    print(f"  the database had every call {waited:.1f} s after the last segment")
    return out


def report_series(series: list[Segment]) -> bool:
    """Each segment against the first; True when req/s and p50 stayed within 10%."""
    first = series[0]
    flat = True
    print()
    print(f"Against segment 1 ({first.rps:,.0f} req/s, p50 {_ms(first.p50_ms)} ms):")
    for segment in series[1:]:
        rps_ratio = segment.rps / first.rps if first.rps else float("nan")
        p50_ratio = (segment.p50_ms or 0.0) / first.p50_ms if first.p50_ms else float("nan")
        ok = abs(rps_ratio - 1) <= FLAT_WITHIN and abs(p50_ratio - 1) <= FLAT_WITHIN
        flat = flat and ok
        print(
            f"  segment {segment.index:>2}: req/s x{rps_ratio:.2f}, p50 x{p50_ratio:.2f}, "
            f"CPU/call x{segment.cpu_us_per_call / first.cpu_us_per_call:.2f}"
            f"{'' if ok else '  <- outside 10%'}"
        )
    rates = [s.rps for s in series]
    print(
        f"req/s median {statistics.median(rates):,.0f} (min {min(rates):,.0f}, max "
        f"{max(rates):,.0f}); RSS {series[0].rss_mib:.0f} -> {series[-1].rss_mib:.0f} MiB; "
        f"backlog at the end {series[-1].backlog_calls:,}"
    )
    print(f"Aim: req/s and p50 within 10% of segment 1 -> {'MET' if flat else 'MISSED'}")
    # One segment's noise can cross 10% either way; a cost that grows with volume shows as a
    # trend across all of them instead.
    for label, values in (
        ("req/s", [s.rps for s in series]),
        ("p50", [s.p50_ms or 0.0 for s in series]),
        ("CPU/call", [s.cpu_us_per_call for s in series]),
    ):
        print(f"Trend of {label}: {_trend(values)}")
    # what other load on the machine moves least: the proxy's own CPU per call
    cpu_flat = all(
        abs(s.cpu_us_per_call / first.cpu_us_per_call - 1) <= FLAT_WITHIN for s in series[1:]
    )
    # and with the host's speed taken out: CPU per call in rounds of the fixed Python work
    # measured on the proxy's CPU just before the segment
    relative = [s.cpu_us_per_call / s.host_us for s in series]
    print(
        "Host speed against segment 1 (its CPU per round of fixed Python work): "
        + ", ".join(f"x{s.host_us / first.host_us:.2f}" for s in series[1:])
    )
    print(f"Trend of CPU/call in host rounds: {_trend(relative)}")
    relative_flat = all(abs(r / relative[0] - 1) <= FLAT_WITHIN for r in relative[1:])
    print(
        "CPU/call in host rounds within 10% of segment 1 -> "
        f"{'yes' if relative_flat else 'no'} ("
        + ", ".join(f"x{r / relative[0]:.2f}" for r in relative[1:])
        + ")"
    )
    shares = [s.cpu_share for s in series]
    print(
        f"CPU per call within 10% of segment 1 -> {'yes' if cpu_flat else 'no'}; the proxy "
        f"had {min(shares):.0%}-{max(shares):.0%} of its core (under ~95%: other load took "
        "some, and req/s and p50 moved with it)"
    )
    return flat


def _single_cpu(cpus: str | None) -> int | None:
    """The proxy's CPU when it is pinned to one ("0"), else None."""
    if cpus is None or not cpus.strip().isdigit():
        return None
    return int(cpus)


def _trend(values: list[float]) -> str:
    """Least-squares line through the segments: its change from the first segment to the
    last as a share of the mean, and the scatter around it, so growth and noise read apart."""
    if len(values) < 3:
        return "n/a (fewer than 3 segments)"
    xs = list(range(len(values)))
    slope, intercept = statistics.linear_regression(xs, values)
    mean = statistics.fmean(values)
    residuals = [v - (intercept + slope * x) for x, v in zip(xs, values, strict=True)]
    scatter = statistics.pstdev(residuals) / mean if mean else float("nan")
    change = slope * (len(values) - 1) / mean if mean else float("nan")
    return (
        f"{change:+.1%} over the run by the fitted line ({slope / mean:+.2%} a segment); "
        f"segments scatter {scatter:.1%} (sd) around it"
    )


def _ticks_to_us(ticks: float) -> float:
    return ticks / CLK_TCK * 1e6


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
