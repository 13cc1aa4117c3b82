"""The rules every fencing helper shares, free of any database library: what a token and a
resource must be, and the SQL of the fence table per dialect (one copy, for SQLAlchemy and Django).

The fence table (``tasklock_fence`` by default)::

    resource    varchar(255) primary key   what is fenced ("invoice:42")
    token       bigint not null            the newest token that wrote it
    updated_at  timestamp not null         when (for pruning)

:func:`fence_sql` is one statement that advances ``token`` only when the new one is not lower
and takes the row's lock until commit, so concurrent writers of one resource are serialised:

* PostgreSQL and SQLite (3.35+): ``INSERT ... ON CONFLICT (resource) DO UPDATE SET ... WHERE
  token <= excluded.token RETURNING token``: a row back means accepted, none means stale;
* MySQL and MariaDB (no RETURNING for an upsert): ``INSERT ... ON DUPLICATE KEY UPDATE`` with
  ``IF(token <= VALUES(token), ...)`` (which locks the row even when it changes nothing), then
  the stored token is read back in the same transaction (:func:`stored_sql` with the dialect: a
  locking read, ``FOR UPDATE``, so that it sees the latest committed token and not the snapshot of
  a REPEATABLE READ transaction that read earlier): equal to ours means accepted.

Statements are templates with ``{resource}``, ``{token}``, ``{now}`` slots, rendered for the
driver's parameter style by :func:`render`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tasklock.errors import ConfigurationError

__all__ = [
    "DEFAULT_TABLE",
    "RETURNING_DIALECTS",
    "UPSERT_DIALECTS",
    "check_resource",
    "check_token",
    "fence_sql",
    "prune_sql",
    "render",
    "stored_sql",
]

#: The fence table's default name.
DEFAULT_TABLE = "tasklock_fence"
#: The longest resource name the table's primary key holds.
MAX_RESOURCE = 255
#: Dialects whose upsert returns the row it wrote (accepted) or none (stale).
RETURNING_DIALECTS = ("postgresql", "sqlite")
#: Dialects whose upsert is followed by a read of the stored token.
UPSERT_DIALECTS = ("mysql", "mariadb")

_SLOT = re.compile(r"\{(\w+)\}")


def check_token(token: Any, resource: str) -> int:
    """The token as an int, or a ConfigurationError: ``None`` (the lock had no fence) is never a
    silent pass."""
    if token is None:
        raise ConfigurationError(
            f"fence token for {resource!r} is None: the lock that guards this write had no fence "
            "token. Pass the hold's token (lock.fence, or fence_token= with fencing=True on the "
            "task); an unfenced write cannot be checked"
        )
    if isinstance(token, bool) or not isinstance(token, int):
        raise ConfigurationError(
            f"fence token for {resource!r} must be an int (lock.fence, fence_token=), got {token!r}"
        )
    if token < 0 or token >= 2**63:
        raise ConfigurationError(
            f"fence token for {resource!r} must fit a signed 64-bit column, got {token!r}"
        )
    return token


def check_resource(resource: Any) -> str:
    """The resource name, or a ConfigurationError naming what is wrong with it."""
    if not isinstance(resource, str) or not resource:
        raise ConfigurationError(
            f"resource must be a non-empty string naming what is fenced (e.g. 'invoice:42'), got "
            f"{resource!r}"
        )
    if len(resource) > MAX_RESOURCE:
        raise ConfigurationError(
            f"resource {resource[:40]!r}... is {len(resource)} characters; the fence table keeps "
            f"at most {MAX_RESOURCE}: use a shorter name (an id, or a hash of a long one)"
        )
    return resource


def _dialect(name: str) -> str:
    if name in RETURNING_DIALECTS or name in UPSERT_DIALECTS:
        return name
    raise ConfigurationError(
        f"fencing does not support the {name!r} database: PostgreSQL, SQLite (3.35+), MySQL and "
        "MariaDB are supported. Use a fence column on the row itself (fenced_update), which works "
        "on any database"
    )


def fence_sql(dialect: str, table: str) -> str:
    """The fence statement for ``dialect`` on ``table`` (already quoted)."""
    if _dialect(dialect) in RETURNING_DIALECTS:
        return (
            f"INSERT INTO {table} (resource, token, updated_at) VALUES ({{resource}}, {{token}}, "
            f"{{now}}) ON CONFLICT (resource) DO UPDATE SET token = excluded.token, "
            f"updated_at = excluded.updated_at WHERE {table}.token <= excluded.token "
            "RETURNING token"
        )
    # MySQL assigns left to right, and a later expression sees the new value: updated_at first.
    return (
        f"INSERT INTO {table} (resource, token, updated_at) VALUES ({{resource}}, {{token}}, "
        "{now}) ON DUPLICATE KEY UPDATE "
        "updated_at = IF(token <= VALUES(token), VALUES(updated_at), updated_at), "
        "token = IF(token <= VALUES(token), VALUES(token), token)"
    )


def stored_sql(table: str, dialect: str) -> str:
    """The token stored for a resource (after a refused or a MySQL upsert).

    For MySQL/MariaDB the read locks (``FOR UPDATE``; the upsert holds the
    row already), which reads the latest committed token. A plain read in a REPEATABLE READ
    transaction (MySQL's default) that read anything earlier sees its old snapshot, and would take
    a refused token for an accepted one.
    """
    lock = " FOR UPDATE" if dialect in UPSERT_DIALECTS else ""
    return f"SELECT token FROM {table} WHERE resource = {{resource}}{lock}"


def prune_sql(table: str) -> str:
    """Delete the rows not written since ``{before}``."""
    return f"DELETE FROM {table} WHERE updated_at < {{before}}"


def render(template: str, params: Mapping[str, Any], style: str) -> tuple[str, Any]:
    """``template`` for a driver: ``"named"`` (``:name``, SQLAlchemy's ``text()``) gives the
    params as a dict; ``"format"`` (``%s``, a DB-API cursor as Django's) as a list in order."""
    if style == "named":
        return _SLOT.sub(lambda m: f":{m.group(1)}", template), dict(params)
    order: list[str] = []

    def slot(match: re.Match[str]) -> str:
        order.append(match.group(1))
        return "%s"

    sql = _SLOT.sub(slot, template.replace("%", "%%"))
    values: Sequence[Any] = [params[name] for name in order]
    return sql, list(values)
