#!/usr/bin/env python3
"""One report from attnkit's benchmark JSON: a Markdown table of every variant against its
in-run baseline, grouped by family, and plots (matplotlib, if importable).

Usage:
  bench_report.py PATH... [--out DIR]         report on the JSON files (a directory: its *.json)
  bench_report.py A B [--out DIR]             A and B two directories, or two files of the same
                                              bench: B against A, like Google Benchmark's
                                              compare.py (two machines, two commits)
  bench_report.py --compare A B [--out DIR]   the same, explicitly (A, B files or directories)

Example:
  cmake --workflow --preset bench        # ends with this script on build/bench/*.json
  cp -r build/bench/*.json /tmp/before   # ... change code, run again, then:
  scripts/bench_report.py /tmp/before build/bench

The JSON is Google Benchmark's (--benchmark_out_format=json). What the benches add for the
report (bench/bench_support.hpp, report_context / report_baseline) is in the context:
attnkit_family, attnkit_heads, attnkit_len, attnkit_isa, attnkit_cpu and
"attnkit_baseline:<variant>" = <baseline variant>; a "live" counter on sparse rows. A row's
time is the best repetition's real time (the machines are shared: the best is the least
disturbed). Python 3 standard library only, plus matplotlib for the plots.
"""

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

FAMILY_ORDER = ["dense", "masks", "routed", "normalizers", "positions", "linear", "gated", "decode", "backward"]
TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
# Keys of a benchmark entry that are not counters.
RUN_KEYS = {
    "name", "family_index", "per_family_instance_index", "run_name", "run_type",
    "repetitions", "repetition_index", "threads", "iterations", "real_time", "cpu_time",
    "time_unit", "label", "error_occurred", "error_message", "aggregate_name",
    "aggregate_unit",
}
LIBRARY_SUFFIXES = {"real_time", "manual_time", "process_time"}
LIBRARY_PARAMS = {"min_time", "min_warmup_time", "iterations", "repeats"}
PLOT_HINT = ("plots: matplotlib is not importable by {python}; install it with "
             "`sudo apt-get install python3-matplotlib` (scripts/install-deps.sh does) and run "
             "this script with the system python3 (/usr/bin/python3)")


class Row:
    """One benchmark (all repetitions of one name in one file): best time and its counters."""

    def __init__(self, family, name, seconds, counters, bench):
        # The library's own suffixes ("/real_time", "/min_time:0.3", ...) say how, not what.
        parts = [p for p in name.split("/") if p not in LIBRARY_SUFFIXES
                 and p.partition(":")[0] not in LIBRARY_PARAMS]
        name = "/".join(parts)
        self.family, self.name, self.seconds, self.counters = family, name, seconds, counters
        self.bench = bench  # the JSON file's stem, e.g. bench_masks
        self.variant = parts[0]
        self.params = {}
        for p in parts[1:]:
            key, sep, value = p.partition(":")
            self.params[key if sep else p] = value if sep else ""
        self.baseline = None  # the Row it is compared with, set by link_baselines()

    def param_int(self, key):
        value = self.params.get(key)
        return int(value) if value and value.isdigit() else None


class BenchFile:
    """One Google Benchmark JSON file."""

    def __init__(self, path):
        self.path = Path(path)
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        self.context = data.get("context", {})
        exe = Path(self.context.get("executable", self.path.stem)).name
        self.stem = exe if exe.startswith("bench_") else self.path.stem
        default_family = self.stem[len("bench_"):] if self.stem.startswith("bench_") else self.stem
        self.family = self.context.get("attnkit_family", default_family)
        self.heads = int(self.context.get("attnkit_heads", "1"))
        self.len = int(self.context["attnkit_len"]) if "attnkit_len" in self.context else None
        self.baselines = {k.split(":", 1)[1]: v for k, v in self.context.items()
                          if k.startswith("attnkit_baseline:")}
        best = {}
        for run in data.get("benchmarks", []):
            if run.get("run_type", "iteration") != "iteration" or run.get("error_occurred"):
                continue
            name = run.get("run_name", run["name"])
            seconds = run["real_time"] * TO_SECONDS.get(run.get("time_unit", "ns"), 1e-9)
            if name not in best or seconds < best[name][0]:
                counters = {k: v for k, v in run.items()
                            if k not in RUN_KEYS and isinstance(v, (int, float))}
                best[name] = (seconds, counters)
        self.rows = [Row(self.family, n, s, c, self.stem) for n, (s, c) in best.items()]
        by_name = {r.name: r for r in self.rows}
        for r in self.rows:
            base = self.baselines.get(r.variant)
            if base is not None:
                r.baseline = by_name.get(base + r.name[len(r.variant):])

    def length(self, row):
        return row.param_int("L") or self.len


def json_files(path):
    p = Path(path)
    if p.is_dir():
        return sorted(q for q in p.glob("*.json"))
    return [p]


def load(paths):
    files = []
    for path in paths:
        for f in json_files(path):
            try:
                files.append(BenchFile(f))
            except (OSError, ValueError, KeyError) as e:
                print(f"bench_report: skipping {f}: {e}", file=sys.stderr)
    return files


def family_key(family):
    return (FAMILY_ORDER.index(family) if family in FAMILY_ORDER else len(FAMILY_ORDER), family)


def fmt(x, digits=3):
    """A number with `digits` significant digits, no exponent for the usual range."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{decimals}f}"


def table(files):
    """The report's Markdown table: one row per benchmark, families in FAMILY_ORDER."""
    lines = [
        "| family | benchmark | ms | GFLOP/s | GB/s | live | baseline | time / baseline |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    rows = [r for f in files for r in f.rows]
    rows.sort(key=lambda r: family_key(r.family))  # stable: each file keeps its run order
    last = None
    for r in rows:
        gflops = r.counters.get("GFLOP/s")
        gbs = r.counters.get("bytes/s")
        ratio = r.seconds / r.baseline.seconds if r.baseline else None
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r.family if r.family != last else "", r.name.replace("|", "\\|"),
            fmt(r.seconds * 1e3), fmt(gflops), fmt(gbs / 1e9 if gbs else None),
            fmt(r.counters.get("live")),
            r.baseline.variant.replace("|", "\\|") if r.baseline else "-", fmt(ratio)))
        last = r.family
    return "\n".join(lines) + "\n"


def describe(files):
    """Machine and ISA, from the first file's context: for the header and the plot titles."""
    c = files[0].context if files else {}
    cpu = c.get("attnkit_cpu") or c.get("host_name", "unknown machine")
    isa = c.get("attnkit_isa", "ISA unknown")
    return f"{cpu}, {c.get('num_cpus', '?')} CPUs, ISA {isa}", c.get("date", "")


def compare_table(a_files, b_files):
    """B against A, matched by (family, benchmark name)."""
    a = {(r.family, r.name): r for f in a_files for r in f.rows}
    b = {(r.family, r.name): r for f in b_files for r in f.rows}
    keys = sorted(set(a) & set(b), key=lambda k: (family_key(k[0]), k[1]))
    lines = ["| family | benchmark | A ms | B ms | B / A time | change |",
             "|---|---|---:|---:|---:|---:|"]
    for fam, name in keys:
        ra, rb = a[(fam, name)], b[(fam, name)]
        r = rb.seconds / ra.seconds
        lines.append(f"| {fam} | {name.replace('|', chr(92) + '|')} | {fmt(ra.seconds * 1e3)} | "
                     f"{fmt(rb.seconds * 1e3)} | {fmt(r)} | {100 * (r - 1):+.1f}% |")
    only = len(set(a) ^ set(b))
    note = f"\n{only} benchmark(s) in only one of the two sets, not shown.\n" if only else ""
    return "\n".join(lines) + "\n" + note


# ---- plots ------------------------------------------------------------------------------

def plot_rows_by_length(files):
    """Series for time vs L: {label: [(L, ms per head), ...]}, the largest thread count, d 128
    (else the largest d) where the bench varies d, causal only; sparse rows (a "live" counter) as single points."""
    threads = max((r.param_int("threads") or 1 for f in files for r in f.rows), default=1)
    dims = {r.param_int("d") for f in files for r in f.rows} - {None}
    dim = 128 if 128 in dims or not dims else max(dims)
    series = {}
    for f in files:
        for r in f.rows:
            length = f.length(r)
            if length is None or (r.param_int("threads") or 1) != threads:
                continue
            if r.param_int("d") not in (None, dim) or r.params.get("causal") == "0":
                continue
            if r.variant in ("tile_peak", "roofline", "unfused") or "peak" in r.variant:
                continue
            sparse = "live" in r.counters and r.counters["live"] < 0.999
            if f.family in ("masks", "routed") and not sparse and r.variant != "dense_causal":
                continue  # selection / routing rows, full attention
            if f.family in ("normalizers", "positions"):
                continue  # one length: they have their own plot
            if f.family == "dense" and r.variant != "attnkit":
                continue
            kind = "sparse" if sparse else ("linear" if "linear" in r.variant else "dense")
            label = f"{r.variant} ({r.bench}, H={f.heads})"
            series.setdefault((kind, label), []).append((length, r.seconds * 1e3 / f.heads))
    return threads, dim, {k: sorted(v) for k, v in series.items()}


def make_plots(files, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(PLOT_HINT.format(python=sys.executable))
        return []
    plt.rcParams.update({"svg.hashsalt": "attnkit", "figure.dpi": 110, "font.size": 9})
    machine, date = describe(files)
    written = []

    def save(fig, stem):
        fig.tight_layout()
        for ext in ("svg", "png"):
            path = out / f"{stem}.{ext}"
            fig.savefig(path, metadata={"Date": None} if ext == "svg" else None)
            written.append(path)
        plt.close(fig)

    # 1. Time per head vs L, log-log: dense O(L^2), linear O(L), sparse variants as points.
    threads, dim, series = plot_rows_by_length(files)
    if series:
        fig, ax = plt.subplots(figsize=(8, 5))
        style = {"dense": dict(ls="-", marker="o"), "linear": dict(ls="--", marker="s"),
                 "sparse": dict(ls=":", marker="D", ms=7)}
        for (kind, label), points in sorted(series.items()):
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=f"{kind}: {label}", **style[kind])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L (tokens)")
        ax.set_ylabel("time per head (ms, best repetition)")
        ax.set_title(f"Attention time vs sequence length, causal, d={dim} (masks, routed: "
                     f"d=128), {threads} thread(s)\n"
                     f"{machine}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
        save(fig, "time_vs_length")

    # 2. Speedup over dense causal per sparse variant.
    sparse = [r for f in files for r in f.rows
              if r.baseline and "live" in r.counters and r.counters["live"] < 0.999]
    if sparse:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        labels = [f"{r.variant}\n{r.bench[6:] if r.bench.startswith('bench_') else r.bench}, "
                  f"{r.param_int('threads') or 1}T, live {r.counters['live']:.3f}" for r in sparse]
        speedups = [r.baseline.seconds / r.seconds for r in sparse]
        ax.bar(range(len(sparse)), speedups, color="tab:green")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(sparse)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("speedup over its dense baseline (baseline time / time, x)")
        ax.set_title(f"Sparse variants vs dense causal (full for a full-attention mask), same "
                     f"inputs, same run\n{machine}", fontsize=9)
        for i, s in enumerate(speedups):
            ax.annotate(f"{s:.1f}x", (i, s), ha="center", va="bottom", fontsize=7)
        save(fig, "speedup_vs_dense")

    # 3. GFLOP/s per normalizer and per position encoding (causal), per thread count.
    groups = [(fam, [r for f in files if f.family == fam for r in f.rows
                     if "GFLOP/s" in r.counters and r.params.get("causal", "") == ""
                     and "causal" in r.params])
              for fam in ("normalizers", "positions")]
    groups = [(fam, rows) for fam, rows in groups if rows]
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4.5), squeeze=False)
        for ax, (fam, rows) in zip(axes[0], groups):
            variants = list(dict.fromkeys(r.variant for r in rows))
            thread_counts = sorted({r.param_int("threads") or 1 for r in rows})
            width = 0.8 / len(thread_counts)
            for j, t in enumerate(thread_counts):
                by_variant = {r.variant: r.counters["GFLOP/s"] for r in rows
                              if (r.param_int("threads") or 1) == t}
                ax.bar([i + j * width for i in range(len(variants))],
                       [by_variant.get(v, 0) for v in variants], width,
                       label=f"{t} thread(s)")
            ax.set_xticks([i + width * (len(thread_counts) - 1) / 2
                           for i in range(len(variants))], variants, rotation=30, ha="right")
            ax.set_ylabel("GFLOP/s (useful FLOPs, causal)")
            ax.set_title(fam, fontsize=9)
            ax.legend(fontsize=7)
        fig.suptitle(f"Normalizers and position encodings, causal\n{machine}", fontsize=9)
        save(fig, "gflops_normalizers_positions")
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="JSON files or directories of them")
    parser.add_argument("--out", help="directory for report.md and the plots "
                        "(default: bench_report/ in the current directory)")
    parser.add_argument("--compare", action="store_true",
                        help="exactly two paths: print B against A")
    parser.add_argument("--no-plots", action="store_true", help="the table only")
    args = parser.parse_args(argv)
    out = Path(args.out or "bench_report")
    out.mkdir(parents=True, exist_ok=True)

    compare = args.compare
    if not compare and len(args.paths) == 2:
        a, b = (Path(p) for p in args.paths)
        if a.is_dir() and b.is_dir():
            compare = True
        elif a.is_file() and b.is_file():  # the same bench twice: a comparison
            fa, fb = load([a]), load([b])
            names = lambda fs: {(r.family, r.name) for f in fs for r in f.rows}
            compare = bool(fa and fb and names(fa) & names(fb))
    if compare:
        if len(args.paths) != 2:
            parser.error("--compare takes exactly two paths")
        a_files, b_files = load([args.paths[0]]), load([args.paths[1]])
        if not a_files or not b_files:
            print("bench_report: no benchmark JSON in one of the two sets", file=sys.stderr)
            return 1
        text = (f"## attnkit benchmarks: B against A\n\nA: {args.paths[0]} ({describe(a_files)[0]})"
                f"\nB: {args.paths[1]} ({describe(b_files)[0]})\n\nB / A time < 1: B is "
                f"faster. Times are each set's best repetition.\n\n"
                + compare_table(a_files, b_files))
        (out / "compare.md").write_text(text, encoding="utf-8")
        print(text)
        print(f"written: {out / 'compare.md'}")
        return 0

    files = load(args.paths)
    if not any(f.rows for f in files):
        print("bench_report: no benchmark results in " + ", ".join(args.paths), file=sys.stderr)
        return 1
    machine, date = describe(files)
    text = (f"## attnkit benchmarks\n\n{machine}; {date}; files: "
            + ", ".join(f.path.name for f in files)
            + "\n\nms = best repetition's real time; GFLOP/s, GB/s = the bench's own counters "
            "(useful FLOPs; bytes of Q, K, V, O) for that repetition; live = (query, key) pairs "
            "computed / causal pairs; time / baseline = ms / ms of the in-run baseline row "
            "(same parameters, same run): < 1 is faster than the baseline.\n\n"
            + table(files))
    (out / "report.md").write_text(text, encoding="utf-8")
    print(text)
    written = [] if args.no_plots else make_plots(files, out)
    print("written: " + ", ".join(str(p) for p in [out / "report.md"] + written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
