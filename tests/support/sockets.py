"""What a stopped (SIGSTOPped) server has been sent but not read: the kernel keeps taking a
stopped process's TCP bytes into its socket's receive queue, so a test can see that a request
reached the server, without asking the server (which cannot answer) or guessing a time."""

from __future__ import annotations

from pathlib import Path

__all__ = ["unread_bytes"]


def unread_bytes(port: int) -> int:
    """Bytes waiting, unread, in the receive queues of the sockets listening or accepted on
    local ``port`` (IPv4 and IPv6), from ``/proc/net/tcp*`` (Linux)."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                total += int(fields[4].split(":")[1], 16)  # tx_queue:rx_queue
    return total
