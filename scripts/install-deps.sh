#!/usr/bin/env bash
# Installs everything attnkit needs to build, test and benchmark on Debian/Ubuntu:
# a C++17 compiler, CMake >= 3.25, Ninja, Eigen 3.4, xsimd >= 8.1, Catch2 v3,
# Google Benchmark and OpenMP. Idempotent: when everything is present it only checks.
# On Debian 12 Catch2 v3 lives in bookworm-backports, which is enabled when needed.
set -euo pipefail

# libomp-dev is LLVM's OpenMP runtime, for Clang builds; g++ brings its own libgomp.
packages=(g++ cmake ninja-build libeigen3-dev libxsimd-dev catch2 libbenchmark-dev libomp-dev)

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

missing=()
for p in "${packages[@]}"; do
  is_installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ] && have_catch2_v3; then
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
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${others[@]}"
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${backports[@]}" catch2

if ! have_catch2_v3; then
  echo "install-deps.sh: Catch2 v3 was not installed (found an older Catch2?)" >&2
  exit 1
fi
echo "install-deps.sh: done"
