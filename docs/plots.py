"""Draw the benchmark plots of docs/benchmarks.md from the benchmark scripts' ``--json`` output.

    python tests/benchmarks/bench_contention.py --seconds 2 --warmup 0.5 --json contention.json
    python tests/benchmarks/bench_lock.py --parts b --json lock.json
    python tests/benchmarks/bench_celery.py --n 300 --rounds 3 --json celery.json
    python tests/benchmarks/bench_rq.py --n 300 --fork-n 40 --rounds 3 --json rq.json
    python docs/plots.py --contention contention.json --lock lock.json \\
        --celery celery.json --rq rq.json

Each input defaults to the copy kept beside the plots (docs/_static/bench/*.json): the inputs of
the committed PNGs, so ``python docs/plots.py`` alone redraws them. Needs matplotlib (the docs
extra).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUT = Path(__file__).resolve().parent / "_static" / "bench"


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def contention(data: dict[str, Any], out: Path) -> None:
    fig, (through, commands) = plt.subplots(1, 2, figsize=(10, 4))
    for name, points in data["points"].items():
        waiters = sorted(points, key=int)
        x = [int(w) for w in waiters]
        one = points[waiters[0]]["acquisitions_per_s"]
        through.plot(x, [points[w]["acquisitions_per_s"] / one for w in waiters], "o-", label=name)
        commands.plot(x, [points[w]["commands_per_acquisition"] for w in waiters], "o-", label=name)
    for axes in (through, commands):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("waiters on one key")
        axes.grid(True, alpha=0.3)
    through.set_ylabel("acquisitions/s, x the 1-waiter point")
    through.set_ylim(0, 1.2)
    commands.set_yscale("log")
    commands.set_ylabel("Redis commands per acquisition")
    through.legend(fontsize=8)
    fig.suptitle(
        f"Contention: hold {data['hold_ms']:g} ms, {data['seconds']:g} s measured per point"
    )
    fig.tight_layout()
    fig.savefig(out / "contention.png", dpi=110)
    plt.close(fig)


def handoff(data: dict[str, Any], out: Path) -> None:
    fig, axes = plt.subplots(figsize=(8, 4))
    for name, stats in data["handoff_ms"].items():
        samples = sorted(stats["samples"])
        fractions = [(i + 1) / len(samples) for i in range(len(samples))]
        axes.step(samples, fractions, where="post", label=f"{name} (p50 {stats['p50']:.2f} ms)")
    axes.set_xscale("log")
    axes.set_xlabel("hand-off latency, ms (release in one process -> held in another)")
    axes.set_ylabel("fraction of hand-offs")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("Hand-off latency distribution")
    fig.tight_layout()
    fig.savefig(out / "handoff.png", dpi=110)
    plt.close(fig)


def overhead(celery: dict[str, Any], rq: dict[str, Any], out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), width_ratios=[7, 3])
    names = list(celery["variants"])
    rows = range(len(names))
    width = 0.4
    drain = [celery["variants"][n]["drain_x_plain"] for n in names]
    total = [celery["variants"][n]["end_to_end_x_plain"] for n in names]
    left.barh([i - width / 2 for i in rows], drain, width, label="drain (worker)")
    left.barh([i + width / 2 for i in rows], total, width, label="end to end")
    left.set_yticks(list(rows), names, fontsize=8)
    left.invert_yaxis()
    left.axvline(1.0, color="grey", lw=0.8)
    left.set_xlabel("throughput, x the plain task")
    left.set_title(f"Celery, solo worker ({celery['n']} calls x {celery['rounds']} rounds)")
    left.legend(fontsize=8)
    workers = {"simple": "SimpleWorker", "fork": "rq worker (fork)"}
    labels, values = [], []
    for key, label in workers.items():
        for name, row in rq["workers"][key]["variants"].items():
            if name != "plain job":
                labels.append(f"{label}: {name}")
                values.append(row["drain_x_plain"])
    right.barh(range(len(labels)), values, 0.6, color="tab:green")
    right.set_yticks(list(range(len(labels))), labels, fontsize=8)
    right.invert_yaxis()
    right.axvline(1.0, color="grey", lw=0.8)
    right.set_xlabel("drain, x the plain job")
    right.set_title(f"RQ ({rq['rounds']} rounds)")
    fig.tight_layout()
    fig.savefig(out / "overhead.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    for name in ("contention", "lock", "celery", "rq"):
        parser.add_argument(f"--{name}", type=Path, default=OUT / f"{name}.json")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in ("contention", "lock", "celery", "rq"):  # keep the inputs beside the plots
        source = getattr(args, name)
        if source.resolve() != (OUT / f"{name}.json").resolve():
            shutil.copyfile(source, OUT / f"{name}.json")
    contention(load(args.contention), OUT)
    handoff(load(args.lock), OUT)
    overhead(load(args.celery), load(args.rq), OUT)
    print(f"wrote {', '.join(p.name for p in sorted(OUT.glob('*.png')))} in {OUT}")


if __name__ == "__main__":
    main()
