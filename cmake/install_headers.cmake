# cmake --install's step for ddp's headers (cmake/Install.cmake sets DDP_SOURCE_DIR,
# DDP_INSTALL_HEADERS, the public headers and what they include, and DDP_INCLUDEDIR): each is
# written under PREFIX/include/ddp with its includes of ddp's own headers made <ddp/...>, so
# that they are found beside it whatever else is on a program's include path.
foreach(header IN LISTS DDP_INSTALL_HEADERS)
  file(READ "${DDP_SOURCE_DIR}/${header}" text)
  string(REGEX REPLACE "#include \"((collectives|dist|engine|models|runtime|launcher|torch)/[^\"]+)\""
                       "#include <ddp/\\1>" text "${text}")
  string(REGEX REPLACE "^include/ddp/" "" relative "${header}")
  set(destination "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${DDP_INCLUDEDIR}/ddp/${relative}")
  if(EXISTS "${destination}")
    file(READ "${destination}" installed)
    if(installed STREQUAL text)
      message(STATUS "Up-to-date: ${destination}")
      continue()
    endif()
  endif()
  message(STATUS "Installing: ${destination}")
  file(WRITE "${destination}" "${text}")
endforeach()
