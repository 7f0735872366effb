"""The trainer's threads from the cores the replicas on this host leave free."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from learner.threads import choose_threads, cpu_quota, is_this_host, usable_cores


def test_replicas_on_loopback_or_this_hosts_name_are_on_this_host() -> None:
    assert is_this_host("http://127.0.0.1:8000")
    assert is_this_host("http://localhost:8000/")
    assert is_this_host("http://[::1]:8000")
    assert is_this_host(f"http://{socket.gethostname()}:8000")
    assert not is_this_host("http://10.0.0.7:8000")
    assert not is_this_host("http://vllm:8000")  # another container or machine


def test_a_cpu_trainer_beside_a_local_replica_takes_half_the_cores() -> None:
    local = ["http://127.0.0.1:8000"]
    assert choose_threads(0, local, cores=2, on_gpu=False).threads == 1
    assert choose_threads(0, local, cores=16, on_gpu=False).threads == 8
    assert choose_threads(0, local, cores=1, on_gpu=False).threads == 1
    assert "1 of 2 cores" in choose_threads(0, local, cores=2, on_gpu=False).why


def test_remote_replicas_a_gpu_a_sharded_trainer_or_a_flag_leave_it_to_others() -> None:
    local, remote = ["http://127.0.0.1:8000"], ["http://vllm:8000"]
    assert choose_threads(0, remote, cores=2, on_gpu=False).threads == 0  # torch's default
    assert choose_threads(0, local, cores=2, on_gpu=True).threads == 0
    assert choose_threads(0, local, cores=2, on_gpu=False, sharded=True).threads == 0
    assert choose_threads(3, local, cores=2, on_gpu=False).threads == 3
    # one local replica among remote ones still shares this host's cores
    assert choose_threads(0, [*remote, *local], cores=4, on_gpu=False).threads == 2


def test_the_cores_counted_are_those_the_process_may_run_on_not_the_hosts() -> None:
    one = min(os.sched_getaffinity(0))
    counted = subprocess.run(
        [sys.executable, "-c", "from learner.threads import usable_cores; print(usable_cores())"],
        preexec_fn=lambda: os.sched_setaffinity(0, {one}),  # as `taskset -c` would
        capture_output=True,
        text=True,
        check=True,
    )
    assert counted.stdout.strip() == "1"
    # without cgroup files to read (a quota on this machine would cap the count)
    assert usable_cores(Path("/nonexistent"), Path("/nonexistent")) == len(os.sched_getaffinity(0))


def cgroup_tree(tmp_path: Path, own: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /sys/fs/cgroup under tmp_path holding `files`, and a /proc/self/cgroup of `own`."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "self").write_text(own)
    return root, tmp_path / "self"


@pytest.mark.parametrize(
    ("own", "files", "quota"),
    [
        ("0::/\n", {"cpu.max": "150000 100000\n"}, 1.5),  # v2, inside a container
        ("0::/box\n", {"box/cpu.max": "200000 100000\n"}, 2.0),  # v2, a nested group
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # v2, unlimited
        ("3:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "100000",
                               "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 1.0),  # v1
        ("3:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1",
                               "cpu,cpuacct/cpu.cfs_period_us": "100000"}, None),
        ("0::/\n", {}, None),  # no controller files: not limited as far as we know
        # a slice's quota binds the scope under it: the smallest on the way up counts
        ("0::/slice/scope\n", {"slice/cpu.max": "100000 100000",
                                "slice/scope/cpu.max": "max 100000"}, 1.0),
        ("0::/slice/scope\n", {"cpu.max": "300000 100000",
                                "slice/scope/cpu.max": "200000 100000"}, 2.0),
        ("4:cpu,cpuacct:/a\n", {"cpu/cpu.cfs_quota_us": "50000",
                                "cpu/cpu.cfs_period_us": "100000"}, 0.5),  # v1 under "cpu"
    ],
)  # fmt: skip
def test_a_cgroup_cpu_quota_is_read_in_either_version(
    tmp_path: Path, own: str, files: dict[str, str], quota: float | None
) -> None:
    assert cpu_quota(*cgroup_tree(tmp_path, own, files)) == quota


def test_a_quota_caps_the_cores_counted(tmp_path: Path) -> None:
    """A container with `cpus: 1.5` on this host counts 2 cores' worth at most, 1 at least."""
    affinity = len(os.sched_getaffinity(0))
    capped = usable_cores(*cgroup_tree(tmp_path, "0::/\n", {"cpu.max": "150000 100000"}))
    assert capped == min(affinity, 2)
    tiny = usable_cores(*cgroup_tree(tmp_path / "t", "0::/\n", {"cpu.max": "10000 100000"}))
    assert tiny == 1
    assert usable_cores(tmp_path / "none", tmp_path / "missing") == affinity
