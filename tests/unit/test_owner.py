"""Owner tokens: 128 random bits from secrets, readable metadata, and parsing any stored value."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
import uuid
from base64 import urlsafe_b64encode

import pytest

from tasklock.core.owner import Holder, new_token, parse_value

TOKEN = re.compile(r"^(?P<random>[0-9a-f]{32}) (?P<meta>\{.*\})$")


def test_token_is_128_random_bits_and_readable_metadata() -> None:
    before = time.time()
    token = new_token()
    match = TOKEN.match(token)
    assert match, token
    meta = json.loads(match["meta"])
    assert meta["host"] == socket.gethostname()
    assert meta["pid"] == os.getpid()
    assert before - 0.01 <= meta["at"] <= time.time() + 0.01


def test_random_part_comes_from_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def token_hex(nbytes: int) -> str:
        asked.append(nbytes)
        return "ab" * nbytes

    monkeypatch.setattr(secrets, "token_hex", token_hex)
    assert new_token().startswith("ab" * 16 + " ")
    assert asked == [16], "16 bytes = 128 bits"


def test_tokens_are_unique() -> None:
    randoms = {new_token().split(" ", 1)[0] for _ in range(20_000)}
    assert len(randoms) == 20_000


def test_extra_metadata_is_added() -> None:
    token = new_token({"task": "3b7f", "attempt": 2, "when": object})
    meta = json.loads(token.split(" ", 1)[1])
    assert meta["task"] == "3b7f"
    assert meta["attempt"] == 2
    assert meta["when"] == str(object)  # not JSON: shown as text, never an error at acquire
    assert meta["pid"] == os.getpid()


def test_parse_our_value_with_fence() -> None:
    token = new_token({"task": "a#b"})  # a '#' inside the metadata does not confuse the fence
    holder = parse_value(f"{token}#42".encode())
    assert holder.fence == 42
    assert holder.token == token.split(" ", 1)[0]
    assert holder.meta["task"] == "a#b"
    assert holder.meta["pid"] == os.getpid()
    assert f"pid={os.getpid()}" in holder.describe()
    assert holder.describe().endswith("fence=42")


def test_parse_value_without_fence() -> None:
    token = new_token({"task": "x#12"})
    holder = parse_value(token)
    assert holder.fence is None
    assert holder.meta["task"] == "x#12"


@pytest.mark.parametrize(
    "value",
    [
        uuid.uuid1().hex.encode(),  # redis-py's Lock
        urlsafe_b64encode(os.urandom(18)),  # python-redis-lock
        str(uuid.uuid4()).encode(),  # pottery
        b"1",  # hand-written
    ],
)
def test_values_from_other_libraries_parse_as_a_bare_token(value: bytes) -> None:
    holder = parse_value(value)
    assert holder == Holder(value=value.decode(), token=value.decode(), fence=None, meta={})
    assert holder.describe() == value.decode()


@pytest.mark.parametrize(
    ("value", "token", "fence", "meta"),
    [
        (b"abc#7", "abc", 7, {}),
        (b"abc#x7", "abc#x7", None, {}),
        (b"abc#", "abc#", None, {}),
        (b"abc#-1", "abc#-1", None, {}),
        (b"abc not-json#3", "abc", 3, {}),
        (b'abc ["a", 1]#3', "abc", 3, {}),
        (b"\xff\xfe#5", "\ufffd\ufffd", 5, {}),
    ],
)
def test_odd_values_never_raise(
    value: bytes, token: str, fence: int | None, meta: dict[str, object]
) -> None:
    holder = parse_value(value)
    assert (holder.token, holder.fence, holder.meta) == (token, fence, meta)


def test_forked_child_reports_its_own_pid() -> None:
    parent_token = new_token()  # warms the per-process cache
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write_end, new_token().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        child_token = pipe.read().decode()
    os.waitpid(pid, 0)
    assert json.loads(parent_token.split(" ", 1)[1])["pid"] == os.getpid()
    assert json.loads(child_token.split(" ", 1)[1])["pid"] == pid


@pytest.mark.parametrize(
    "value",
    [
        b"token {}#\xc2\xb2",  # a superscript two: isdigit() but not int()
        b"token {}#" + b"9" * 5000,  # int() refuses over 4,300 digits
        b"token " + b"[" * 100_000 + b"#5",  # nested deeper than json recurses
    ],
)
def test_a_corrupt_value_reads_without_raising(value: bytes) -> None:
    holder = parse_value(value)
    assert holder.token == "token"
