"""``python -m tasklock.demo.rq_worker ARGS``: ``rq worker ARGS`` with the demo's jobs preloaded.

RQ forks a work horse for every job. A worker that has not imported the job's module makes every
horse import it again (a few hundred milliseconds each); importing it once here, before the worker
starts, lets each horse inherit it. RQ's docs recommend the same ("Performance notes").
"""

from __future__ import annotations

import sys

from rq.cli.cli import main

from tasklock.demo import rq_jobs  # noqa: F401  (preloaded for the work horses)

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
