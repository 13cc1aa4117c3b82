"""RQ: the dependents of a job that met its twin wait for the twin too.

RQ releases a job's dependents (``depends_on=``) when it ends, and a duplicate ends at once while
its twin still does the work. :func:`follow_twin` makes each dependent depend on the twin as well,
in one script (``RQ_ATTACH_DEPENDENTS`` in :mod:`tasklock.core.scripts`), so RQ holds it until
both have ended, whatever the order in which they end.
"""

from __future__ import annotations

import logging
import re

from rq.job import Job, JobStatus

from tasklock.core.scripts import RQ_ATTACH_DEPENDENTS

__all__ = ["follow_twin"]

log = logging.getLogger("tasklock.rq")

#: The job id in a holder's description (``Holder.describe()``: ``k=v`` pairs; the guard puts the
#: job id under ``task``). RQ job ids are letters, digits, ``_`` and ``-``.
_HOLDER_TASK = re.compile(r"(?:^|\s)task=([\w-]+)(?=\s|$)")


def follow_twin(
    name: str, job: Job, dependents: list[str], holder: str | None
) -> tuple[str | None, str | None]:
    """Make ``dependents`` of duplicate ``job`` (of the singleton job ``name``) depend on the twin
    as well.

    Returns (the twin's job id, None), or (None, why they cannot follow it). The twin is the job
    the lock's holder names; one that has ended since is fine (RQ counts it as ended).
    """
    match = _HOLDER_TASK.search(holder or "")
    if match is not None:
        twin = match.group(1)
        job_class = type(job)
        keys = [job_class.key_for(twin), job_class.dependents_key_for(twin)]
        for dependent in dependents:
            keys.append(job_class.key_for(dependent))
            keys.append(job_class(dependent, connection=job.connection).dependencies_key)
        attached = RQ_ATTACH_DEPENDENTS.ordinary(
            job.connection, keys, [twin, JobStatus.FINISHED.value, *dependents]
        )
        if attached >= 0:
            log.info(
                "%s: job %s met its twin, job %s; its dependents %s wait for the twin too",
                name,
                job.id,
                twin,
                dependents,
            )
            return twin, None
    problem = (
        f"this job has dependents ({', '.join(dependents)}) that cannot be ordered after the "
        f"twin's work: the holder is no RQ job in this job's Redis (holder: {holder}). The job "
        "fails instead of finishing so that RQ keeps them deferred (those that allow failures "
        "run now); requeue it from the FailedJobRegistry to run the work"
    )
    log.warning("%s: job %s: %s", name, job.id, problem)
    return None, problem
