"""`onthejob serve`: the recording proxy."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from cli.flags import add_flags, given
from proxy.settings import Settings


def register(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the OpenAI-compatible recording proxy",
        description="Run the proxy. Point a harness's base URL at http://HOST:PORT/v1 "
        "(or http://HOST:PORT/s/SESSION/v1 to group its calls under a session key). Bound "
        "off loopback, every call needs a client key (Authorization: Bearer KEY or "
        "x-api-key: KEY), made with POST /admin/api/keys; until one exists every call is "
        "refused with 401.",
    )
    # every setting but the secrets, generated from proxy/settings.py
    add_flags(serve, Settings)
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.app import create_app, prepare_database
    from store.schema import SchemaBehind

    settings = proxy_settings(args)
    try:
        settings.check_exposure()
        reachable = prepare_database(settings)
        app = create_app(settings, database_checked=reachable)
    except (ValueError, SchemaBehind) as exc:
        raise SystemExit(f"onthejob serve: {exc}") from None
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        # nothing here reads the client's address or scheme: uvicorn's X-Forwarded-* layer
        # would only cost every call a middleware pass
        proxy_headers=False,
        log_level=args.log_level,
        timeout_graceful_shutdown=30,
    )
    return 0


def proxy_settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the flags given (None = not given):
    `serve`'s flags are the settings' own, other commands take only `--db`."""
    values = given(args, Settings)
    if getattr(args, "db", None):
        values["database_url"] = args.db
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise SystemExit(f"onthejob {args.command}: {problems}") from None
