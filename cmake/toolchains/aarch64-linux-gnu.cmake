# Cross-building attnkit (and its tests) for 64-bit Arm Linux on an x86-64 Debian/Ubuntu host:
#
#   cmake --preset aarch64      # or: -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
#
# The compiler is Debian's cross GCC (g++-aarch64-linux-gnu; set ATTNKIT_AARCH64_CXX for
# another, e.g. clang++ --target=aarch64-linux-gnu). The target's packages (the arm64 builds
# of Catch2, xsimd, Eigen) are looked up under ATTNKIT_AARCH64_PREFIX, where
# scripts/install-deps.sh unpacks them (default /opt/attnkit-aarch64): they cannot
# be installed over the host's own copies. Test programs run under qemu-aarch64 user
# emulation (qemu-user-static), with the cross toolchain's libraries as the guest's root.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(ATTNKIT_AARCH64_TRIPLE aarch64-linux-gnu)
if(NOT DEFINED ATTNKIT_AARCH64_PREFIX)
  set(ATTNKIT_AARCH64_PREFIX "$ENV{ATTNKIT_AARCH64_PREFIX}")
  if(NOT ATTNKIT_AARCH64_PREFIX)
    set(ATTNKIT_AARCH64_PREFIX /opt/attnkit-aarch64)
  endif()
endif()
set(ATTNKIT_AARCH64_PREFIX "${ATTNKIT_AARCH64_PREFIX}" CACHE PATH
    "Where the arm64 builds of attnkit's dependencies are unpacked")

if(NOT CMAKE_CXX_COMPILER)
  if(DEFINED ENV{ATTNKIT_AARCH64_CXX})
    set(CMAKE_CXX_COMPILER "$ENV{ATTNKIT_AARCH64_CXX}")
  else()
    set(CMAKE_CXX_COMPILER ${ATTNKIT_AARCH64_TRIPLE}-g++)
  endif()
endif()
if(NOT CMAKE_C_COMPILER)
  set(CMAKE_C_COMPILER ${ATTNKIT_AARCH64_TRIPLE}-gcc)
endif()
# Clang cross-compiles with --target and the GNU cross toolchain's headers and libraries
# (checked: Clang 14's build of the SIMD-layer tests passes under qemu). Its OpenMP runtime
# is LLVM's libomp, which Debian's cross packages do not ship for arm64: without one, the
# OpenMP check fails and attnkit builds serial (the hand-built check above linked GCC's
# libgomp instead).
if(CMAKE_CXX_COMPILER MATCHES "clang")
  set(CMAKE_CXX_COMPILER_TARGET ${ATTNKIT_AARCH64_TRIPLE})
endif()

# The guest's libraries: the cross toolchain's (libc, libstdc++, libgomp).
set(ATTNKIT_AARCH64_GUEST_ROOT /usr/${ATTNKIT_AARCH64_TRIPLE})
find_program(ATTNKIT_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(ATTNKIT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${ATTNKIT_QEMU_AARCH64};-L;${ATTNKIT_AARCH64_GUEST_ROOT}")
endif()

set(CMAKE_FIND_ROOT_PATH "${ATTNKIT_AARCH64_PREFIX}" "${ATTNKIT_AARCH64_PREFIX}/usr"
                         "${ATTNKIT_AARCH64_GUEST_ROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)  # host tools (qemu, python, clang-format)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
