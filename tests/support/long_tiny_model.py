"""The tiny random model made fit for a real agent CLI: a long context, and short turns.

Claude Code and Codex CLI send prompts of 25-32k tokens (in the tiny model's 512-token
vocabulary) and expect each reply to end by itself: a reply cut off at an output limit makes
Claude Code retry with a larger limit and then fail. The tiny model has 2,048 positions and,
being random, ends a turn about once in 500 tokens. This copy has 65,536 positions (RoPE
needs no new weights) and ends a turn after a few tokens:

- every token's embedding gets a constant 10 in dimension 0, and nothing the layers compute
  is written back into that dimension (row 0 of each attention and MLP output projection is
  zero), so the final hidden state's dimension 0 is the same, large, at every position;
- the output head is untied from the embeddings: no token reads dimension 0 except the
  end-of-turn token, whose logit it raises by END_LOGIT, so a turn ends with probability
  about e^5 / (e^5 + 513) ~ 0.22 at each step (a reply of about 4 tokens, never 48).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

END_LOGIT = 5.0
CONSTANT = 10.0
POSITIONS = 65536


def build_long_tiny_model(tiny: Path, out: Path) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for item in tiny.iterdir():
        if item.is_file() and item.name not in ("config.json", "model.safetensors"):
            shutil.copy2(item, out / item.name)
    config = json.loads((tiny / "config.json").read_text())
    end = int(config["eos_token_id"])
    config.update(max_position_embeddings=POSITIONS, tie_word_embeddings=False)
    tensors = load_file(str(tiny / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"].clone()
    embed[:, 0] = CONSTANT
    head = tensors["lm_head.weight"].clone()
    head[:, 0] = 0.0
    # after the final RMSNorm, the constant dimension is about sqrt(width) at every position
    head[end, 0] = END_LOGIT / math.sqrt(embed.shape[1])
    tensors["model.embed_tokens.weight"] = embed
    tensors["lm_head.weight"] = head
    for name, tensor in tensors.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            tensor = tensor.clone()
            tensor[0, :] = 0.0
            tensors[name] = tensor
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    assert torch.isfinite(head).all()
    return out
