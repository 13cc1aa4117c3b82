"""Fencing for Django's ORM: the lock's token is checked in the database, in the writer's
transaction.

Two forms; both raise :class:`tasklock.StaleFence` when a newer token has written already::

    from django.db import transaction
    from tasklock.django.fencing import fence, fenced_update

    # A table of tokens per resource (the Fence model; `manage.py migrate` creates it):
    with transaction.atomic():
        fence(f"invoice:{invoice_id}", fence_token)     # StaleFence here rolls the block back
        Invoice.objects.filter(pk=invoice_id).update(status="paid")

    # Or a fence column on the protected row itself (a nullable BigIntegerField, "fence"):
    fenced_update(Invoice.objects.filter(pk=invoice_id), fence_token, status="paid")

:func:`fence` is one statement (from :mod:`tasklock.fencing.rules`, the same SQL as the SQLAlchemy
form) that raises the resource's stored token to ours unless it is already higher, and keeps the
row locked until the transaction ends: writers of one resource are serialised, and a stale one is
refused before its writes commit. It must run inside ``transaction.atomic()`` (or with autocommit
off): in autocommit it would fence nothing, so it refuses. PostgreSQL, SQLite 3.35+, MySQL and
MariaDB.

:func:`fenced_update` needs no table and no transaction: its ``UPDATE ... WHERE fence IS NULL OR
fence <= token`` is the check and the write at once, on any database.

A token equal to the stored one is the same hold writing again: accepted. ``None`` (a lock without
fencing) is a :class:`tasklock.ConfigurationError`, never a silent pass.

The table form needs ``"tasklock.django"`` in ``INSTALLED_APPS`` and its migration applied;
``manage.py tasklock_prune_fences --older-than SECONDS`` deletes old rows.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.core.exceptions import FieldDoesNotExist
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from django.utils.connection import ConnectionDoesNotExist

from tasklock.errors import ConfigurationError, StaleFence
from tasklock.fencing import rules

__all__ = ["StaleFence", "fence", "fenced_update"]

_M = TypeVar("_M", bound=models.Model)


def connection_for(using: str) -> BaseDatabaseWrapper:
    """``connections[using]``, or a ConfigurationError listing the aliases there are."""
    if not isinstance(using, str):
        raise ConfigurationError(f"using= must be a database alias (a str), got {using!r}")
    try:
        return connections[using]
    except ConnectionDoesNotExist:
        aliases = ", ".join(repr(alias) for alias in connections)
        raise ConfigurationError(
            f"no database {using!r} in settings.DATABASES (there is {aliases}): pass using= one of "
            "them"
        ) from None


def missing_table(exc: DatabaseError, using: str) -> ConfigurationError | None:
    """A ConfigurationError saying how to create the fence table, when ``exc`` is its absence."""
    text = str(exc).lower()
    if rules.DEFAULT_TABLE not in text or not any(
        word in text for word in ("no such table", "does not exist", "doesn't exist")
    ):
        return None
    return ConfigurationError(
        f"the fence table {rules.DEFAULT_TABLE!r} does not exist in database {using!r}: add "
        f"'tasklock.django' to INSTALLED_APPS and run `manage.py migrate tasklock --database "
        f"{using}` (or use fenced_update with a fence column on the row itself). ({exc})"
    )


def fence(resource: str, token: int, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Refuse this transaction's writes to ``resource`` if a newer token has written it.

    Call it inside ``transaction.atomic(using=using)``, before (or after) the writes it guards:
    it raises :class:`tasklock.StaleFence` (``resource``, ``token``, ``newer``) inside the block,
    so the block rolls back with everything it wrote. Otherwise the resource's row in the fence
    table holds ``token`` (or already held it: an equal token is accepted) and stays locked until
    the transaction ends, so a concurrent writer of the same resource waits for this one and is
    then compared with its token.

    ``resource`` names what is written (``"invoice:42"``, up to 255 characters); ``token`` is the
    hold's fence token (``lock.fence``, ``fence_token=`` in a task with ``fencing=True``).
    Raises :class:`tasklock.ConfigurationError` for a token that is None or not an int, a bad
    resource, an unknown ``using``, a database outside PostgreSQL/SQLite/MySQL/MariaDB, no open
    transaction, or a fence table that was never migrated.
    """
    resource = rules.check_resource(resource)
    token = rules.check_token(token, resource)
    connection = connection_for(using)
    # Django's vendor is the rules' dialect ("mysql" for MariaDB too); the rules refuse the rest.
    dialect = connection.vendor
    table = connection.ops.quote_name(rules.DEFAULT_TABLE)
    template = rules.fence_sql(dialect, table)
    if not connection.in_atomic_block and connection.get_autocommit():
        raise ConfigurationError(
            f"fence({resource!r}) must run inside a transaction on database {using!r}: wrap it "
            f"and the writes it guards in `with transaction.atomic(using={using!r}):`. In "
            "autocommit the check would commit on its own and fence nothing"
        )
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    fence_query = rules.render(
        template, {"resource": resource, "token": token, "now": now}, "format"
    )
    stored_query = rules.render(rules.stored_sql(table, dialect), {"resource": resource}, "format")
    try:
        with connection.cursor() as cursor:
            cursor.execute(*fence_query)
            # PostgreSQL/SQLite: a row back means accepted, none means refused. MySQL: accepted
            # when the token now stored (read back, locking) is ours.
            returning = dialect in rules.RETURNING_DIALECTS
            if returning and cursor.fetchone() is not None:
                return
            cursor.execute(*stored_query)
            row = cursor.fetchone()
    except DatabaseError as exc:
        problem = missing_table(exc, using)
        if problem is not None:
            raise problem from exc
        raise
    stored = None if row is None else int(row[0])
    if returning or stored != token:
        raise StaleFence(resource, token, stored)


def _fence_field(model: type[models.Model], field: str) -> models.Field[Any, Any]:
    if not isinstance(field, str) or not field:
        raise ConfigurationError(f"field= must name the fence column's field, got {field!r}")
    try:
        found = model._meta.get_field(field)
    except FieldDoesNotExist:
        integer_fields = [
            f.name for f in model._meta.concrete_fields if isinstance(f, models.IntegerField)
        ]
        raise ConfigurationError(
            f"{model._meta.label} has no field {field!r} for the fence token: add "
            f"`{field} = models.BigIntegerField(null=True)` to the model (and a migration), or "
            f"pass field= one of its integer fields ({', '.join(integer_fields) or 'none'})"
        ) from None
    if not isinstance(found, models.IntegerField) or not found.concrete:
        raise ConfigurationError(
            f"{model._meta.label}.{field} holds the fence token, so it must be a "
            f"BigIntegerField (null=True for rows not fenced yet), not {type(found).__name__}"
        )
    return found


def fenced_update(
    queryset: models.QuerySet[_M], token: int, *, field: str = "fence", **values: Any
) -> int:
    """``queryset.update(**values)`` only where the row's fence column allows ``token``.

    Updates the rows of ``queryset`` whose ``field`` (``"fence"`` by default: a nullable
    ``BigIntegerField`` on the model) is NULL or not above ``token``, setting ``field`` to
    ``token`` with ``values``, in one UPDATE: the check and the write cannot be separated, so no
    transaction is needed (inside one, a StaleFence rolls it back like any error). Returns the
    number of rows updated.

    When none was updated but a row of ``queryset`` holds a newer token, raises
    :class:`tasklock.StaleFence` (resource ``"<app_label.model>:<pk>"`` of that row, ``newer`` its
    token); when ``queryset`` matches no row, returns 0. Each row is fenced by itself: a queryset
    of several rows updates those that allow ``token`` and raises only when none did.
    """
    if isinstance(queryset, models.Manager):
        queryset = queryset.all()
    if not isinstance(queryset, models.QuerySet):
        raise ConfigurationError(
            "fenced_update takes a QuerySet (Model.objects.filter(pk=...)), got "
            f"{type(queryset).__name__}"
        )
    model = queryset.model
    name = _fence_field(model, field).name
    token = rules.check_token(token, f"{model._meta.label_lower}.{name}")
    if name in values:
        raise ConfigurationError(
            f"fenced_update sets {model._meta.label}.{name} to the token itself: do not pass "
            f"{name}= among the values"
        )
    allowed = models.Q(**{f"{name}__isnull": True}) | models.Q(**{f"{name}__lte": token})
    filtered = queryset.filter(allowed)
    updated = filtered.update(**{name: token}, **values)
    if updated:
        return updated
    # update() marked `filtered` for writing: its .db is the database written (not a replica).
    newer_rows = queryset.using(filtered.db).filter(**{f"{name}__gt": token})
    if not transaction.get_autocommit(using=filtered.db):
        # A locking read sees the latest committed fence: a plain one in a REPEATABLE READ
        # transaction (MySQL's default) that read earlier would see its old snapshot, and
        # report a refused token as "no matching row".
        newer_rows = newer_rows.select_for_update()
    newest = newer_rows.order_by(f"-{name}").values_list("pk", name).first()
    if newest is None:
        return 0  # nothing matched: not fenced, just absent
    pk, newer = newest
    raise StaleFence(f"{model._meta.label_lower}:{pk}", token, int(newer))
