"""The compose files' structure and that everything they use is documented (no Docker needed).

docker-compose.yml (GPU) and docker-compose.cpu.yml (vLLM-CPU) are parsed with PyYAML; when a
`docker compose` CLI is installed, it also has to accept both files.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from learner.config import LearnerConfig
from proxy.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
GPU_FILE = ROOT / "docker-compose.yml"
CPU_FILE = ROOT / "docker-compose.cpu.yml"
ENV_EXAMPLE = ROOT / ".env.example"
COMPOSE_FILES = [GPU_FILE, CPU_FILE]

SERVICES = {"postgres", "migrate", "vllm", "proxy", "learner"}
ONE_SHOT = {"migrate"}
CHECKPOINTS = "/checkpoints"

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}; $$ escapes a $.
VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)")
# `NAME=value` or `# NAME=value` at the start of a line of .env.example.
ASSIGNMENT = re.compile(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(\S*)$")


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.name} is not a mapping"
    return data


def services(path: Path) -> dict[str, dict[str, Any]]:
    return load(path)["services"]


def env_example() -> str:
    return ENV_EXAMPLE.read_text()


def documented_names() -> set[str]:
    """Every upper-case NAME that .env.example mentions (assigned, commented or in prose)."""
    return set(re.findall(r"\b[A-Z][A-Z0-9_]+\b", env_example()))


def commented_defaults() -> dict[str, str]:
    """`# NAME=value` lines: settings left unset, showing the built-in default."""
    out = {}
    for line in env_example().splitlines():
        match = ASSIGNMENT.match(line)
        if match and match.group(1):
            out[match.group(2)] = match.group(3).strip()
    return out


def volume_targets(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source (named volume or host path) for short-syntax volumes."""
    out = {}
    for entry in service.get("volumes", []):
        # colons inside ${VAR:-default} are not separators
        source, target = re.split(r":(?![^{}]*\})", entry)[:2]
        out[target] = source
    return out


def gpu_reservations(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [d for d in devices.get("devices", []) if "gpu" in d.get("capabilities", [])]


def argv(service: dict[str, Any]) -> list[str]:
    return [*(service.get("entrypoint") or []), *(service.get("command") or [])]


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_services_and_only_the_proxy_published(path: Path) -> None:
    svc = services(path)
    assert set(svc) == SERVICES
    for name, service in svc.items():
        if name != "proxy":
            assert "ports" not in service, f"{name} must not be published"
    # vLLM's dev-mode (hot-swap) endpoints: compose network only
    assert svc["vllm"]["expose"] == ["8000"]
    (published,) = svc["proxy"]["ports"]
    assert published.endswith(":8080")
    assert "${PROXY_PORT" in published


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_health_checks_restart_policies_and_start_order(path: Path) -> None:
    svc = services(path)
    for name, service in svc.items():
        if name in ONE_SHOT:
            assert service["restart"] == "no"
            continue
        assert service["restart"] in ("unless-stopped", "always"), name
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    checks = {
        name: " ".join(s["healthcheck"]["test"]) for name, s in svc.items() if name != "migrate"
    }
    assert "pg_isready" in checks["postgres"]
    assert "127.0.0.1:8000/health" in checks["vllm"]
    assert "127.0.0.1:8080/healthz" in checks["proxy"]

    def condition(name: str, on: str) -> str:
        return svc[name]["depends_on"][on]["condition"]

    assert condition("migrate", "postgres") == "service_healthy"
    for name in ("vllm", "proxy", "learner"):
        assert condition(name, "migrate") == "service_completed_successfully"
    for name in ("proxy", "learner"):
        assert condition(name, "vllm") == "service_healthy"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_migrations_vllm_flags_and_wiring(path: Path) -> None:
    svc = services(path)
    assert svc["migrate"]["command"] == ["onthejob", "db", "upgrade"]
    vllm = " ".join(argv(svc["vllm"]))
    # what learner/vllm_server.py starts vLLM with, and the learner relies on
    for flag in (
        "vllm.entrypoints.openai.api_server",
        "--logprobs-mode=processed_logprobs",
        "--dtype=float32",
        "--enable-auto-tool-choice",
        "--host=0.0.0.0",
        "--port=8000",
    ):
        assert flag in vllm, flag
    assert svc["vllm"]["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert svc["proxy"]["environment"]["ONTHEJOB_UPSTREAMS"] == "http://vllm:8000"
    learner = svc["learner"]["command"]
    assert learner[:2] == ["onthejob", "learn"]
    assert learner[learner.index("--upstream") + 1] == "http://vllm:8000"
    assert learner[learner.index("--checkpoints") + 1] == CHECKPOINTS
    # vLLM loads the model the learner trains from the same path
    model_arg = next(a for a in argv(svc["vllm"]) if a.startswith("--model="))
    assert learner[learner.index("--model") + 1] == model_arg.removeprefix("--model=")
    for name in ("migrate", "proxy", "learner"):
        url = svc[name]["environment"]["ONTHEJOB_DATABASE_URL"]
        assert url.startswith("postgresql://") and "@postgres:5432/" in url


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_learner_and_vllm_share_the_checkpoint_volume(path: Path) -> None:
    data = load(path)
    svc = data["services"]
    learner, vllm = volume_targets(svc["learner"]), volume_targets(svc["vllm"])
    assert learner[CHECKPOINTS] == vllm[CHECKPOINTS]
    assert learner[CHECKPOINTS] in data["volumes"], "a named volume, not a host path"
    assert learner["/models"] == vllm["/models"]
    assert not any(v.endswith(f"{CHECKPOINTS}:ro") for v in svc["learner"]["volumes"])
    assert volume_targets(svc["postgres"])["/var/lib/postgresql/data"] in data["volumes"]


def test_gpu_reservations_only_in_the_gpu_file() -> None:
    gpu, cpu = services(GPU_FILE), services(CPU_FILE)
    for name in ("vllm", "learner"):
        (device,) = gpu_reservations(gpu[name])
        assert device["driver"] == "nvidia"
        assert "vllm/vllm-openai" not in cpu[name].get("image", "")
    assert gpu["learner"]["environment"]["ONTHEJOB_LEARN_DEVICE"] == "cuda"
    assert "${VLLM_IMAGE" in gpu["vllm"]["image"]
    for name, service in cpu.items():
        assert not gpu_reservations(service), name
    assert cpu["learner"]["environment"]["ONTHEJOB_LEARN_DEVICE"] == "cpu"
    # vLLM-CPU comes from this repo's image built with the cpu extra
    assert "cpu" in cpu["vllm"]["build"]["args"]["EXTRAS"].split(",")


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_secrets_come_from_env_only(path: Path) -> None:
    text = path.read_text()
    assert "${POSTGRES_PASSWORD:?" in text
    for line in text.splitlines():
        if "PASSWORD" in line or "TOKEN" in line:
            assert "${" in line or line.lstrip().startswith("#"), line
    docker = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"PASSWORD|_TOKEN|API_KEY", docker)
    assert re.search(r"^USER (?!root)\S+", docker, re.M), "the image runs as a non-root user"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignored and "!.env" not in ignored


def test_every_compose_variable_is_documented() -> None:
    used = set()
    for path in COMPOSE_FILES:
        used |= set(VARIABLE.findall(path.read_text()))
    assert {"POSTGRES_PASSWORD", "MODEL", "PROXY_PORT"} <= used
    missing = sorted(used - documented_names())
    assert not missing, f"used in a compose file, not documented in .env.example: {missing}"


def test_every_setting_is_documented_with_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    names = documented_names()
    proxy = {f"ONTHEJOB_{name.upper()}": name for name in Settings.model_fields}
    learner = {
        f"ONTHEJOB_LEARN_{f.name.upper()}": f.name for f in dataclasses.fields(LearnerConfig)
    }
    missing = sorted((set(proxy) | set(learner)) - names)
    assert not missing, f"settings not documented in .env.example: {missing}"

    # A commented `# NAME=value` line claims the built-in default: parse it as the code does.
    defaults = commented_defaults()
    assert len(defaults) > 20
    for env in (*proxy, *learner):
        monkeypatch.delenv(env, raising=False)
    reference = Settings()
    for env, value in defaults.items():
        if env in proxy:
            field = proxy[env]
            if value == "":
                assert getattr(reference, field) is None, env
                continue
            monkeypatch.setenv(env, value)
            assert getattr(Settings(), field) == getattr(reference, field), env
            monkeypatch.delenv(env)
        elif env in learner:
            field = learner[env]
            built_in = LearnerConfig(model="-")
            if value == "":
                assert getattr(built_in, field) is None, env
                continue
            monkeypatch.setenv(env, value)
            loaded = LearnerConfig.load(config_file=None, overrides={"model": "-"})
            assert getattr(loaded, field) == getattr(built_in, field), env
            monkeypatch.delenv(env)
        else:
            pytest.fail(f".env.example shows a default for {env}, which is no setting")


def compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) or a v2 `docker-compose` binary; it needs no daemon."""
    candidates = [["docker", "compose"], ["docker-compose"]]
    for cli in candidates:
        if shutil.which(cli[0]) is None:
            continue
        done = subprocess.run([*cli, "version"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and re.search(r"v?2\.\d+", done.stdout):
            return cli
    return None


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_docker_compose_accepts_the_file(path: Path) -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Docker Compose v2 CLI installed (docker compose / docker-compose)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONTHEJOB_", "COMPOSE_"))}
    args = [*cli, "--project-directory", str(ROOT), "-f", str(path)]
    args += ["--env-file", str(ENV_EXAMPLE), "config", "-q"]
    # The example leaves the password empty on purpose: compose must refuse to start...
    refused = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    assert refused.returncode != 0
    assert "POSTGRES_PASSWORD" in refused.stderr
    # ...and accept the file once it is set.
    env["POSTGRES_PASSWORD"] = "example-password"
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
