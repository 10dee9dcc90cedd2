# Default CUDA architectures, decided before project() so that CMake's own default (52)
# never applies: the local GPU's when one is visible, else 90 (H100/H200), so that a
# machine without a GPU still compiles every .cu file for the architecture we run on.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(_ddp_arch 90)
  find_program(_ddp_nvidia_smi nvidia-smi)
  if(_ddp_nvidia_smi)
    execute_process(COMMAND ${_ddp_nvidia_smi} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE _ddp_caps RESULT_VARIABLE _ddp_rc ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_ddp_rc EQUAL 0 AND _ddp_caps MATCHES "^([0-9]+)\\.([0-9]+)")
      set(_ddp_arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
    endif()
  endif()
  set(CMAKE_CUDA_ARCHITECTURES ${_ddp_arch} CACHE STRING "CUDA architectures to build for")
endif()
