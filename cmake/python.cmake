# The Python module `mixtune` (python/mixtune/: the package, src/python/: its pybind11 binding of the public API),
# built when Debian's python3-dev and pybind11-dev are installed (MIXTUNE_PYTHON: AUTO, ON or OFF) and installed
# under lib/python3/dist-packages (Debian's directory for every Python 3 version).
set(MIXTUNE_PYTHON AUTO CACHE STRING "Build the Python module: AUTO, ON or OFF")
set_property(CACHE MIXTUNE_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(MIXTUNE_PYTHON_DIR lib/python3/dist-packages CACHE STRING "Where the Python package is installed, under the prefix")
if(NOT MIXTUNE_PYTHON STREQUAL "OFF")
  # Debian's interpreter (whose python3-numpy the tests use, and whose dist-packages the package fills), not one
  # that comes first on PATH (pyenv, a venv), unless the caller names one.
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  if(MIXTUNE_PYTHON STREQUAL "ON")
    find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
    find_package(pybind11 CONFIG REQUIRED)
  else()
    find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    pybind11_add_module(mixtune_python MODULE src/python/mixtune_module.cpp)
    target_link_libraries(mixtune_python PRIVATE mixtune_shared)
    # The module lands in <build>/python/mixtune/ beside the package files, so the build tree imports as installed.
    set(MIXTUNE_PYTHON_BUILD_DIR ${CMAKE_BINARY_DIR}/python/mixtune)
    file(MAKE_DIRECTORY ${MIXTUNE_PYTHON_BUILD_DIR})
    set_target_properties(mixtune_python PROPERTIES OUTPUT_NAME _mixtune LIBRARY_OUTPUT_DIRECTORY ${MIXTUNE_PYTHON_BUILD_DIR})
    # Installed: libmixtune.so is found relative to the module.
    file(RELATIVE_PATH MIXTUNE_PY_TO_LIB /${MIXTUNE_PYTHON_DIR}/mixtune /${CMAKE_INSTALL_LIBDIR})
    set_target_properties(mixtune_python PROPERTIES INSTALL_RPATH "$ORIGIN/${MIXTUNE_PY_TO_LIB}")
    configure_file(python/mixtune/__init__.py ${MIXTUNE_PYTHON_BUILD_DIR}/__init__.py COPYONLY)
    install(TARGETS mixtune_python LIBRARY DESTINATION ${MIXTUNE_PYTHON_DIR}/mixtune)
    install(FILES python/mixtune/__init__.py DESTINATION ${MIXTUNE_PYTHON_DIR}/mixtune)
    message(STATUS "mixtune: Python module ON (Python ${Python3_VERSION}, pybind11 ${pybind11_VERSION})")
  elseif(MIXTUNE_PYTHON STREQUAL "AUTO")
    message(STATUS "mixtune: Python module OFF (apt-get install python3-dev pybind11-dev)")
  endif()
endif()
