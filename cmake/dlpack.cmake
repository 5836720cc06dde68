# DLPack is a real dependency: its header comes from the system (Debian's libdlpack-dev), from
# KF_DLPACK_INCLUDE_DIR (CMake or environment variable), or from a Python package that ships it
# (torch, CuPy): the H200 machine has no apt, but its torch and CuPy carry the header.
if(NOT KF_DLPACK_INCLUDE_DIR AND DEFINED ENV{KF_DLPACK_INCLUDE_DIR})
  set(KF_DLPACK_INCLUDE_DIR "$ENV{KF_DLPACK_INCLUDE_DIR}")
endif()
if(NOT KF_DLPACK_INCLUDE_DIR)
  find_path(KF_DLPACK_SYSTEM_DIR dlpack/dlpack.h)
  if(KF_DLPACK_SYSTEM_DIR)
    set(KF_DLPACK_INCLUDE_DIR "${KF_DLPACK_SYSTEM_DIR}")
  endif()
endif()
if(NOT KF_DLPACK_INCLUDE_DIR)
  find_package(Python COMPONENTS Interpreter QUIET)
  if(Python_EXECUTABLE)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" "${CMAKE_CURRENT_LIST_DIR}/find_dlpack.py"
      OUTPUT_VARIABLE _kf_dlpack_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_kf_dlpack_dir MATCHES "\\.h$")
      # A header under another name (torch's ATen/dlpack.h): give it the dlpack/ folder.
      configure_file("${_kf_dlpack_dir}" "${CMAKE_BINARY_DIR}/dlpack_include/dlpack/dlpack.h"
        COPYONLY)
      set(KF_DLPACK_INCLUDE_DIR "${CMAKE_BINARY_DIR}/dlpack_include")
    elseif(_kf_dlpack_dir)
      set(KF_DLPACK_INCLUDE_DIR "${_kf_dlpack_dir}")
    endif()
  endif()
endif()
if(NOT KF_DLPACK_INCLUDE_DIR OR NOT EXISTS "${KF_DLPACK_INCLUDE_DIR}/dlpack/dlpack.h")
  message(FATAL_ERROR "dlpack/dlpack.h not found: install libdlpack-dev (apt), or set "
    "KF_DLPACK_INCLUDE_DIR to a folder holding dlpack/dlpack.h (torch and CuPy ship one)")
endif()
set(KF_DLPACK_INCLUDE_DIR "${KF_DLPACK_INCLUDE_DIR}" CACHE PATH "folder holding dlpack/dlpack.h")
message(STATUS "DLPack header: ${KF_DLPACK_INCLUDE_DIR}/dlpack/dlpack.h")
