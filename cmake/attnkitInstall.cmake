# Install rules: headers, the exported INTERFACE target attnkit::attnkit, and a package
# config with version file so that find_package(attnkit 0.1) works from the prefix.
include(CMakePackageConfigHelpers)

install(DIRECTORY include/attnkit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS attnkit EXPORT attnkitTargets)
set(ATTNKIT_CMAKE_DIR ${CMAKE_INSTALL_DATADIR}/cmake/attnkit)  # header-only: arch-independent
install(EXPORT attnkitTargets NAMESPACE attnkit:: DESTINATION ${ATTNKIT_CMAKE_DIR})

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/attnkitConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/attnkitConfig.cmake
  INSTALL_DESTINATION ${ATTNKIT_CMAKE_DIR})
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/attnkitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  ${CMAKE_CURRENT_LIST_DIR}/attnkitXsimdShim.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/attnkitConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/attnkitConfigVersion.cmake
  DESTINATION ${ATTNKIT_CMAKE_DIR})
