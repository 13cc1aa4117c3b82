"""celery-once's key format, unchanged (``qo_<task name>_<arg>-<value>_...``), so that workers on
the original and on this module compute the same keys during a rolling deploy, and its backend
loader, which serves the original's backend paths with tasklock's backends.

The one change: :func:`call_arguments` first gives the arguments the shape a worker receives
after Celery's JSON round trip (tuples as lists, dict keys as text, ...). The original keyed
``f((1, 2))`` as ``"(1, 2)"`` at enqueue and ``"[1, 2]"`` in the worker, so the worker never
cleared the lock it was sent under; arguments that survive the round trip unchanged (numbers,
strings, lists, text-keyed dicts) keep exactly the original's key.
"""

from __future__ import annotations

import importlib
import operator
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from kombu.utils import json as kombu_json

from tasklock.errors import ConfigurationError

__all__ = [
    "BACKEND_ALIASES",
    "call_arguments",
    "force_string",
    "import_backend",
    "items_sorted_by_key",
    "kwargs_to_list",
    "order_dict_to_string",
    "queue_once_key",
]

_BACKENDS = "tasklock.compat.celery_once.backends"

#: The original's backend paths, served by this module's backends (never imported from it).
BACKEND_ALIASES = {
    "celery_once.backends.Redis": f"{_BACKENDS}.redis.Redis",
    "celery_once.backends.redis.Redis": f"{_BACKENDS}.redis.Redis",
    "celery_once.backends.File": f"{_BACKENDS}.file.File",
    "celery_once.backends.file.File": f"{_BACKENDS}.file.File",
    f"{_BACKENDS}.Redis": f"{_BACKENDS}.redis.Redis",
    f"{_BACKENDS}.File": f"{_BACKENDS}.file.File",
}


def import_backend(config: Mapping[str, Any]) -> Any:
    """The backend ``app.conf.ONCE`` names, made from its ``settings``.

    ``"backend"`` is a dotted path to a class taking the settings dict; the original's paths
    (``celery_once.backends.Redis``, ``...File``) are tasklock's. Anything missing or wrong is a
    ConfigurationError naming ``ONCE["backend"]`` and what to write instead.
    """
    if not isinstance(config, Mapping) or "backend" not in config:
        raise ConfigurationError(
            f"app.conf.ONCE must be a dict with 'backend' and 'settings', got {config!r}: set "
            "ONCE = {'backend': 'celery_once.backends.Redis', 'settings': {'url': "
            "'redis://host:6379/0'}}"
        )
    name = config["backend"]
    if not isinstance(name, str) or "." not in name:
        raise ConfigurationError(
            f"ONCE['backend'] must be a dotted path to a backend class, got {name!r} (e.g. "
            "'celery_once.backends.Redis')"
        )
    path = BACKEND_ALIASES.get(name, name)
    module_name, class_name = path.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
        backend_class = getattr(module, class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"ONCE['backend'] = {name!r} cannot be imported ({exc}): use "
            "'celery_once.backends.Redis' or 'celery_once.backends.File' (served by tasklock), "
            "or the path of your own backend class"
        ) from exc
    return backend_class(config.get("settings", {}))


def items_sorted_by_key(kwargs: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    return sorted(kwargs.items(), key=operator.itemgetter(0))


def order_dict_to_string(d: Mapping[Any, Any]) -> str:
    return "{" + ", ".join(str({x: y}).strip("{}") for x, y in d.items()) + "}"


def force_string(kwargs: Any) -> Any:
    """Nested dicts as sorted text and lists element by element, as the original keys them."""
    if isinstance(kwargs, dict):
        return order_dict_to_string(
            OrderedDict(
                (force_string(key), force_string(value))
                for key, value in items_sorted_by_key(kwargs)
            )
        )
    if isinstance(kwargs, list):
        return [force_string(element) for element in kwargs]
    return kwargs


def kwargs_to_list(kwargs: Mapping[str, Any]) -> list[str]:
    """``{'a': 1, 'b': 2}`` -> ``["a-1", "b-2"]``, sorted by name."""
    return [f"{k}-{force_string(v)}" for k, v in items_sorted_by_key(kwargs)]


def queue_once_key(
    name: str, kwargs: Mapping[str, Any], restrict_to: Iterable[str] | None = None
) -> str:
    """``qo_<name>_<arg>-<value>_...``: the task's name and its arguments (or only those named in
    ``restrict_to``, the task's ``once={"keys": [...]}``)."""
    keys = ["qo", force_string(name)]
    if restrict_to is not None:
        keys += kwargs_to_list({key: kwargs[key] for key in restrict_to})
    else:
        keys += kwargs_to_list(kwargs)
    return "_".join(keys)


def call_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` as the worker sees them after Celery's JSON serializer (kombu's, with its
    own types kept); what JSON cannot carry is left as it is (a pickle serializer delivers it
    unchanged)."""
    out: dict[str, Any] = {}
    for name, value in arguments.items():
        try:
            out[name] = kombu_json.loads(kombu_json.dumps(value))
        except (TypeError, ValueError):
            out[name] = value
    return out
