#!/usr/bin/env python3
"""Speed of the C++ runner on the two checkpoints: prefill and decode tokens/s at prompt
lengths 128, 512 and 2048, on 1 and 2 threads, with an f32, bf16 and q8_0 KV cache, and the
share of the time spent inside attnkit (KV cache append, RoPE of the queries, attention).

The runner's --bench mode prints one row per length; this script runs it for every model,
cache and thread count and prints one table (Markdown), with the CPU's name.

Usage: figures.py --runner build/models/examples/model/model_runner [--lengths 128,512,2048]
"""
import argparse
import pathlib
import platform
import subprocess
import sys

import common


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runner", required=True, type=pathlib.Path)
    parser.add_argument("--models", nargs="+", default=list(common.MODELS))
    parser.add_argument("--caches", nargs="+", default=["f32", "bf16", "q8_0"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--lengths", default="128,512,2048")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}\n")
    print("| model | cache | threads | prompt | prefill tok/s | attnkit % | decode tok/s | "
          "attnkit % |\n|---|---|---|---|---|---|---|---|")
    for model in args.models:
        # Real text as the token source, repeated to the length: the LICENSE prompt's ids.
        ids = common.load_tokenizer(model)(common.prompts()[-1][1]).input_ids
        for cache in args.caches:
            for threads in args.threads:
                out = subprocess.run(
                    [str(args.runner), "--model", str(common.gguf_path(model)), "--ids",
                     " ".join(map(str, ids)), "--cache", cache, "--threads", str(threads),
                     "--bench", args.lengths], check=True, capture_output=True, text=True)
                for line in out.stdout.splitlines()[1:]:
                    cells = line.split()
                    print(f"| {model} | {cells[1]} | {cells[2]} | {cells[3]} | {cells[4]} | "
                          f"{cells[5]} | {cells[6]} | {cells[7]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
