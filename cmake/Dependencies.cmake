# Finds the required libraries and the optional parts (CUDA, NCCL, MPI, Gloo, OpenBLAS).
# Each optional part is DDP_WITH_<NAME>=AUTO|ON|OFF: AUTO uses it when found, ON makes
# its absence a configure error, OFF leaves it out. ddp_print_summary() reports the result.

set(_ddp_found "")
set(_ddp_missing "")

function(ddp_optional name)
  set(DDP_WITH_${name} AUTO CACHE STRING "Build with ${name}: AUTO, ON or OFF")
  set_property(CACHE DDP_WITH_${name} PROPERTY STRINGS AUTO ON OFF)
endfunction()

# Records the outcome of one optional part; fails when it was required.
# A library found by file as an imported target (ddp_deps::NAME), so that the installed
# package names it, not this machine's path: ddpConfig.cmake finds it again where it is used.
function(ddp_dependency_target name library include_dir)
  add_library(ddp_deps::${name} UNKNOWN IMPORTED GLOBAL)
  set_target_properties(ddp_deps::${name} PROPERTIES IMPORTED_LOCATION "${library}"
                        INTERFACE_INCLUDE_DIRECTORIES "${include_dir}")
endfunction()

macro(ddp_report name found detail)
  if(${found})
    list(APPEND _ddp_found "${name} (${detail})")
    set(DDP_HAVE_${name} ON)
  else()
    if(DDP_WITH_${name} STREQUAL "ON")
      message(FATAL_ERROR "DDP_WITH_${name}=ON but ${name} was not found: ${detail}")
    endif()
    list(APPEND _ddp_missing "${name} (${detail})")
    set(DDP_HAVE_${name} OFF)
  endif()
endmacro()

# A required library that is missing stops the configuration with one message naming it
# and the three ways to provide it (scripts/deps.sh relies on this instead of dpkg).
function(ddp_missing_required name apt copy)
  message(FATAL_ERROR
    "ddp needs ${name}, which was not found. Provide it in one of three ways:\n"
    "  1. install it:            sudo apt-get install -y ${apt}\n"
    "  2. point CMake at it:     -DCMAKE_PREFIX_PATH=/prefix/that/has/it "
    "(the scripts pass DDP_CMAKE_ARGS to cmake)\n"
    "  3. ${copy}\n")
endfunction()

# A header-only library found by its header alone (a copied folder on CMAKE_PREFIX_PATH or
# CPATH) when no CMake package describes it: an INTERFACE target of the usual name.
function(ddp_header_only target header)
  string(MAKE_C_IDENTIFIER "DDP_${target}_INCLUDE_DIR" var)
  find_path(${var} ${header} PATHS ENV CPATH)
  if(${var})
    add_library(${target} INTERFACE IMPORTED GLOBAL)
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${${var}}")
    message(STATUS "  header-only ${target} from ${${var}}")
  endif()
endfunction()

# Required: logging, command lines, JSON, gzip.
find_package(spdlog QUIET)
if(NOT spdlog_FOUND)
  ddp_missing_required(spdlog "libspdlog-dev libfmt-dev"
    "build spdlog and fmt from source with cmake --install into a prefix, and use way 2")
endif()
find_package(cxxopts QUIET)
if(NOT cxxopts_FOUND)
  ddp_header_only(cxxopts::cxxopts cxxopts.hpp)
  if(NOT TARGET cxxopts::cxxopts)
    ddp_missing_required(cxxopts libcxxopts-dev
      "copy its header-only release: PREFIX/include/cxxopts.hpp, with PREFIX on CMAKE_PREFIX_PATH")
  endif()
endif()
find_package(nlohmann_json QUIET)
if(NOT nlohmann_json_FOUND)
  ddp_header_only(nlohmann_json::nlohmann_json nlohmann/json.hpp)
  if(NOT TARGET nlohmann_json::nlohmann_json)
    ddp_missing_required(nlohmann-json nlohmann-json3-dev
      "copy its header-only release: PREFIX/include/nlohmann/json.hpp, with PREFIX on CMAKE_PREFIX_PATH")
  endif()
endif()
find_package(ZLIB QUIET)
if(NOT ZLIB_FOUND)
  # Images often ship the runtime library (libz.so.1) without the development symlink.
  find_path(DDP_ZLIB_INCLUDE_DIR zlib.h PATHS ENV CPATH)
  find_library(DDP_ZLIB_LIBRARY NAMES z libz.so.1)
  if(DDP_ZLIB_INCLUDE_DIR AND DDP_ZLIB_LIBRARY)
    add_library(ZLIB::ZLIB UNKNOWN IMPORTED GLOBAL)
    set_target_properties(ZLIB::ZLIB PROPERTIES IMPORTED_LOCATION "${DDP_ZLIB_LIBRARY}"
                                                INTERFACE_INCLUDE_DIRECTORIES "${DDP_ZLIB_INCLUDE_DIR}")
    message(STATUS "  zlib from ${DDP_ZLIB_LIBRARY} and ${DDP_ZLIB_INCLUDE_DIR}/zlib.h")
  else()
    ddp_missing_required(zlib zlib1g-dev
      "copy zlib.h and zconf.h into PREFIX/include (libz.so.1 is on nearly every system), "
      "with PREFIX on CMAKE_PREFIX_PATH")
  endif()
endif()
find_package(Threads REQUIRED)

# OpenBLAS (CBLAS) for CPU matrix products; a portable loop fallback otherwise.
ddp_optional(OPENBLAS)
if(NOT DDP_WITH_OPENBLAS STREQUAL "OFF")
  find_path(DDP_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas)
  find_library(DDP_OPENBLAS_LIBRARY NAMES openblas)
  if(DDP_CBLAS_INCLUDE_DIR AND DDP_OPENBLAS_LIBRARY)
    ddp_report(OPENBLAS TRUE "${DDP_OPENBLAS_LIBRARY}")
    ddp_dependency_target(openblas "${DDP_OPENBLAS_LIBRARY}" "${DDP_CBLAS_INCLUDE_DIR}")
  else()
    ddp_report(OPENBLAS FALSE "libopenblas-dev not installed: CPU matrix products use slow loops")
  endif()
else()
  ddp_report(OPENBLAS FALSE "switched off")
endif()

# CUDA toolkit: the GPU model and device binding.
ddp_optional(CUDA)
if(NOT DDP_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    ddp_report(CUDA TRUE "${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
  else()
    ddp_report(CUDA FALSE "no nvcc found: set CUDACXX or put the toolkit bin/ on PATH")
  endif()
else()
  ddp_report(CUDA FALSE "switched off")
endif()

# NCCL: GPU collectives (needs CUDA).
ddp_optional(NCCL)
if(NOT DDP_WITH_NCCL STREQUAL "OFF" AND DDP_HAVE_CUDA)
  find_path(DDP_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(DDP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(DDP_NCCL_INCLUDE_DIR AND DDP_NCCL_LIBRARY)
    ddp_report(NCCL TRUE "${DDP_NCCL_LIBRARY}")
    ddp_dependency_target(nccl "${DDP_NCCL_LIBRARY}" "${DDP_NCCL_INCLUDE_DIR}")
  else()
    ddp_report(NCCL FALSE "nccl.h or libnccl not found (install NCCL, or put its prefix on CMAKE_PREFIX_PATH)")
  endif()
elseif(DDP_WITH_NCCL STREQUAL "OFF")
  ddp_report(NCCL FALSE "switched off")
else()
  ddp_report(NCCL FALSE "needs CUDA")
endif()

# MPI: CPU collectives and start-up under mpirun.
ddp_optional(MPI)
if(NOT DDP_WITH_MPI STREQUAL "OFF")
  set(MPI_CXX_SKIP_MPICXX ON)  # the C API only, called from C++
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    ddp_report(MPI TRUE "MPI ${MPI_CXX_VERSION}")
  else()
    ddp_report(MPI FALSE "no MPI found (install libopenmpi-dev)")
  endif()
else()
  ddp_report(MPI FALSE "switched off")
endif()

# Gloo: CPU collectives over TCP.
ddp_optional(GLOO)
if(NOT DDP_WITH_GLOO STREQUAL "OFF")
  find_path(DDP_GLOO_INCLUDE_DIR gloo/config.h)
  find_library(DDP_GLOO_LIBRARY gloo)
  if(DDP_GLOO_INCLUDE_DIR AND DDP_GLOO_LIBRARY)
    ddp_report(GLOO TRUE "${DDP_GLOO_LIBRARY}")
    ddp_dependency_target(gloo "${DDP_GLOO_LIBRARY}" "${DDP_GLOO_INCLUDE_DIR}")
  else()
    ddp_report(GLOO FALSE "gloo not found (install libgloo-dev)")
  endif()
else()
  ddp_report(GLOO FALSE "switched off")
endif()

# LibTorch: ddp::DistributedDataParallel for LibTorch modules (the package component torch).
# Debian's libtorch-dev (CPU), or the LibTorch inside PyTorch's pip wheel: Torch_DIR, else the
# path the python3 on PATH (or DDP_PYTHON) gives (torch.utils.cmake_prefix_path).
# MUNGE (Slurm's credential service): under srun the store admits, from other hosts, only
# processes that MUNGE says run as the job's user. Its header at build time (libmunge-dev);
# its library is opened with dlopen at run time (libmunge.so.2), so that ddp's programs run
# where it is not installed.
ddp_optional(MUNGE)
if(NOT DDP_WITH_MUNGE STREQUAL "OFF")
  find_path(DDP_MUNGE_INCLUDE_DIR munge.h)
  if(DDP_MUNGE_INCLUDE_DIR)
    ddp_report(MUNGE TRUE "${DDP_MUNGE_INCLUDE_DIR}/munge.h, libmunge.so.2 opened at run time")
  else()
    ddp_report(MUNGE FALSE "no munge.h (install libmunge-dev): under srun the store checks peers of other hosts by token only")
  endif()
else()
  ddp_report(MUNGE FALSE "switched off")
endif()

ddp_optional(TORCH)
if(NOT DDP_WITH_TORCH STREQUAL "OFF")
  # Torch's CMake files may change the compilers' flags and CUDA architectures: ddp's own
  # targets keep theirs (Torch's targets carry what they need themselves).
  foreach(_ddp_var CMAKE_CXX_FLAGS CMAKE_CUDA_FLAGS CMAKE_CUDA_ARCHITECTURES)
    set(_ddp_saved_${_ddp_var} "${${_ddp_var}}")
  endforeach()
  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    set(_ddp_python python3)
    if(DEFINED ENV{DDP_PYTHON})
      set(_ddp_python "$ENV{DDP_PYTHON}")
    endif()
    execute_process(COMMAND ${_ddp_python} -c
                            "import sys, torch.utils; sys.stdout.write(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE _ddp_torch_prefix RESULT_VARIABLE _ddp_torch_rc ERROR_QUIET)
    if(_ddp_torch_rc EQUAL 0 AND _ddp_torch_prefix)
      find_package(Torch QUIET PATHS "${_ddp_torch_prefix}" NO_DEFAULT_PATH)
    endif()
  endif()
  foreach(_ddp_var CMAKE_CXX_FLAGS CMAKE_CUDA_FLAGS CMAKE_CUDA_ARCHITECTURES)
    set(${_ddp_var} "${_ddp_saved_${_ddp_var}}")
  endforeach()
  if(Torch_FOUND)
    set(DDP_TORCH_CUDA OFF)
    set(_ddp_torch_kind CPU)
    if(TORCH_CUDA_LIBRARIES OR TARGET c10_cuda)
      set(DDP_TORCH_CUDA ON)
      set(_ddp_torch_kind CUDA)
    endif()
    # A LibTorch that ships its own fmt headers (the pip wheel's) shadows the fmt that ddp's
    # errors are formatted with (and whose library is linked): the programs that include
    # <ddp/torch.h> then take fmt whole from those headers (FMT_HEADER_ONLY).
    set(DDP_TORCH_FMT_HEADER_ONLY OFF)
    set(_ddp_torch_fmt "")
    foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
      if(EXISTS "${dir}/fmt/format.h" AND NOT dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
        set(_ddp_torch_fmt "${dir}/fmt")
        break()
      endif()
    endforeach()
    if(_ddp_torch_fmt AND NOT EXISTS "${_ddp_torch_fmt}/format-inl.h")
      ddp_report(TORCH FALSE "LibTorch ${Torch_VERSION}'s ${_ddp_torch_fmt} shadows fmt and cannot be used header-only")
    else()
      if(_ddp_torch_fmt)
        set(DDP_TORCH_FMT_HEADER_ONLY ON)
        set(_ddp_torch_kind "${_ddp_torch_kind}, its own fmt header-only")
      endif()
      ddp_report(TORCH TRUE "LibTorch ${Torch_VERSION}, ${_ddp_torch_kind}, in ${Torch_DIR}")
    endif()
  else()
    ddp_report(TORCH FALSE "no LibTorch (install libtorch-dev, or set Torch_DIR to a LibTorch's share/cmake/Torch): no ddp::torch")
  endif()
else()
  ddp_report(TORCH FALSE "switched off")
endif()

# GoogleTest for the test suites.
if(DDP_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    ddp_missing_required(GoogleTest libgtest-dev
      "or configure with -DDDP_BUILD_TESTS=OFF to build without the tests")
  endif()
endif()

function(ddp_print_summary)
  message(STATUS "ddp configuration (${CMAKE_BUILD_TYPE}):")
  foreach(item IN LISTS _ddp_found)
    message(STATUS "  found:    ${item}")
  endforeach()
  foreach(item IN LISTS _ddp_missing)
    message(STATUS "  left out: ${item}")
  endforeach()
  # One line for the scripts to repeat after the build.
  list(JOIN _ddp_missing "\n" left_out)
  file(WRITE "${CMAKE_BINARY_DIR}/left-out.txt" "${left_out}")
endfunction()
