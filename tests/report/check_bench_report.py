#!/usr/bin/env python3
"""Checks scripts/bench_report.py on the JSON fixture: the table has a row per family with
its baseline ratios, report.md is written, the comparison mode prints ratios, and -- where
matplotlib is importable -- every plot is written as non-empty SVG and PNG.

Usage: check_bench_report.py <bench_report.py> <fixture dir> <scratch out dir>
"""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

script, fixture, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(*args):
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    print(done.stdout)
    print(done.stderr, file=sys.stderr)
    check(done.returncode == 0, f"bench_report.py {' '.join(args)} exits 0")
    return done.stdout


shutil.rmtree(out, ignore_errors=True)
text = run(str(fixture), "--out", str(out / "report"))

# One row per family, with the numbers the table promises (ms, GFLOP/s, live, ratio).
def row(family, name):
    """The table line of benchmark `name`; the family cell is blank after a family's first row."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[1] == name.replace("|", "\\|"):
            return cells
    return None

expected = [  # family, benchmark, baseline shown, live shown
    ("dense", "attnkit/d:64/L:1024/causal:1/threads:2", "unfused", False),
    ("masks", "causal&window512/threads:2", "dense_causal", True),
    ("routed", "aha/L:16384/threads:2", "dense_causal", True),
    ("normalizers", "sigmoid/causal/threads:2", "softmax", False),
    ("positions", "alibi/causal/threads:2", "none", False),
    ("linear", "linear/d:64/L:1024/threads:2", "softmax", False),
]
for family, name, baseline, live in expected:
    cells = row(family, name)
    check(cells is not None, f"table has a row for {family}: {name}")
    if cells is None:
        continue
    check(re.fullmatch(r"[0-9.]+", cells[2]) is not None, f"{name}: ms is a number ({cells[2]})")
    check(cells[6] == baseline, f"{name}: baseline {baseline} ({cells[6]})")
    check(re.fullmatch(r"[0-9.]+", cells[7]) is not None, f"{name}: ratio is a number ({cells[7]})")
    check((cells[5] != "-") == live, f"{name}: live {'shown' if live else 'blank'} ({cells[5]})")
for family in ("dense", "masks", "routed", "normalizers", "positions", "linear"):
    check(re.search(rf"^\| {family} \|", text, re.M) is not None, f"family {family} heads a group")
report = out / "report" / "report.md"
check(report.is_file() and "| family | benchmark |" in report.read_text(), "report.md written")

# Two sets: the fixture against itself -- every ratio 1.
compare = run(str(fixture), str(fixture), "--out", str(out / "compare"))
check("| B / A time |" in compare, "comparison prints a B / A column")
check(re.search(r"\| 1\.00 \| \+0\.0% \|", compare) is not None, "same data compares as 1.00")

if importlib.util.find_spec("matplotlib") is None:
    print("SKIPPED the plot checks: matplotlib is not importable by " + sys.executable +
          " (sudo apt-get install python3-matplotlib, or scripts/install-deps.sh)")
else:
    for stem in ("time_vs_length", "speedup_vs_dense", "gflops_normalizers_positions"):
        for ext in ("svg", "png"):
            path = out / "report" / f"{stem}.{ext}"
            check(path.is_file() and path.stat().st_size > 1000, f"plot {path.name} non-empty")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("PASS")
