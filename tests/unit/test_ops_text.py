"""Keys and lock values as the ``tasklock`` command prints them, for any bytes a server can hold.

A key is any bytes; a lock value is whatever someone wrote (tasklock, another client, an operator
with ``redis-cli``). Property tests over arbitrary bytes and JSON: every key prints as one line of
printable text that reads back as the same bytes, and every value that passes for a lock renders
as one line per lock in ``ls``, printable lines in ``show``, a one-line holder, and JSON, without
an exception. The real-server round trips (ls -> show -> release) are in
``tests/integration/test_cli.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasklock.ops.inspect import (
    LockInfo,
    key_bytes,
    key_from_text,
    key_text,
    parse_lock_value,
    printable,
)
from tasklock.ops.render import (
    holder_line,
    lock_details,
    lock_table,
    permit_list,
    semaphore_details,
)

TOKEN = "0123456789abcdef0123456789abcdef"
NOW = 1_800_000_000.0

#: Keys: arbitrary bytes, and text of every kind (lone surrogates included) as UTF-8 would carry it.
KEYS = st.binary(max_size=48) | st.text(max_size=24).map(
    lambda text: text.encode("utf-8", "surrogatepass")
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities too: Python's json reads and writes them
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
META_KEYS = st.sampled_from(["host", "pid", "at", "task", "name"]) | st.text(max_size=6)


@given(KEYS)
@example(b"bin-\xff-key")
@example(b"line\nbreak")
@example(b" padded ")
@example(b"back\\slash\\x41")
@example("nbsp\u00a0nel\u0085sep\u2028".encode())
def test_every_key_prints_on_one_line_and_reads_back_as_its_bytes(key: bytes) -> None:
    text = key_text(key)
    assert text.isprintable()  # no newline, no control character, no lone surrogate
    assert not text.startswith(" ")
    assert not text.endswith(" ")
    assert key_bytes(key_from_text(text)) == key
    assert key_text(key.decode("utf-8", "surrogateescape")) == text  # bytes or str, one form


@given(st.text(max_size=32))
@example("trailing\\")
@example("\\xZZ")
@example("\\ud800")
@example("\ud800")
def test_any_typed_key_is_a_key_or_a_value_error(text: str) -> None:
    try:
        key = key_from_text(text)
    except ValueError as exc:
        refused = str(exc)
    else:
        key_bytes(key)  # never a UnicodeEncodeError when it is sent
        return
    assert "as `tasklock ls` prints" in refused


def test_printable_text_is_left_as_it_is() -> None:
    for key in ("tasklock:{billing.settle}:lock:3f2a", "invoice 42", "ключ", "a/b:c{d}"):
        assert key_text(key) == key
        assert key_from_text(key) == key
    assert printable("C:\\temp\n") == "C:\\temp\\n"  # read-only text keeps its backslashes


def _value(meta: dict[str, Any], fence: bytes | None) -> bytes:
    """A lock value as tasklock writes it (``None``: no fence yet, as between Redlock's rounds)."""
    value = f"{TOKEN} {json.dumps(meta)}".encode()
    return value if fence is None else value + b"#" + fence


def _check_renders(info: LockInfo) -> None:
    table = lock_table([info], now=NOW)
    assert len(table.splitlines()) == 2
    assert all(line.isprintable() for line in table.splitlines())
    counters = {"{k}:fence": None, "k:fence": 3}
    labels = {"{k}:fence": "default", "k:fence": "task layer"}
    details = lock_details(info, counters, labels, now=NOW)
    assert all(line.isprintable() for line in details.splitlines())
    line = holder_line(info)
    assert line.isprintable()
    json.dumps(info.to_json())
    # The same value as one of a Semaphore's permits: a row beside a lock, and show's list.
    permit = dataclasses.replace(info, permits=2)
    table = lock_table([info, permit], now=NOW)
    assert len(table.splitlines()) == 3
    assert all(line.isprintable() for line in table.splitlines())
    assert table.splitlines()[0].split()[-1] == "KIND"
    details = semaphore_details(info.key, [permit, permit], counters, labels, now=NOW)
    assert all(line.isprintable() for line in details.splitlines())
    assert len(details.splitlines()) == 2 + len(counters) + 2 + 2
    assert permit_list([permit] * 12).isprintable()
    assert json.loads(json.dumps(permit.to_json()))["kind"] == "permit"
    at = info.acquired_at
    assert at is None or (math.isfinite(at) and at >= 0)


@settings(max_examples=300)
@given(
    key=KEYS,
    meta=st.dictionaries(META_KEYS, JSON_VALUES, max_size=6),
    fence=st.none()
    | st.from_regex(rb"[0-9]{1,20}", fullmatch=True)
    | st.sampled_from(["²".encode(), "١٢".encode(), b"9" * 5000]),
    ttl_ms=st.none() | st.integers(min_value=0, max_value=2**63),
)
def test_any_lock_value_renders_without_an_exception(
    key: bytes, meta: dict[str, Any], fence: bytes | None, ttl_ms: int | None
) -> None:
    meta.setdefault("host", "h")
    meta.setdefault("pid", 1)
    raw = _value(meta, fence)
    holder = parse_lock_value(raw)
    if fence is None or (fence.isdigit() and len(fence) <= 20):
        assert holder is not None  # every such value is a lock: the test renders them all
    if holder is not None:
        _check_renders(LockInfo(key.decode("utf-8", "surrogateescape"), raw, holder, ttl_ms))


@given(st.binary(max_size=200))
@example(b"#\xc2\xb2")
@example(f'{TOKEN} {{"host":"h","pid":1}}#'.encode() + "²".encode())
@example(f'{TOKEN} {{"host":"h","pid":1}}#'.encode() + b"9" * 5000)
def test_any_bytes_are_a_lock_or_not_never_an_exception(raw: bytes) -> None:
    holder = parse_lock_value(raw)
    if holder is not None:
        _check_renders(LockInfo("k", raw, holder, None))


@pytest.mark.parametrize("depth", [10, 100_000])
def test_metadata_nested_too_deep_to_read_is_not_a_lock(depth: int) -> None:
    meta = '{"host":"h","pid":1,"x":' + "[" * depth + "]" * depth + "}"
    holder = parse_lock_value(f"{TOKEN} {meta}#3".encode())
    assert (holder is not None) == (depth == 10)


@pytest.mark.parametrize(
    ("at", "shown"),
    [(1e300, None), (-1.0, None), (1e20, None), (1_700_000_000.5, 1_700_000_000.5), (0, 0.0)],
)
def test_an_acquisition_time_no_clock_gives_is_unknown(at: float, shown: float | None) -> None:
    raw = _value({"host": "h", "pid": 1, "at": at}, b"3")
    holder = parse_lock_value(raw)
    assert holder is not None
    info = LockInfo("k", raw, holder, 1000)
    assert info.acquired_at == shown
    _check_renders(info)
