# cmake --install: the libraries as ddp::runtime, ddp::checksum, ddp::device (ddp::device_none: the stub),
# ddp::collectives (ddp::collectives_core, ddp::nccl, ddp::mpi), ddp::models, ddp::core, ddp::pipeline,
# ddp::engine (and ddp::models_cuda with CUDA, ddp::torch with LibTorch), their headers under include/ddp, the tools in
# bin, and ddpConfig.cmake so that find_package(ddp [COMPONENTS cuda nccl mpi]) gives targets
# that carry their own dependencies (spdlog, zlib, nlohmann-json, cxxopts; CUDA, NCCL, MPI,
# Gloo as this build found them) and DDP_HAVE_* definitions, and ddp::ddp with what was asked;
# and lib/pkgconfig/ddp.pc with the same for other builds (ddp-cpu.pc: a CPU-only program's).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_ddp_export_targets ddp_runtime ddp_checksum ddp_device ddp_device_none ddp_collectives_core
    ddp_collectives ddp_models ddp_core ddp_pipeline ddp_engine)
foreach(target ddp_nccl ddp_mpi ddp_models_cuda ddp_torch)
  if(TARGET ${target})
    list(APPEND _ddp_export_targets ${target})
  endif()
endforeach()
foreach(target IN LISTS _ddp_export_targets)
  string(REPLACE "ddp_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
endforeach()

install(TARGETS ${_ddp_export_targets} EXPORT ddpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ddprun ddptrain ddpdoctor ddpbench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Static libraries by default: each tool is one file that runs from anywhere, and a program
# of one's own carries what it uses. With -DBUILD_SHARED_LIBS=ON the libraries are shared:
# the installed tools find them beside them ($ORIGIN, relative: the prefix can move) and
# each library the others, and the tools' own library (launcher) is installed too.
if(BUILD_SHARED_LIBS)
  file(RELATIVE_PATH _ddp_bin_to_lib "/p/${CMAKE_INSTALL_BINDIR}" "/p/${CMAKE_INSTALL_LIBDIR}")
  set_target_properties(ddprun ddptrain ddpdoctor ddpbench PROPERTIES
                        INSTALL_RPATH "$ORIGIN/${_ddp_bin_to_lib}")
  set_target_properties(${_ddp_export_targets} ddp_launcher PROPERTIES INSTALL_RPATH "$ORIGIN")
  install(TARGETS ddp_launcher LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
# Headers: the public ones (include/ddp/*.h) and what they include, and theirs; every other
# header stays private (the set is found again when a header changes).
function(ddp_header_closure out)
  set(todo ${ARGN})
  set(seen "")
  while(todo)
    list(POP_FRONT todo header)
    if(header IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${header})
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${header})
    file(STRINGS ${PROJECT_SOURCE_DIR}/${header} lines REGEX "^#include \"")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" included "${line}")
      if(EXISTS ${PROJECT_SOURCE_DIR}/${included})
        list(APPEND todo ${included})
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()
file(GLOB _ddp_public RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include/ddp/*.h)
ddp_header_closure(_ddp_headers ${_ddp_public})
# Installed with their includes of each other as <ddp/...>: a program's include path is
# PREFIX/include alone, and no header of its own (a models/mlp.h) can stand in for one of ddp's.
install(CODE "set(DDP_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")
set(DDP_INSTALL_HEADERS \"${_ddp_headers}\")
set(DDP_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")")
install(SCRIPT ${PROJECT_SOURCE_DIR}/cmake/install_headers.cmake)
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)

# Where this build found the header-only parts (pkg-config's flags below; the CMake config
# finds them again on the user's machine).
get_target_property(_ddp_json_dirs nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
get_target_property(_ddp_cxxopts_dirs cxxopts::cxxopts INTERFACE_INCLUDE_DIRECTORIES)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/ddpConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ddpConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ddpConfig.cmake ${CMAKE_BINARY_DIR}/ddpConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)

# pkg-config: ddp's static libraries in link order, then what they need, as this build found
# it (the CMake targets' files; system paths, so the prefix itself can move).
set(_ddp_pc_own "")
set(_ddp_pc_device ddp_device)
if(NOT DDP_HAVE_CUDA)
  set(_ddp_pc_device ddp_device_none)  # ddp_device is only its alias then
endif()
foreach(target ddp_engine ddp_models_cuda ddp_pipeline ddp_core ddp_models ddp_checksum ddp_nccl ddp_mpi
        ddp_collectives_core ${_ddp_pc_device} ddp_runtime)
  if(TARGET ${target})
    string(APPEND _ddp_pc_own " -l${target}")
  endif()
endforeach()
foreach(backend nccl mpi)  # their hooks kept (collectives/backend_hooks.h)
  if(TARGET ddp_${backend})
    string(APPEND _ddp_pc_own " -Wl,--undefined=ddp_${backend}_backend")
  endif()
endforeach()
set(_ddp_pc_deps "")
set(_ddp_pc_cflags "")
foreach(name CUDA NCCL MPI GLOO OPENBLAS)
  string(APPEND _ddp_pc_cflags " -DDDP_HAVE_${name}=$<BOOL:${DDP_HAVE_${name}}>")
endforeach()
if(DDP_HAVE_GLOO)
  string(APPEND _ddp_pc_deps " ${DDP_GLOO_LIBRARY}")
endif()
if(DDP_HAVE_MPI)
  string(APPEND _ddp_pc_deps " $<JOIN:$<TARGET_PROPERTY:MPI::MPI_CXX,INTERFACE_LINK_LIBRARIES>, >")
endif()
if(DDP_HAVE_NCCL)
  string(APPEND _ddp_pc_deps " ${DDP_NCCL_LIBRARY}")
endif()
if(DDP_HAVE_CUDA)
  string(APPEND _ddp_pc_deps " $<TARGET_LINKER_FILE:CUDA::cublasLt> $<TARGET_LINKER_FILE:CUDA::cudart>")
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    string(APPEND _ddp_pc_cflags " -I${dir}")
  endforeach()
endif()
if(DDP_HAVE_OPENBLAS)
  string(APPEND _ddp_pc_deps " ${DDP_OPENBLAS_LIBRARY}")
endif()
list(TRANSFORM CMAKE_DL_LIBS PREPEND "-l" OUTPUT_VARIABLE _ddp_pc_dl)
string(APPEND _ddp_pc_deps " -pthread ${_ddp_pc_dl}")
# Header-only parts found outside the system's include path (nlohmann-json, cxxopts).
foreach(dir IN LISTS _ddp_json_dirs _ddp_cxxopts_dirs)
  if(dir AND NOT dir STREQUAL "/usr/include" AND NOT dir MATCHES "^\\$<")
    string(APPEND _ddp_pc_cflags " -I${dir}")
  endif()
endforeach()
# The prefix from the file's folder, however deep the library folder is.
file(RELATIVE_PATH DDP_PC_PREFIX_FROM_PCDIR "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
if(BUILD_SHARED_LIBS)  # found at run time where the .pc file says they are
  string(APPEND _ddp_pc_own " -Wl,-rpath,\${libdir}")
endif()
set(DDP_PC_OWN_LIBS "${_ddp_pc_own}")
set(DDP_PC_DEP_LIBS "${_ddp_pc_deps}")
set(DDP_PC_CFLAGS "${_ddp_pc_cflags}")
set(DDP_PC_NAME ddp)
set(DDP_PC_DESCRIPTION "every part, with the backends this build has")
configure_file(${PROJECT_SOURCE_DIR}/cmake/ddp.pc.in ${CMAKE_BINARY_DIR}/ddp.pc.configured @ONLY)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/ddp.pc INPUT ${CMAKE_BINARY_DIR}/ddp.pc.configured)
# ddp-cpu: what ddp::ddp without components links (ddp::init, World, Reducer, the collectives over
# Gloo, the models on the CPU), for a CPU-only program: no CUDA, NCCL or MPI in its flags.
set(DDP_PC_NAME ddp-cpu)
set(DDP_PC_DESCRIPTION "a CPU-only program's part (ddp::init, Reducer, Gloo), as ddp::ddp")
set(DDP_PC_OWN_LIBS " -lddp_pipeline -lddp_core -lddp_models -lddp_checksum -lddp_collectives_core -lddp_device_none -lddp_runtime")
if(BUILD_SHARED_LIBS)
  string(APPEND DDP_PC_OWN_LIBS " -Wl,-rpath,\${libdir}")
endif()
set(DDP_PC_DEP_LIBS "")
foreach(library IN ITEMS "${DDP_GLOO_LIBRARY}" "${DDP_OPENBLAS_LIBRARY}")
  if(library)
    string(APPEND DDP_PC_DEP_LIBS " ${library}")
  endif()
endforeach()
string(APPEND DDP_PC_DEP_LIBS " -pthread ${_ddp_pc_dl}")
set(DDP_PC_CFLAGS " -DDDP_HAVE_CUDA=0 -DDDP_HAVE_NCCL=0 -DDDP_HAVE_MPI=0")
foreach(name GLOO OPENBLAS)
  string(APPEND DDP_PC_CFLAGS " -DDDP_HAVE_${name}=$<BOOL:${DDP_HAVE_${name}}>")
endforeach()
foreach(dir IN LISTS _ddp_json_dirs _ddp_cxxopts_dirs)
  if(dir AND NOT dir STREQUAL "/usr/include" AND NOT dir MATCHES "^\\$<")
    string(APPEND DDP_PC_CFLAGS " -I${dir}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/ddp.pc.in ${CMAKE_BINARY_DIR}/ddp-cpu.pc.configured @ONLY)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/ddp-cpu.pc INPUT ${CMAKE_BINARY_DIR}/ddp-cpu.pc.configured)
install(FILES ${CMAKE_BINARY_DIR}/ddp.pc ${CMAKE_BINARY_DIR}/ddp-cpu.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
# ddp-torch: ddp::DistributedDataParallel for a LibTorch program (as find_package(ddp
# COMPONENTS torch)): ddp's part (ddp-cpu with a CPU LibTorch, ddp with a CUDA one), then
# LibTorch's libraries, headers and ABI flag where this build found them.
if(TARGET ddp_torch)
  set(DDP_PC_NAME ddp-torch)
  set(DDP_PC_DESCRIPTION "ddp::DistributedDataParallel for LibTorch ${Torch_VERSION} programs")
  get_filename_component(_ddp_torch_libdir "${TORCH_LIBRARY}" DIRECTORY)
  set(DDP_PC_OWN_LIBS " -lddp_torch")
  if(BUILD_SHARED_LIBS)
    string(APPEND DDP_PC_OWN_LIBS " -Wl,-rpath,\${libdir}")
  endif()
  set(DDP_PC_DEP_LIBS " -L${_ddp_torch_libdir}")
  if(NOT _ddp_torch_libdir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
    string(APPEND DDP_PC_DEP_LIBS " -Wl,-rpath,${_ddp_torch_libdir}")
  endif()
  set(_ddp_torch_libs torch torch_cpu c10)
  if(DDP_TORCH_CUDA)
    set(_ddp_torch_libs torch torch_cuda torch_cpu c10_cuda c10)
  endif()
  # LibTorch's libraries are needed whether or not the program calls into each directly.
  string(APPEND DDP_PC_DEP_LIBS " -Wl,--no-as-needed")
  foreach(library IN LISTS _ddp_torch_libs)
    if(EXISTS "${_ddp_torch_libdir}/lib${library}.so")
      string(APPEND DDP_PC_DEP_LIBS " -l${library}")
    endif()
  endforeach()
  string(APPEND DDP_PC_DEP_LIBS " -Wl,--as-needed")
  set(DDP_PC_CFLAGS " ${TORCH_CXX_FLAGS}")
  if(DDP_TORCH_FMT_HEADER_ONLY)
    string(APPEND DDP_PC_CFLAGS " -DFMT_HEADER_ONLY")
  endif()
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
      string(APPEND DDP_PC_CFLAGS " -I${dir}")
    endif()
  endforeach()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/ddp.pc.in ${CMAKE_BINARY_DIR}/ddp-torch.pc.in.configured @ONLY)
  # Requires ddp's part instead of spdlog and zlib alone.
  file(READ ${CMAKE_BINARY_DIR}/ddp-torch.pc.in.configured _ddp_torch_pc)
  if(DDP_TORCH_CUDA)
    string(REPLACE "Requires: spdlog zlib" "Requires: ddp" _ddp_torch_pc "${_ddp_torch_pc}")
  else()
    string(REPLACE "Requires: spdlog zlib" "Requires: ddp-cpu" _ddp_torch_pc "${_ddp_torch_pc}")
  endif()
  file(WRITE ${CMAKE_BINARY_DIR}/ddp-torch.pc.configured "${_ddp_torch_pc}")
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/ddp-torch.pc INPUT ${CMAKE_BINARY_DIR}/ddp-torch.pc.configured)
  install(FILES ${CMAKE_BINARY_DIR}/ddp-torch.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
