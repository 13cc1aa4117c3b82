"""``manage.py tasklock_prune_fences --older-than SECONDS [--database ALIAS]``

Deletes the rows of the fence table (``tasklock_fence``) not written for ``--older-than``
seconds, and prints how many it deleted. Run it from cron or a periodic task if the table grows
with resources that are never written again; nothing else needs it (a row is a few dozen bytes).

The rule: a row may go only when no holder of an older token can still be running. Such a holder
took its lock before the row's last write, and runs at most the longest task time limit, plus the
lock TTL before anyone else could take the lock. Delete the row sooner and that late holder's
write finds no row and is accepted: the fence it was meant to stop is gone. So ``--older-than``
must be at least your longest task time limit plus the TTL; it is required (no default could
know your time limits) and refused below :data:`MIN_OLDER_THAN` (an hour) and below
``TASKLOCK["TTL"]``.
"""

from __future__ import annotations

import math
from argparse import ArgumentTypeError
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError, transaction
from django.utils import timezone

from tasklock.django.fencing import connection_for, missing_table
from tasklock.django.settings import inspect_setting
from tasklock.errors import ConfigurationError
from tasklock.fencing import rules

__all__ = ["MIN_OLDER_THAN", "Command"]

#: The smallest --older-than accepted, in seconds: an hour.
MIN_OLDER_THAN = 3600


def floor_seconds() -> float:
    """The smallest --older-than allowed: an hour, or TASKLOCK["TTL"] when that is longer."""
    options, _ = inspect_setting()
    ttl = options.get("ttl")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and math.isfinite(ttl):
        return max(float(MIN_OLDER_THAN), float(ttl))
    return float(MIN_OLDER_THAN)


def seconds(text: str) -> float:
    """argparse type of --older-than: a finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"a number of seconds, not {text!r}") from None
    if not math.isfinite(value):
        raise ArgumentTypeError(f"a finite number of seconds, not {text!r}")
    return value


class Command(BaseCommand):
    help = (
        "Delete fence rows (tasklock_fence) not written for --older-than SECONDS and print how "
        "many. A row may go only when no holder of an older token can still be running: pass at "
        "least your longest task time limit plus the lock TTL (an hour at the least)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=seconds,
            required=True,
            metavar="SECONDS",
            help="delete rows last written more than this many seconds ago; at least the longest "
            f"task time limit plus the lock TTL, and at least {MIN_OLDER_THAN} (required)",
        )
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help=f"the database alias whose fence table to prune (default {DEFAULT_DB_ALIAS!r})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        older_than: float = options["older_than"]
        using: str = options["database"]
        floor = floor_seconds()
        if older_than < floor:
            raise CommandError(
                f"--older-than {older_than:g} is below the floor of {floor:g} seconds. A fence "
                "row may be deleted only when no holder of an older token can still be running, "
                "that is when it was last written longer ago than your longest task time limit "
                "plus the lock TTL; a row deleted sooner lets such a late holder's write through. "
                f"Pass at least that much, and at least {floor:g}"
            )
        try:
            connection = connection_for(using)
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        before = connection.ops.adapt_datetimefield_value(
            timezone.now() - timedelta(seconds=older_than)
        )
        sql = rules.prune_sql(connection.ops.quote_name(rules.DEFAULT_TABLE))
        try:
            with transaction.atomic(using=using), connection.cursor() as cursor:
                cursor.execute(*rules.render(sql, {"before": before}, "format"))
                deleted = cursor.rowcount
        except DatabaseError as exc:
            problem = missing_table(exc, using)
            if problem is not None:
                raise CommandError(str(problem)) from exc
            raise
        self.stdout.write(
            f"Deleted {deleted} fence row{'' if deleted == 1 else 's'} not written for "
            f"{older_than:g} seconds from database {using!r}."
        )
