"""RQ adapter tests: in-process SimpleWorker (fast), `rq worker` subprocesses (the rest)."""
