"""celery-singleton's key: ``<prefix><md5 of name + JSON args + JSON kwargs>``, unchanged, so
that workers on the original and on this module exclude each other during a deploy."""

from __future__ import annotations

import json
from hashlib import md5
from typing import Any

__all__ = ["generate_lock"]


def generate_lock(
    task_name: str,
    task_args: Any = None,
    task_kwargs: Any = None,
    key_prefix: str = "SINGLETONLOCK_",
    json_encoder_class: type[json.JSONEncoder] | None = None,
) -> str:
    str_args = json.dumps(task_args or [], sort_keys=True, cls=json_encoder_class)
    str_kwargs = json.dumps(task_kwargs or {}, sort_keys=True, cls=json_encoder_class)
    task_hash = md5((task_name + str_args + str_kwargs).encode()).hexdigest()  # a name only
    return key_prefix + task_hash
