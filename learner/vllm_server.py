"""Start and stop a local vLLM-CPU OpenAI server as a subprocess (the demo's, the benches' and
the tests'), in the dtype the CPU computes natively where asked for "auto" (`serving_dtype`).

Usage::

    with VLLMServer(model_dir) as server:
        httpx.get(server.url + "/v1/models")
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    """A port that was free a moment ago (the server binds it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (vLLM runs an engine child)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Field 4 of /proc/PID/stat is the parent; the name (field 2) may hold spaces.
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


# glibc returns big blocks to the system when they are freed (mmap above 32 MB, the heap's
# top trimmed), so every weight update faults in its fresh tensors and packed kernels page by
# page: 0.29 s against 0.19 s a SmolLM2 update (bench/swap_transport.py). Kept, they are
# reused; the replica's memory stays at its peak, which a reload reaches anyway.
MALLOC_KEEPS_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}


def serving_dtype(requested: str) -> str:
    """``requested``, with "auto" resolved: bfloat16 on a CPU with AVX-512-BF16 or AMX (where
    vLLM-CPU and the trainer compute bf16 natively), else float32."""
    if requested != "auto":
        return requested
    import torch  # only here: the launcher itself runs without the learn extra

    native = (
        getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    )
    return "bfloat16" if native else "float32"


class VLLMServer:
    """One vLLM OpenAI API server on 127.0.0.1, a free port, logging to a file."""

    def __init__(
        self,
        model_dir: Path | str,
        *,
        port: int | None = None,
        log_path: Path | str | None = None,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        kv_cache_gib: int = 1,
        startup_timeout_s: float = 300.0,
        max_lora_rank: int | None = None,
        dtype: str = "float32",
        weight_transfer: bool = False,
    ) -> None:
        """``max_lora_rank``: serve LoRA adapters up to this rank, loadable at runtime;
        ``dtype``: what vLLM computes in (``--dtype``); ``weight_transfer``: take weights
        through our weight-transfer engine too (learner/swap/vllm_transfer.py), so the
        learner swaps without the disk."""
        self.model_dir = Path(model_dir)
        self.dtype = dtype
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.extra_args = list(extra_args)
        self.extra_env = dict(extra_env or {})
        if weight_transfer:
            from learner.swap.vllm_plugin import BACKEND

            self.extra_args += ["--weight-transfer-config", json.dumps({"backend": BACKEND})]
        if max_lora_rank is not None:
            self.extra_args += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
            self.extra_env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        self.kv_cache_gib = kv_cache_gib
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None  # measured wall time until /health was OK

    @property
    def model_name(self) -> str:
        """The name clients must send: --served-model-name if given, else the --model path."""
        if "--served-model-name" in self.extra_args:
            return self.extra_args[self.extra_args.index("--served-model-name") + 1]
        return str(self.model_dir)

    def command(self) -> list[str]:
        from learner.swap.publisher import WEIGHT_CHECK_EXTENSION  # not at import: the store

        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            "2048",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            # Logprobs after temperature/penalties: what the sampler really used.
            "--logprobs-mode",
            "processed_logprobs",
            # /v1/chat/completions/render: the proxy learns the sampling defaults from it
            "--enable-scale-out",
            # checksums of the weights its kernels use: each swap is verified exactly
            "--worker-extension-cls",
            WEIGHT_CHECK_EXTENSION,
            *self.extra_args,
        ]

    def start(self) -> VLLMServer:
        env = {
            # vLLM 0.32 with torch 2.13 compiles ahead of time by default, and on CPU fails to
            # load what it saved ("'function' object has no attribute 'finalize_loading'"),
            # so every start compiled again: 86 s of a 140 s start on 2 AVX2 cores. Without
            # it, torch.compile's own cache serves later starts. The environment may say 1.
            "VLLM_USE_AOT_COMPILE": "0",
            **MALLOC_KEEPS_MEMORY,
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            # Enables /collective_rpc, /pause, /resume, /weight_info: weight hot-swap.
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",  # nothing to download; fail fast instead of hanging
            **self.extra_env,
        }
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            # through parent_watch: vLLM stops with this process even when it is killed
            watched = [sys.executable, "-m", "learner.demo.parent_watch", str(os.getpid()), "--"]
            self.proc = subprocess.Popen(
                watched + self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stop() reaches the engine too
            )
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self, t0: float) -> None:
        assert self.proc is not None
        deadline = t0 + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with {self.proc.returncode} during start-up; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(
            f"vLLM server not healthy after {self.startup_timeout_s:.0f} s; "
            f"log tail:\n{self.log_tail()}"
        )

    def rss_bytes(self) -> int:
        """Resident memory of the server and its engine processes, now."""
        return _rss_bytes(self.proc.pid) if self.proc and self.proc.poll() is None else 0

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def stop(self, timeout_s: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        # SIGTERM to the whole group lets vLLM shut its engine core down cleanly.
        for sig in (signal.SIGTERM, signal.SIGKILL) if proc.poll() is None else ():
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=timeout_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # Engine children that outlived the API process would hold memory and CPU.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
