# Helpers for attnkit's own targets (tests, benchmarks, examples). The INTERFACE target
# carries no flags; these targets add warnings-as-errors and the ISA chosen here.
# A cross build has no "native": its default is the toolchain's own target (for aarch64,
# ARMv8-A with NEON).
if(CMAKE_CROSSCOMPILING)
  set(attnkit_default_arch "")
else()
  set(attnkit_default_arch "-march=native")
endif()
set(ATTNKIT_ARCH_FLAGS "${attnkit_default_arch}" CACHE STRING
    "ISA flags for attnkit's tests, benchmarks and examples (e.g. -march=x86-64-v2)")
separate_arguments(ATTNKIT_ARCH_FLAGS_LIST UNIX_COMMAND "${ATTNKIT_ARCH_FLAGS}")

# Optimization of optimized (non-Debug) builds, per kind of target. Tests compile at -Og:
# their cost is the optimizer's work on hundreds of kernel instantiations, while what they
# check -- the same source, the same SIMD paths, the same order of operations -- does not
# depend on it. tests/kernel/test_attention_masks.cpp (GCC 12, AVX-512): -O2 100 s of CPU,
# -O1 63 s, -Og 24 s (after decode_row_math.hpp), and its tests run as fast at -Og as at -O1.
# Examples take the same level; the README's programs run at -O2, the level of most users'
# release builds (as do the package tests' consumers); benchmarks at -O3 (the test preset
# only smoke-tests them and builds them at -Og).
set(ATTNKIT_TEST_OPT_FLAGS "-Og" CACHE STRING "Optimization of attnkit's tests (non-Debug builds)")
set(ATTNKIT_EXAMPLE_OPT_FLAGS "-Og" CACHE STRING "Optimization of attnkit's examples")
set(ATTNKIT_BENCH_OPT_FLAGS "-O3" CACHE STRING "Optimization of attnkit's benchmarks")

# attnkit_target_defaults(<target> [BASELINE | ARCH <flags...>] [OPT <flags...>]): warnings as errors,
# the optimization OPT for non-Debug builds (default ATTNKIT_TEST_OPT_FLAGS) and the ISA
# flags (ATTNKIT_ARCH_FLAGS unless ARCH is given).
function(attnkit_target_defaults target)
  cmake_parse_arguments(ARG "BASELINE" "" "ARCH;OPT" ${ARGN})
  if(ARG_BASELINE)
    set(ARG_ARCH "")  # the compiler's default ISA
  elseif(NOT DEFINED ARG_ARCH)
    set(ARG_ARCH ${ATTNKIT_ARCH_FLAGS_LIST})
  endif()
  if(NOT DEFINED ARG_OPT)
    separate_arguments(ARG_OPT UNIX_COMMAND "${ATTNKIT_TEST_OPT_FLAGS}")
  endif()
  target_link_libraries(${target} PRIVATE attnkit::attnkit)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror ${ARG_ARCH}
                                           "$<$<NOT:$<CONFIG:Debug>>:${ARG_OPT}>")
  # GCC 12 warns inside its own AVX-512 intrinsic headers (PR 105593, fixed in GCC 13)
  # whenever <immintrin.h> was parsed before attnkit's SIMD layer could silence it, e.g.
  # when <Eigen/Core> is included first. Clang builds keep both warnings.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized -Wno-uninitialized)
  endif()
endfunction()
