#!/usr/bin/env bash
# Installs everything attnkit needs to build, test and benchmark on Debian/Ubuntu:
# a C++17 compiler, CMake >= 3.25, Ninja, Eigen 3.4, xsimd >= 8.1, Catch2 v3,
# Google Benchmark, OpenMP, clang with its libFuzzer runtime for the fuzz test, matplotlib
# for the plots of the bench report (scripts/bench_report.py), Open MPI for the distributed
# component (ring attention) and, on x86-64, the aarch64
# cross compiler, qemu and the arm64 dependencies for the Arm test (--no-aarch64 leaves them
# out; the test then reports itself skipped).
# Idempotent: when everything is present it only checks.
# On Debian 12 Catch2 v3 lives in bookworm-backports, which is enabled when needed.
set -euo pipefail

# libomp-dev is LLVM's OpenMP runtime, for Clang builds; g++ brings its own libgomp.
# clang builds the fuzz test (tests/fuzz); its libFuzzer runtime is a separate package, see
# fuzzer_runtime_package below.
# python3-matplotlib: the bench report's plots (without it the report prints the table only).
# openmpi-bin, libopenmpi-dev: the optional distributed component (attnkit::mpi, ring
# attention) and its tests under mpirun.
packages=(g++ cmake ninja-build libeigen3-dev libxsimd-dev catch2 libbenchmark-dev libomp-dev
          clang python3-matplotlib openmpi-bin libopenmpi-dev)

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-deps.sh: needs root or sudo to install packages" >&2
  exit 1
fi

# dpkg reports a package as installed only when its status is "install ok installed".
is_installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

# Catch2 v3 ships /usr/include/catch2/catch_test_macros.hpp; v2 ships catch.hpp only.
have_catch2_v3() {
  [ -f /usr/include/catch2/catch_test_macros.hpp ]
}

# True when clang++ links a libFuzzer target (libFuzzer, ASan and UBSan runtimes present).
have_libfuzzer() {
  command -v clang++ >/dev/null 2>&1 || return 1
  local dir
  dir=$(mktemp -d)
  printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
    'extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }' \
    >"$dir/probe.cpp"
  local ok=0
  clang++ -fsanitize=fuzzer,address,undefined "$dir/probe.cpp" -o "$dir/probe" \
    >/dev/null 2>&1 || ok=1
  rm -rf "$dir"
  return $ok
}

# The package with clang's compiler-rt (libFuzzer, sanitizers): the libclang-rt-dev meta
# package that follows the default clang where there is one (Debian 12+, recent Ubuntu),
# else libclang-rt-<N>-dev for the installed clang's major version N. Older releases ship
# the runtime inside clang's own dependencies and have neither: prints nothing then.
fuzzer_runtime_package() {
  local major
  has_candidate() { apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [0-9]'; }
  if has_candidate libclang-rt-dev; then
    echo libclang-rt-dev
    return
  fi
  major=$(clang++ --version 2>/dev/null |
    sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n 1)
  if [ -n "$major" ] && has_candidate "libclang-rt-$major-dev"; then
    echo "libclang-rt-$major-dev"
  fi
}

# Unless --no-aarch64: also what the Arm tests need (tests/aarch64, the aarch64 preset): Debian's cross
# compiler and qemu user emulation on x86-64 hosts, and the arm64 builds of Catch2, xsimd and
# Eigen unpacked under aarch64_prefix (they cannot be installed next to the host's own
# copies: same paths).
# --ci (.ci/run): a throwaway machine that runs the test workflow only: dpkg unpacks without
# fsync (--force-unsafe-io), and a clang++ that cannot link a libFuzzer target is an error
# (the test workflow runs the fuzz test, which CI must not skip).
with_aarch64=1
ci=""
for arg in "$@"; do
  case "$arg" in
    --aarch64) with_aarch64=1 ;;  # the default; kept for the scripts that pass it
    --no-aarch64) with_aarch64="" ;;
    --ci) ci=1 ;;
    *) echo "install-deps.sh: unknown argument '$arg' (known: --no-aarch64, --ci)" >&2; exit 2 ;;
  esac
done
apt_options=()
if [ -n "$ci" ]; then
  apt_options=(-o Dpkg::Options::=--force-unsafe-io)
fi
aarch64_prefix=${ATTNKIT_AARCH64_PREFIX:-/opt/attnkit-aarch64}
aarch64_packages=()
if [ "$(uname -m)" = x86_64 ] && [ -n "$with_aarch64" ]; then
  aarch64_packages=(g++-aarch64-linux-gnu qemu-user-static)
  packages+=("${aarch64_packages[@]}")
fi
have_aarch64_prefix() {
  [ ${#aarch64_packages[@]} -eq 0 ] ||
    { [ -f "$aarch64_prefix/usr/lib/cmake/Catch2/Catch2Config.cmake" ] &&
      [ -d "$aarch64_prefix/usr/include/xsimd" ] && [ -d "$aarch64_prefix/usr/include/eigen3" ]; }
}

# Unpacks the arm64 packages of the dependencies into aarch64_prefix (Debian only: its one
# mirror serves every architecture).
install_aarch64_prefix() {
  if [ "${ID:-}" != debian ]; then
    echo "install-deps.sh: warning: the arm64 packages are fetched from Debian's mirror only;" \
         "the aarch64 test will be skipped" >&2
    return
  fi
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo[@]}" dpkg --add-architecture arm64
  fi
  "${sudo[@]}" apt-get update -qq
  local dir
  dir=$(mktemp -d)
  chmod 777 "$dir"
  (cd "$dir" && "${sudo[@]}" apt-get download -qq "${backports[@]}" libcatch2-dev:arm64 &&
     "${sudo[@]}" apt-get download -qq libxsimd-dev:arm64 libeigen3-dev)
  "${sudo[@]}" mkdir -p "$aarch64_prefix"
  for deb in "$dir"/*.deb; do "${sudo[@]}" dpkg-deb -x "$deb" "$aarch64_prefix"; done
  rm -rf "$dir"
}

missing=()
for p in "${packages[@]}"; do
  is_installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ] && have_catch2_v3 && have_libfuzzer && have_aarch64_prefix; then
  echo "install-deps.sh: all dependencies present"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps.sh: no apt-get; install by hand: ${packages[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
. /etc/os-release
codename=${VERSION_CODENAME:-}

# Debian 12 (bookworm) has Catch2 2.x in main; v3 is in bookworm-backports.
backports=()
if [ "${ID:-}" = debian ] && [ "$codename" = bookworm ]; then
  list=/etc/apt/sources.list.d/attnkit-bookworm-backports.list
  if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "install-deps.sh: enabling bookworm-backports for Catch2 v3"
    echo "deb http://deb.debian.org/debian bookworm-backports main" | "${sudo[@]}" tee "$list" >/dev/null
  fi
  backports=(-t bookworm-backports)
fi

"${sudo[@]}" apt-get update -qq
others=()
for p in "${packages[@]}"; do [ "$p" = catch2 ] || others+=("$p"); done
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${apt_options[@]}" "${others[@]}"
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${apt_options[@]}" \
  "${backports[@]}" catch2
if ! have_libfuzzer; then
  runtime=$(fuzzer_runtime_package)
  if [ -n "$runtime" ]; then
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${apt_options[@]}" "$runtime"
  fi
fi

if ! have_aarch64_prefix; then
  install_aarch64_prefix
fi

if ! have_catch2_v3; then
  echo "install-deps.sh: Catch2 v3 was not installed (found an older Catch2?)" >&2
  exit 1
fi
if ! have_libfuzzer; then
  if [ -n "$ci" ]; then  # CI runs the fuzz test (ATTNKIT_FUZZ_REQUIRED: no skip)
    echo "install-deps.sh: clang++ cannot link a libFuzzer target (install the" \
         "compiler-rt package of your clang)" >&2
    exit 1
  fi
  # Not fatal: the fuzz test then reports itself skipped; everything else works.
  echo "install-deps.sh: warning: clang++ cannot link a libFuzzer target; the fuzz test" \
       "will be skipped (install the compiler-rt package of your clang)" >&2
fi
echo "install-deps.sh: done"
