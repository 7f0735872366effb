"""The locally built test/demo model: deterministic, cached, chat template with tools."""

from __future__ import annotations

from pathlib import Path

from learner.tiny_model import build_tiny_model


def test_same_seed_same_files_and_cached(tiny_model: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    names = sorted(p.name for p in tiny_model.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (tiny_model / name).read_bytes() == (again / name).read_bytes(), name
    before = (again / "model.safetensors").stat().st_mtime_ns
    build_tiny_model(again, seed=0)  # complete: reused, not rebuilt
    assert (again / "model.safetensors").stat().st_mtime_ns == before


def test_chat_template_renders_tools_and_tool_calls(tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    messages = [
        {"role": "user", "content": "add 1 and 2"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "x",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "x", "content": "3"},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert '"name": "add"' in text and "<tool_call>" in text and "3" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer("<tool_call>")["input_ids"]
    assert len(ids) == 1  # one token, so the hermes parser can find it
