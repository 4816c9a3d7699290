# Builds and runs tests/package/consumer against attnkit, as a strict user would. Run with
#   cmake -DMODE=find_package|subdirectory -DATTNKIT_SOURCE_DIR=<src> -DATTNKIT_BUILD_DIR=<build>
#         -DCONSUMER_SOURCE_DIR=<dir> -DWORK_DIR=<dir> -DCXX_COMPILER=<path>
#         [-DGENERATOR=<gen>] [-DMAKE_PROGRAM=<path>] [-DCONFIG=<cfg>]
#         [-DCXX_FLAGS=<flags>] [-DCONFIG_FLAGS=<flags>] [-DLINKER_FLAGS=<flags>]
#         [-DARCH_FLAGS=<flags>] [-DPREFIX_PATH=<a|b|...>] -P run_consumer.cmake
# find_package: installs ATTNKIT_BUILD_DIR to WORK_DIR/prefix and finds it there.
# subdirectory: the consumer calls add_subdirectory(ATTNKIT_SOURCE_DIR).
# The consumer compiles with CXX_FLAGS and ARCH_FLAGS, CONFIG_FLAGS (default -O1 -DNDEBUG),
# links with LINKER_FLAGS, and adds the strict warning set with -Werror to its target.
# Everything happens in WORK_DIR, which is deleted first. Any failing step fails the test.
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS MODE ATTNKIT_SOURCE_DIR CONSUMER_SOURCE_DIR WORK_DIR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT MODE MATCHES "^(find_package|subdirectory)$")
  message(FATAL_ERROR "run_consumer.cmake: MODE must be find_package or subdirectory, got '${MODE}'")
endif()
if(MODE STREQUAL "find_package" AND "${ATTNKIT_BUILD_DIR}" STREQUAL "")
  message(FATAL_ERROR "run_consumer.cmake: find_package mode needs -DATTNKIT_BUILD_DIR=...")
endif()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# The parent's CMAKE_PREFIX_PATH arrives '|'-separated (a ';' would split the test command);
# it lets the consumer find Eigen, xsimd and OpenMP where the parent build found them.
string(REPLACE "|" ";" prefix_path "${PREFIX_PATH}")
set(config_args "")
if(NOT "${CONFIG}" STREQUAL "")
  set(config_args --config "${CONFIG}")
endif()

if(MODE STREQUAL "find_package")
  message(STATUS "run_consumer: installing ${ATTNKIT_BUILD_DIR} to ${prefix}")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" --install "${ATTNKIT_BUILD_DIR}" --prefix "${prefix}"
            ${config_args}
    COMMAND_ERROR_IS_FATAL ANY)
  list(PREPEND prefix_path "${prefix}")
endif()

# The consumer is built as the parent build is (its flags, so that sanitizers reach it);
# without build-type flags -O1 suffices, this checks packaging, not speed. No -march unless
# ARCH_FLAGS asks: attnkit::attnkit itself must carry no ISA flags. The warnings are a
# strict user's, as errors: attnkit's headers are not SYSTEM includes under
# add_subdirectory. The package registry is off so only the fresh prefix can be found.
include("${ATTNKIT_SOURCE_DIR}/cmake/attnkitStrictWarnings.cmake")
if(NOT DEFINED CONFIG_FLAGS)
  set(CONFIG_FLAGS "-O1 -DNDEBUG")
endif()
string(STRIP "${CXX_FLAGS} ${ARCH_FLAGS}" consumer_cxx_flags)
set(generator_args "")
if(NOT "${GENERATOR}" STREQUAL "")
  list(APPEND generator_args -G "${GENERATOR}")
endif()
if(NOT "${MAKE_PROGRAM}" STREQUAL "")
  list(APPEND generator_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
message(STATUS "run_consumer: configuring the consumer (${MODE}, ${CXX_COMPILER}) in ${build}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${build}" ${generator_args}
          "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
          "-DCMAKE_CXX_FLAGS=${consumer_cxx_flags}"
          -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=${CONFIG_FLAGS}"
          "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}"
          "-DCONSUMER_CXX_OPTIONS=${ATTNKIT_STRICT_WARNINGS}"
          "-DCMAKE_PREFIX_PATH=${prefix_path}"
          -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
          "-DATTNKIT_CONSUMER_MODE=${MODE}"
          "-DATTNKIT_SOURCE_DIR=${ATTNKIT_SOURCE_DIR}"
  COMMAND_ERROR_IS_FATAL ANY)

if(MODE STREQUAL "find_package")
  # Honest only if the package came from the prefix just installed, not from elsewhere.
  file(STRINGS "${build}/CMakeCache.txt" attnkit_dir_line REGEX "^attnkit_DIR:")
  string(REGEX REPLACE "^attnkit_DIR:[A-Z]+=" "" attnkit_dir "${attnkit_dir_line}")
  file(REAL_PATH "${prefix}" real_prefix)
  file(REAL_PATH "${attnkit_dir}" real_attnkit_dir)
  cmake_path(IS_PREFIX real_prefix "${real_attnkit_dir}" NORMALIZE from_prefix)
  if(NOT from_prefix)
    message(FATAL_ERROR "run_consumer: attnkit was found at '${attnkit_dir}', "
                        "not in the fresh prefix ${prefix}")
  endif()
endif()

message(STATUS "run_consumer: building the consumer")
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${build}" ${config_args}
                COMMAND_ERROR_IS_FATAL ANY)

set(consumer "${build}/consumer")
if(NOT EXISTS "${consumer}" AND NOT "${CONFIG}" STREQUAL "")
  set(consumer "${build}/${CONFIG}/consumer")  # multi-config generators
endif()
message(STATUS "run_consumer: running ${consumer}")
execute_process(COMMAND "${consumer}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "consumer OK")
  message(FATAL_ERROR "run_consumer: the consumer failed (exit ${rc})")
endif()
