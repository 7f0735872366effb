"""Which database a rollout records to: the proxy's own, learned from the proxy.

The runner finds a run's calls by its session key in the database the proxy records to, so
the two must be one store. The proxy says which (`GET /healthz`: its store's id and URL,
password hidden): without --db the runner uses that URL; with --db it checks that the
database given is that store, and refuses to start if not.
"""

from __future__ import annotations

import httpx
from sqlalchemy.exc import SQLAlchemyError

from store import db
from store.identity import read_store_id

HIDDEN = "***"


class StoreMismatch(ValueError):
    """The runner could not be sure to read the store the proxy writes."""


def resolve(proxy_url: str, given: str | None) -> str:
    """The database URL the runner uses (`given`: --db or ONTHEJOB_DATABASE_URL, if any)."""
    store = _proxy_store(proxy_url)
    if given is None:
        url = store.get("url")
        if not url:
            raise StoreMismatch(
                f"the proxy at {proxy_url} does not say which database it records to: "
                "pass --db (the proxy's --db)"
            )
        if HIDDEN in url:
            raise StoreMismatch(
                f"the proxy records to {url}: pass that URL with its password as --db "
                "(or ONTHEJOB_DATABASE_URL)"
            )
        given = url
    expected = store.get("id")
    if expected is None:
        return given  # the proxy cannot read its store right now: nothing to compare with
    found = _store_id(given)
    if found != expected:
        where = store.get("url") or "its database"
        raise StoreMismatch(
            f"the proxy at {proxy_url} records to {where}, not to "
            f"{db.normalise_url(given).split('@')[-1]} (store {found or 'none'} is not "
            f"{expected}): the runner would not find any run's calls; pass the proxy's "
            "database as --db, or leave --db out to use it"
        )
    return given


def _proxy_store(proxy_url: str) -> dict:  # type: ignore[type-arg]
    try:
        response = httpx.get(proxy_url.rstrip("/") + "/healthz", timeout=10)
        response.raise_for_status()
        store = response.json().get("store")
    except (httpx.HTTPError, ValueError) as exc:
        raise StoreMismatch(f"cannot reach the proxy at {proxy_url}: {exc}") from exc
    return store if isinstance(store, dict) else {}


def _store_id(url: str) -> str | None:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return read_store_id(conn)
    except SQLAlchemyError:
        return None  # no onthejob store there (or not reachable): not the proxy's
    finally:
        engine.dispose()
