"""`onthejob serve`: the recording proxy."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from proxy.commands import add_db, proxy_settings


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
    serve.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="vLLM OpenAI server base URL; repeat for replicas (default: $ONTHEJOB_UPSTREAMS, "
        "comma-separated, else http://127.0.0.1:8000)",
    )
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8080)")
    serve.add_argument(
        "--require-keys",
        action="store_true",
        default=None,
        help="require a client key on every call on loopback too (e.g. behind a reverse "
        "proxy on this host); off loopback they are always required. Keys: POST "
        "/admin/api/keys (needs ONTHEJOB_ADMIN_TOKEN)",
    )
    add_db(serve)
    serve.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help="a trajectory with no call for this long is finished (default 300)",
    )
    serve.add_argument(
        "--spool",
        type=Path,
        metavar="FILE",
        help="base path of the call log FILE.d/ (every answered call, until it is in the "
        "database) and of FILE.rejected (rows the database refused); default "
        "onthejob-spool.jsonl",
    )
    serve.add_argument(
        "--log-fsync-interval",
        type=float,
        metavar="SECONDS",
        help="fsync the call log this often: what a crash of the whole machine can lose "
        "(default 0.1; a kill of the proxy loses nothing)",
    )
    serve.add_argument(
        "--migrate",
        action="store_true",
        default=None,
        help="upgrade the database schema at start; without it a schema that is behind "
        "(PostgreSQL or SQLite) stops the proxy with what to run (`onthejob db upgrade`). A "
        "new SQLite file gets its schema anyway, unless ONTHEJOB_AUTO_MIGRATE=false",
    )
    serve.add_argument(
        "--stream-tools-mode",
        choices=["auto", "stream", "buffer"],
        help="streaming requests with tools: stream them (stream), answer them from a whole "
        "upstream response re-emitted as a stream (buffer), or stream until an upstream is "
        "seen dropping tool-call token ids (auto, default)",
    )
    serve.add_argument(
        "--max-body-bytes", type=int, help="largest request body accepted (default 32 MiB)"
    )
    serve.add_argument(
        "--upstream-timeout", type=float, metavar="SECONDS", help="per upstream call (default 600)"
    )
    serve.add_argument(
        "--upstream-retry-after",
        type=float,
        metavar="SECONDS",
        help="a replica that failed is probed again after this long, doubling with each "
        "further failure up to 30 s (default 1)",
    )
    serve.add_argument(
        "--fanout",
        type=int,
        metavar="N",
        help="sample single-turn chat requests N times upstream, answer with the first and "
        "record all N as one GRPO group (default 1 = off)",
    )
    serve.add_argument(
        "--hosted-tools",
        choices=["omit", "refuse"],
        help="Messages/Responses tools the served model cannot be given (web search, file "
        "search, computer use, code interpreter, vendor-run MCP, ...): leave them out and "
        "record it (omit, default) or answer with a 400 (refuse)",
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.app import SchemaBehind, create_app, prepare_database

    settings = proxy_settings(
        args,
        upstreams=args.upstream,
        host=args.host,
        port=args.port,
        require_keys=args.require_keys,
        idle_timeout=args.idle_timeout,
        spool_path=args.spool,
        stream_tools_mode=args.stream_tools_mode,
        max_body_bytes=args.max_body_bytes,
        upstream_timeout=args.upstream_timeout,
        upstream_retry_after=args.upstream_retry_after,
        fanout=args.fanout,
        log_fsync_interval=args.log_fsync_interval,
        migrate=args.migrate,
        hosted_tools=args.hosted_tools,
    )
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
