"""The fake vLLM (tests/support/fake_vllm.py) with the endpoints the learner's publishers
call, for learner tests without an engine: LoRA adapters loaded and unloaded at runtime by
name (listed with the directory they came from), a full reload (pause, reload_weights,
reset_prefix_cache, resume), the weight version's label, and the verification probe
answered with PROBE_LOGPROB for every token; no exact weight check (a vLLM started without
the extension). It holds no model: a test that publishes
through it sets the learner's tolerance wide enough for any probe to pass (what a real
engine verifies is tests/e2e's).
"""

from __future__ import annotations

from typing import Any

import orjson

from tests.support.fake_vllm import FakeVLLM, Reply, Whole

PROBE_LOGPROB = -1.0


class FakeReplica(FakeVLLM):
    """`paths`: each loaded adapter's directory; `loads`: every adapter name loaded, in
    order; `reloads`: every full checkpoint reloaded; `version`: the label it serves."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: dict[str, str] = {}
        self.loads: list[str] = []
        self.reloads: list[str] = []

    def _route(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> Reply:
        body: Any = orjson.loads(raw) if raw else {}
        if method == "POST" and path == "/v1/load_lora_adapter":
            self.paths[body["lora_name"]] = body["lora_path"]
            self.loads.append(body["lora_name"])
            if body["lora_name"] not in self.adapters:
                self.adapters.append(body["lora_name"])
            return Whole({})
        if method == "POST" and path == "/v1/unload_lora_adapter":
            if body["lora_name"] not in self.adapters:
                return Whole({"error": {"message": "No adapter found"}}, 404)
            self.adapters.remove(body["lora_name"])
            self.paths.pop(body["lora_name"], None)
            return Whole({})
        if method == "POST" and path == "/v1/completions" and "prompt_logprobs" in body:
            return Whole(probe_answer(body))
        if method == "POST" and path == "/update_weight_version":
            self.version = body["new_version"]
            return Whole({})
        if method == "POST" and path == "/collective_rpc":
            if body["method"] != "reload_weights":  # a vLLM without the weight check's extension
                return Whole({"error": {"message": f"no method {body['method']}"}}, 400)
            self.reloads.append(body["kwargs"]["weights_path"])
            return Whole({"results": [None]})
        if method == "POST" and path == "/reset_prefix_cache":
            return Whole({"success": True})
        if method == "POST" and path in ("/pause", "/resume", "/abort_requests"):
            return Whole({})
        return super()._route(method, path, headers, raw)

    def _models(self) -> dict[str, Any]:
        models = super()._models()
        for model in models["data"]:
            if model["id"] in self.paths:
                model["root"] = self.paths[model["id"]]
        return models


def probe_answer(body: dict[str, Any]) -> dict[str, Any]:
    """A text completion with `prompt_logprobs` for the probe's tokens (none for the first)."""
    tokens = list(body["prompt"])
    entries: list[Any] = [None]
    entries += [{str(t): {"logprob": PROBE_LOGPROB, "rank": 1}} for t in tokens[1:]]
    choice = {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": entries}
    return {"id": "cmpl-probe", "object": "text_completion", "choices": [choice]}
