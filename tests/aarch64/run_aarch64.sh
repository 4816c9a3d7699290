#!/usr/bin/env bash
# Cross-builds attnkit's emulated SIMD path tests (ATTNKIT_EMULATED_TESTS) for
# aarch64 (a nested build of this source tree with cmake/toolchains/aarch64-linux-gnu.cmake)
# and runs them under qemu-aarch64 user emulation through CTest. Called by the CTest test in
# tests/aarch64/CMakeLists.txt; exits 77 (the test's SKIP_RETURN_CODE) when the cross
# compiler, qemu or the arm64 packages are missing (scripts/install-deps.sh installs
# them).
#
#   run_aarch64.sh --cmake=<cmake> --ctest=<ctest> --source=<attnkit source tree> --work=<dir>
#                  [--generator=<gen>] [--make-program=<path>] [--prefix=<arm64 packages>]
#                  [--opt=<flags>]
set -euo pipefail

cmake="" ctest="" source="" work="" generator="" make_program="" opt="-Og"
prefix=${ATTNKIT_AARCH64_PREFIX:-/opt/attnkit-aarch64}
# shellcheck source=../support/script_args.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/script_args.sh"
parse_args run_aarch64.sh cmake ctest source work generator make_program prefix opt -- "$@"
require_args run_aarch64.sh cmake ctest source work

skip() {
  echo "aarch64: SKIPPED: $1; scripts/install-deps.sh installs it"
  exit 77
}
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || skip "no aarch64-linux-gnu-g++"
command -v qemu-aarch64-static >/dev/null 2>&1 || command -v qemu-aarch64 >/dev/null 2>&1 ||
  skip "no qemu-aarch64 (qemu-user-static)"
[ -f "$prefix/usr/lib/cmake/Catch2/Catch2Config.cmake" ] ||
  skip "no arm64 Catch2 under $prefix"

mkdir -p "$work"
build="$work/build"
configure=("$cmake" -S "$source" -B "$build"
           "-DCMAKE_TOOLCHAIN_FILE=$source/cmake/toolchains/aarch64-linux-gnu.cmake"
           "-DATTNKIT_AARCH64_PREFIX=$prefix" -DCMAKE_BUILD_TYPE=Release
           "-DATTNKIT_TEST_OPT_FLAGS=$opt" "-DATTNKIT_EXAMPLE_OPT_FLAGS=$opt"
           -DATTNKIT_BUILD_TESTS=ON -DATTNKIT_BUILD_EXAMPLES=ON -DATTNKIT_BUILD_BENCHMARKS=OFF
           -DATTNKIT_INSTALL=OFF -DATTNKIT_MPI=OFF -DATTNKIT_TEST_PCH=OFF
           -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
[ -n "$generator" ] && configure+=(-G "$generator")
[ -n "$make_program" ] && configure+=("-DCMAKE_MAKE_PROGRAM=$make_program")
echo "aarch64: configuring and building in $build"
"${configure[@]}" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
"$cmake" --build "$build" --target attnkit_tests_aarch64

echo "aarch64: running under $(command -v qemu-aarch64-static || command -v qemu-aarch64)"
cd "$build"
"$ctest" --output-on-failure -j 2 --no-tests=error \
  -R "^attnkit_tests_aarch64:"
