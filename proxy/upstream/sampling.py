"""The sampling parameters vLLM applied to a call: the request's, else the server's defaults.

vLLM fills each sampling parameter a request leaves out from its server defaults, and those
depend on how it was started: the model's `generation_config.json` under
`--generation-config auto` (vLLM's default), a folder's under `--generation-config DIR`, none
under `--generation-config vllm`, each with `--override-generation-config` on top. A proxy
cannot know that from the request, and usually cannot read the model directory (another
container). So it asks each replica: `POST /v1/chat/completions/render` (served with
`--enable-scale-out`) answers with the SamplingParams vLLM builds for a request that sets
nothing, which are exactly its defaults, whatever the mode; for a model without a chat
template, `POST /v1/completions/render` does. Without that endpoint,
`GET /server_info` (dev mode, which hot-swapping needs anyway) names the mode; under
`vllm` the defaults are the overrides alone, under any other mode they stay unknown.

Invariant: a call records effective sampling only when its replica's defaults are known;
otherwise it records none, and a learner must not guess (it skips such calls).
"""

from __future__ import annotations

from typing import Any, cast

import aiohttp
import orjson

from store.json_types import JsonObject
from store.trajectory_record import RecordedSampling

# vLLM's neutral values (ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS in vLLM 0.32): what
# applies when neither the request nor the server's defaults set a parameter
NEUTRAL: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
# vLLM samples greedily below this temperature, and then drops top-p, top-k and min-p
GREEDY_BELOW = 1e-5


def effective(body: JsonObject, defaults: JsonObject | None) -> RecordedSampling | None:
    """What vLLM applies to the upstream `body` given the replica's `defaults` (None when
    unknown), as vLLM merges them: the request's value, else the default, else neutral.

    `constraints` lists the request's other logits processing (logit bias, structured
    output, ...), which changes the distribution vLLM samples from beyond these parameters.
    """
    if defaults is None:
        return None
    out: JsonObject = {}
    for name, neutral in NEUTRAL.items():
        value = body.get(name)
        out[name] = value if value is not None else defaults.get(name, neutral)
    if isinstance(out["temperature"], int | float) and out["temperature"] < GREEDY_BELOW:
        out.update(top_p=1.0, top_k=0, min_p=0.0)  # SamplingParams does the same
    found = constraints(body)
    if found:
        out["constraints"] = found
    return cast(RecordedSampling, out)  # the parameters' values, as JSON gave them


def constraints(body: JsonObject) -> list[str]:
    """The request's processing, other than the sampling parameters, that shapes the
    logprobs vLLM reports (each masks or shifts logits before sampling)."""
    found = [
        name
        for name in (
            "logit_bias",
            "bad_words",
            "allowed_token_ids",
            "structured_outputs",
            "vllm_xargs",  # custom logits processors' arguments
            "thinking_token_budget",
        )
        if body.get(name)
    ]
    if isinstance(body.get("min_tokens"), int) and body["min_tokens"] > 0:
        found.append("min_tokens")  # stop tokens are masked until then
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        found.append("response_format")
    tool_choice = body.get("tool_choice")
    if tool_choice == "required" or isinstance(tool_choice, dict):
        found.append("tool_choice")  # vLLM constrains the reply to the tools' schema
    if body.get("use_beam_search"):
        found.append("use_beam_search")
    if body.get("watermarking"):
        found.append("watermarking")
    return found


async def learn_defaults(
    session: aiohttp.ClientSession, url: str, limit: aiohttp.ClientTimeout
) -> tuple[JsonObject | None, str]:
    """(the replica's sampling defaults or None, where they came from or why unknown)."""
    probe = {"messages": [{"role": "user", "content": "."}], "max_tokens": 1}
    async with session.post(url + "/v1/chat/completions/render", json=probe, timeout=limit) as r:
        rendered = orjson.loads(await r.read()) if r.status == 200 else None
    if rendered is None:
        # a model without a chat template (a base model) renders no chat: its completions'
        # render carries the same defaults, one request per prompt
        plain = {"prompt": ".", "max_tokens": 1}
        async with session.post(url + "/v1/completions/render", json=plain, timeout=limit) as r:
            listed = orjson.loads(await r.read()) if r.status == 200 else None
        rendered = listed[0] if isinstance(listed, list) and listed else None
    params = rendered.get("sampling_params") if isinstance(rendered, dict) else None
    if isinstance(params, dict):
        return {name: params.get(name, neutral) for name, neutral in NEUTRAL.items()}, "render"
    async with session.get(
        url + "/server_info", params={"config_format": "json"}, timeout=limit
    ) as r:
        info = orjson.loads(await r.read()) if r.status == 200 else None
    model = _model_config(info)
    if model is None:
        return None, "vLLM offers neither /v1/chat/completions/render nor /server_info"
    mode = model.get("generation_config")
    if mode != "vllm":
        return None, f"--generation-config {mode}: the defaults need /render (--enable-scale-out)"
    overrides = model.get("override_generation_config") or {}
    defaults = {name: overrides.get(name, neutral) for name, neutral in NEUTRAL.items()}
    return defaults, "server_info"


def _model_config(info: Any) -> JsonObject | None:
    config = info.get("vllm_config") if isinstance(info, dict) else None
    model = config.get("model_config") if isinstance(config, dict) else None
    return model if isinstance(model, dict) else None
