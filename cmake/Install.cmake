# cmake --install: the libraries as ddp::runtime, ddp::device, ddp::collectives, ddp::models,
# ddp::engine (and ddp::models_cuda with CUDA), their headers under include/ddp, the tools in
# bin, and ddpConfig.cmake so that find_package(ddp) gives targets that carry their own
# dependencies (spdlog, zlib, nlohmann-json, cxxopts; CUDA, NCCL, MPI, Gloo as this build found
# them) and DDP_HAVE_* definitions.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_ddp_export_targets ddp_runtime ddp_device ddp_collectives ddp_models ddp_engine)
if(TARGET ddp_models_cuda)
  list(APPEND _ddp_export_targets ddp_models_cuda)
endif()
foreach(target IN LISTS _ddp_export_targets)
  string(REPLACE "ddp_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
endforeach()

install(TARGETS ${_ddp_export_targets} EXPORT ddpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ddprun ddptrain ddpdoctor ddpbench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(folder runtime collectives models engine)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddp
          FILES_MATCHING PATTERN "*.h")
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ddp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)

# What the config needs to find again, and where this build found the header-only parts.
get_target_property(_ddp_json_dirs nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
get_target_property(_ddp_cxxopts_dirs cxxopts::cxxopts INTERFACE_INCLUDE_DIRECTORIES)
set(DDP_CONFIG_JSON_DIRS "${_ddp_json_dirs}")
set(DDP_CONFIG_CXXOPTS_DIRS "${_ddp_cxxopts_dirs}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/ddpConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ddpConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ddpConfig.cmake ${CMAKE_BINARY_DIR}/ddpConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
