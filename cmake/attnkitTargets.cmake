# Helpers for attnkit's own targets (tests, benchmarks, examples). The INTERFACE target
# carries no flags; these targets add warnings-as-errors and the ISA chosen here.
set(ATTNKIT_ARCH_FLAGS "-march=native" CACHE STRING
    "ISA flags for attnkit's tests, benchmarks and examples (e.g. -march=x86-64-v2)")
separate_arguments(ATTNKIT_ARCH_FLAGS_LIST UNIX_COMMAND "${ATTNKIT_ARCH_FLAGS}")

# attnkit_target_defaults(<target> [ARCH <flags...>]): warnings as errors, -O3 for
# optimized builds, and the ISA flags (ATTNKIT_ARCH_FLAGS unless ARCH is given).
function(attnkit_target_defaults target)
  cmake_parse_arguments(ARG "" "" "ARCH" ${ARGN})
  if(NOT DEFINED ARG_ARCH)
    set(ARG_ARCH ${ATTNKIT_ARCH_FLAGS_LIST})
  endif()
  target_link_libraries(${target} PRIVATE attnkit::attnkit)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror ${ARG_ARCH}
                                           $<$<NOT:$<CONFIG:Debug>>:-O3>)
  # GCC 12 warns inside its own AVX-512 intrinsic headers (PR 105593, fixed in GCC 13)
  # whenever <immintrin.h> was parsed before attnkit's SIMD layer could silence it, e.g.
  # when <Eigen/Core> is included first. Clang builds keep both warnings.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized -Wno-uninitialized)
  endif()
endfunction()
