"""From a task call to a lock key: bind, canonicalise, hash.

The producer (``delay`` / ``enqueue``) and the worker must compute the same key for the same call,
although they see the arguments in different shapes: ``f(1)``, ``f(a=1)`` and ``f(1, b=<default>)``
are one call, and a tuple arrives at a Celery worker as a list after the JSON round trip. So:

1. the arguments are bound to the function's signature and defaults are applied;
2. the bound arguments (or the ``key`` subset, or what the ``key`` callable returns) are encoded as
   canonical JSON: sorted keys, no spaces, tuples and lists alike, sets sorted, dict keys as text;
   datetimes, dates, times, UUIDs, Decimals and bytes are tagged so they cannot collide with text;
3. the digest is the first 128 bits of its SHA-256, in hex.

An argument that cannot be encoded is an error at the call that names it and its type - never a
``repr`` with a memory address that would make every call unique and the lock useless.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import inspect
import json
import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tasklock.errors import ConfigurationError, KeyEncodingError

__all__ = ["CallKey", "canonical_json"]


class _Unencodable(Exception):
    def __init__(self, path: str, value: Any) -> None:
        super().__init__(path)
        self.path = path
        self.value = value


def _plain(value: Any, path: str) -> Any:
    """``value`` as JSON-native data, the same for every shape a serializer may deliver."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Unencodable(path, value)
        return value
    if isinstance(value, list | tuple):
        return [_plain(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if (not isinstance(k, str | int | float | bool) and k is not None) or _non_finite(k):
                raise _Unencodable(f"a dict key in {path}", k)
            out[k if isinstance(k, str) else json.dumps(k)] = _plain(v, f"{path}[{k!r}]")
        return out
    if isinstance(value, set | frozenset):
        items = [_plain(item, f"{path}{{...}}") for item in value]
        return {"__set__": sorted(items, key=lambda x: json.dumps(x, sort_keys=True))}
    if isinstance(value, dt.datetime):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, dt.date):
        return {"__date__": value.isoformat()}
    if isinstance(value, dt.time):
        return {"__time__": value.isoformat()}
    if isinstance(value, uuid.UUID):
        return {"__uuid__": str(value)}
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise _Unencodable(path, value)
        return {"__decimal__": str(value.normalize())}
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    raise _Unencodable(path, value)


#: Canonical JSON text of JSON-native data: sorted keys, no spaces. (One encoder for every call:
#: ``json.dumps`` with options builds a new one each time, which cost as much as the encoding.)
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode

#: Types whose values are their own canonical form (a float must be checked for NaN first; a
#: bool subclass of int is fine as it is: ``type`` is exact, so subclasses take ``_plain``).
_AS_IS = frozenset({str, int, bool, type(None)})


def _non_finite(value: Any) -> bool:
    """NaN or an infinity (float or Decimal): canonical JSON has no such numbers, and NaN is not
    even equal to itself, so no two calls would agree on it."""
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, decimal.Decimal) and not value.is_finite()


def _describe(exc: _Unencodable) -> str:
    if _non_finite(exc.value):
        return (
            f"{exc.path} is {exc.value} (a {type(exc.value).__name__}): NaN and infinity cannot "
            "be part of a call key (canonical JSON has no NaN or infinity); pass None or a finite "
            "number"
        )
    return f"{exc.path} has type {type(exc.value).__name__}, which cannot be part of a lock key"


def canonical_json(value: Any, path: str = "value") -> str:
    """Canonical JSON for ``value``; raises KeyEncodingError naming ``path`` if it cannot."""
    try:
        return _canonical(_plain(value, path))
    except _Unencodable as exc:
        raise KeyEncodingError(_describe(exc)) from None


def _callable_signature(func: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the signature of {func!r}: {exc}") from exc


class CallKey:
    """Derives the canonical form and digest of calls to one task function.

    ``key``: None (every argument), a list of argument names, or a callable that receives the call's
    arguments exactly as passed and returns what identifies the call. ``exclude``: argument names
    that never take part (the fencing keyword, for instance). ``option``: the option ``key`` came
    from (``key``, or ``rate_key`` for the rate limit's key), named in errors.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        task_name: str,
        key: Any = None,
        exclude: Iterable[str] = (),
        option: str = "key",
    ) -> None:
        self.task_name = task_name
        self.signature = _callable_signature(func)
        self.exclude = frozenset(exclude)
        self.key = key
        params = self.signature.parameters
        if key is not None and not callable(key):
            names = list(key)
            accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
            for name in names:
                if name not in params and not accepts_any:
                    raise ConfigurationError(
                        f"{option} names argument {name!r}, but {task_name} takes "
                        f"({', '.join(params) or 'no arguments'})"
                    )
                if name in self.exclude:
                    raise ConfigurationError(
                        f"{option} names argument {name!r}, which is the fencing keyword of "
                        f"{task_name}; it cannot be part of the key"
                    )
            self.key = tuple(names)
        # The common shape, bound without inspect (its bind costs more than the rest of the
        # key): every parameter positional-or-keyword. Anything else (and every call that does
        # not fit, to get inspect's own error) takes Signature.bind.
        self._names: tuple[str, ...] | None = None
        if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params.values()):
            self._names = tuple(params)
        self._defaults = {n: p.default for n, p in params.items() if p.default is not p.empty}

    def _error(self, detail: str) -> KeyEncodingError:
        return KeyEncodingError(
            f"cannot build the lock key of {self.task_name}: {detail}. Pass plain data "
            "(ids, strings, numbers) or choose the key with key=[...] or key=callable"
        )

    def canonical(self, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
        args = tuple(args)
        kwargs = dict(kwargs)
        if callable(self.key):
            try:
                return canonical_json(self.key(*args, **kwargs), "the value returned by key()")
            except KeyEncodingError as exc:
                raise self._error(str(exc)) from None
        for name in self.exclude:
            kwargs.pop(name, None)
        arguments = self.bound(args, kwargs)
        if self.key is not None:
            arguments = {name: arguments.get(name) for name in self.key}
        try:
            parts = {
                name: value if type(value) in _AS_IS else _plain(value, f"argument {name!r}")
                for name, value in arguments.items()
            }
        except _Unencodable as exc:
            raise self._error(_describe(exc)) from None
        return _canonical(parts)

    def bound(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied, excluded names left out
        (``kwargs`` without them already)."""
        names = self._names
        if names is not None and len(args) <= len(names):
            arguments = dict(zip(names, args, strict=False))
            for name, value in kwargs.items():
                if name in arguments or name not in self.signature.parameters:
                    return self._bound_by_inspect(args, kwargs)  # for inspect's own error
                arguments[name] = value
            for name in names[len(args) :]:
                if name not in arguments:
                    if name not in self._defaults:
                        return self._bound_by_inspect(args, kwargs)  # a missing argument
                    arguments[name] = self._defaults[name]
            if self.exclude:
                for name in self.exclude:
                    arguments.pop(name, None)
            return arguments
        return self._bound_by_inspect(args, kwargs)

    def _bound_by_inspect(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(
                f"arguments do not match {self.task_name}{self.signature}: {exc}"
            ) from None
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items() if k not in self.exclude}
        for param in self.signature.parameters.values():
            if param.kind is param.VAR_KEYWORD and param.name in arguments:
                # The fencing keyword may land in **kwargs when the function takes no such name.
                extra = arguments[param.name]
                arguments[param.name] = {k: v for k, v in extra.items() if k not in self.exclude}
        return arguments

    def digest(self, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
        """The first 128 bits of SHA-256 of the canonical call, in hex."""
        return hashlib.sha256(self.canonical(args, kwargs).encode()).hexdigest()[:32]
