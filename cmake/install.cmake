# `cmake --install`: the CLI in bin/, libmixtune.so and the public headers (include/mixtune/), a CMake package so
# that find_package(mixtune) gives mixtune::mixtune, the Python module (cmake/python.cmake); `cpack -G DEB` packs
# the same tree as a Debian package.
include(CMakePackageConfigHelpers)

install(TARGETS mixtune RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS mixtune_shared EXPORT mixtuneTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES include/mixtune/mixtune.h ${CMAKE_BINARY_DIR}/include/mixtune/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mixtune)

set(MIXTUNE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mixtune)
install(EXPORT mixtuneTargets NAMESPACE mixtune:: DESTINATION ${MIXTUNE_CMAKE_DIR})
configure_package_config_file(cmake/mixtuneConfig.cmake.in ${CMAKE_BINARY_DIR}/mixtuneConfig.cmake
                              INSTALL_DESTINATION ${MIXTUNE_CMAKE_DIR})
# 0.x: only the same minor version is compatible (the ABI may change with it).
write_basic_package_version_file(${CMAKE_BINARY_DIR}/mixtuneConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/mixtuneConfig.cmake ${CMAKE_BINARY_DIR}/mixtuneConfigVersion.cmake
        DESTINATION ${MIXTUNE_CMAKE_DIR})
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY recipes/ DESTINATION ${CMAKE_INSTALL_DATADIR}/mixtune/recipes FILES_MATCHING PATTERN "*.yaml")

# The Debian package (cpack -G DEB in the build directory): the install tree under /usr. Its dependencies are
# Debian 12's runtime packages of what the binaries link (scripts/check-package.sh installs it on a fresh system
# and checks that every library resolves); a CUDA build also needs the CUDA 13 runtime (cuBLASLt, NCCL) that the
# toolkit installs under /usr/local/cuda, which Debian does not package.
set(CPACK_PACKAGE_NAME mixtune)
set(CPACK_PACKAGE_VENDOR "mixtune")
set(CPACK_PACKAGE_CONTACT "mixtune developers <mixtune@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "fine-tune Mixture-of-Experts language models stored in Hugging Face format")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libc6 (>= 2.36), libstdc++6 (>= 12), libgcc-s1, libgomp1, libopenblas0 | libopenblas0-pthread, libyaml-cpp0.7, libonig5, libutf8proc2")
if(MIXTUNE_USE_MPI)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libopenmpi3")
endif()
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3 (>= 3.11), python3-numpy, gnuplot-nox")
if(MIXTUNE_CUDA)
  set(CPACK_PACKAGE_DESCRIPTION
      "Built with the CUDA backend: needs the CUDA 13 runtime (libcublasLt, NCCL) under /usr/local/cuda/lib64.")
endif()
include(CPack)
