#!/usr/bin/env python3
"""Greedy continuation of a prompt by the C++ runner: the prompt tokenized by the model's
own tokenizer (transformers, from the GGUF file), the ids handed to model_runner, which
prints the text.

Usage: generate.py [--model smollm2|gemma3] [--new 32] [--cache f32|bf16|q8_0]
                   [--runner build/models/examples/model/model_runner] "The capital of France is"
"""
import argparse
import pathlib
import subprocess
import sys

import common


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt")
    parser.add_argument("--model", default="smollm2", choices=common.MODELS)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--cache", default="f32", choices=["f32", "bf16", "q8_0"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runner", type=pathlib.Path,
                        default=common.ROOT / "build/models/examples/model/model_runner")
    args = parser.parse_args()
    if not args.runner.exists():
        sys.exit(f"{args.runner} is not built: cmake --workflow --preset models (or "
                 f"cmake --preset models && cmake --build --preset models)")
    ids = common.load_tokenizer(args.model)(args.prompt).input_ids
    return subprocess.run(
        [str(args.runner), "--model", str(common.gguf_path(args.model)), "--ids",
         " ".join(map(str, ids)), "--new", str(args.new), "--cache", args.cache, "--threads",
         str(args.threads)]).returncode


if __name__ == "__main__":
    sys.exit(main())
