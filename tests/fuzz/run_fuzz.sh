#!/usr/bin/env bash
# Builds fuzz_attention with clang++ (a nested CMake project, harness/) and runs it over the
# committed seed corpus plus a bounded number of mutations. Called by the CTest test in
# tests/fuzz/CMakeLists.txt; exits 77 (the test's SKIP_RETURN_CODE) when clang++ or its
# libFuzzer runtime is missing. A shell script rather than a `cmake -P` one because CMake
# 3.25 scripts cannot choose their exit code.
#
#   run_fuzz.sh --clang=<clang++ or empty> --cmake=<cmake> --source=<attnkit source tree>
#               --work=<dir> [--generator=<gen>] [--make-program=<path>] [--arch=<flags>]
#               [--prefix-path=<a|b>] [--runs=<n>] [--seconds=<s>]
#
# The build in <work>/build is kept between runs (Ninja rebuilds what changed); the corpus
# the fuzzer grows and any crash input go to <work>/corpus and <work>/artifacts.
set -euo pipefail

clang="" cmake="" source="" work="" generator="" make_program="" arch="" prefix_path=""
runs=1500 seconds=10
# shellcheck source=../support/script_args.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/script_args.sh"
parse_args run_fuzz.sh clang cmake source work generator make_program arch prefix_path runs \
  seconds -- "$@"
require_args run_fuzz.sh cmake source work
prefix_path=${prefix_path//|/;}

# CTest reports exit code 77 as "Skipped", with this message in the test output. Where the
# fuzz test must run (CI: .ci/run sets ATTNKIT_FUZZ_REQUIRED=1), a missing clang++ or
# libFuzzer runtime is a failure instead.
skip() {
  if [ -n "${ATTNKIT_FUZZ_REQUIRED:-}" ] && [ "${ATTNKIT_FUZZ_REQUIRED}" != 0 ]; then
    echo "fuzz: FAILED: $1, and ATTNKIT_FUZZ_REQUIRED is set; scripts/install-deps.sh installs it"
    exit 1
  fi
  echo "fuzz: SKIPPED: $1; scripts/install-deps.sh installs it"
  exit 77
}
if [ -z "$clang" ] || [ ! -x "$clang" ]; then
  skip "no clang++ found (libFuzzer needs clang)"
fi
mkdir -p "$work"

# libFuzzer and the sanitizer runtimes ship apart from clang itself on Debian and Ubuntu
# (libclang-rt-<version>-dev), so a clang++ that compiles may still not link a fuzzer.
probe="$work/probe.cpp"
cat >"$probe" <<'EOF'
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }
EOF
if ! "$clang" -fsanitize=fuzzer,address,undefined "$probe" -o "$work/probe" 2>"$work/probe.log"; then
  cat "$work/probe.log"
  skip "$clang cannot link a libFuzzer target: its runtime (libclang-rt-<N>-dev) is missing"
fi

build="$work/build"
configure=("$cmake" -S "$source/tests/fuzz/harness" -B "$build"
           "-DCMAKE_CXX_COMPILER=$clang" -DCMAKE_BUILD_TYPE=
           "-DATTNKIT_SOURCE_DIR=$source" "-DATTNKIT_ARCH_FLAGS=$arch"
           "-DCMAKE_PREFIX_PATH=$prefix_path" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
[ -n "$generator" ] && configure+=(-G "$generator")
[ -n "$make_program" ] && configure+=("-DCMAKE_MAKE_PROGRAM=$make_program")
echo "fuzz: configuring and building fuzz_attention with $clang in $build"
"${configure[@]}" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
"$cmake" --build "$build"

# A fresh output corpus each time (the committed seeds are only read), a fixed seed so a
# failure reproduces, and limits so a slow or greedy input fails instead of hanging.
rm -rf "$work/corpus" "$work/artifacts"
mkdir -p "$work/corpus" "$work/artifacts"
echo "fuzz: running the seed corpus, then up to $runs inputs or $seconds s"
if ! "$build/fuzz_attention" -seed=1 -runs="$runs" -max_total_time="$seconds" -max_len=64 \
     -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
     -artifact_prefix="$work/artifacts/" "$work/corpus" "$source/tests/fuzz/corpus"; then
  echo "fuzz: FAILED; the input is in $work/artifacts/. Replay it with"
  echo "  $build/fuzz_attention <input>"
  echo "(for source lines in the report: $cmake -DATTNKIT_FUZZ_LINES=ON $build, rebuild)"
  echo "and once it is fixed keep it as tests/fuzz/corpus/regression-<what-it-found>."
  exit 1
fi
