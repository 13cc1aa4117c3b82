"""django-rq stacking scenario, run in its own interpreter: ``python -m
tests.integration.rq.django_scenario <redis url>`` prints one JSON object with what happened.

A separate process because Django settings are process-wide: configuring them here cannot leak
into (or clash with) the Django tests of the same pytest run.
"""

from __future__ import annotations

import json
import sys

import django
from django.conf import settings


def main(url: str) -> dict[str, object]:
    settings.configure(
        INSTALLED_APPS=["django_rq"],
        RQ_QUEUES={"default": {"URL": url}},
        USE_TZ=True,
    )
    django.setup()
    import django_rq

    from tests.integration.rq import django_jobs
    from tests.integration.rq.support import InProcessWorker

    queue = django_rq.get_queue("default")
    outside = django_jobs.dj_outside.delay("a")
    first = django_jobs.dj_inside.delay("b")
    twin = django_jobs.dj_inside.delay("b")
    InProcessWorker([queue], connection=queue.connection).work(burst=True)
    return {
        "outside": outside.return_value(),
        "outside_func": outside.func_name,
        "inside": first.return_value(),
        "inside_twin_same_job": twin.id == first.id,
        "ran_inside": [v.decode() for v in queue.connection.lrange("ran:dj_inside", 0, -1)],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
