"""Operator tooling behind the ``tasklock`` command: inspecting, releasing and checking locks.

Kept apart from :mod:`tasklock.cli` (which only parses arguments and prints) so the logic can be
used and tested without a command line: :mod:`tasklock.ops.inspect` reads lock keys,
:mod:`tasklock.ops.permits` reads and releases a Semaphore's permits,
:mod:`tasklock.ops.doctor` judges a server's settings, :mod:`tasklock.ops.render` turns both into
text.
"""
