# install.cmake — `cmake --install build --prefix P` installs libtfuse as a C
# library is installed (docs/c-api.md, "Embedding"):
#
#   P/lib/libtfuse.so.0.x.y (soname libtfuse.so.0) and its links
#   P/lib/libtfuse.a             every object of libtfuse: the runtime and the
#                                internal libraries (ir, frontend, passes,
#                                codegen, llvm, cuda runtime, cache), one archive
#   P/include/tfuse.h, tfuse_settings.def (the settings table it includes)
#   P/lib/pkgconfig/tfuse.pc     the shared library; its own dependencies in
#                                Libs.private for `pkg-config --static`
#   P/lib/cmake/tfuse/           find_package(tfuse): tfuse::tfuse (shared),
#                                tfuse::tfuse_static (the archive and its
#                                dependencies), the version file
#   P/bin/tfuse                  the command, finding libtfuse in ../lib
#
# The .pc and the CMake files locate the prefix relative to themselves, so an
# installed tree may be moved. The version comes from TFUSE_VERSION in
# include/tfuse.h, the one place it is written; the soname carries the major
# number. tests/cli/test_install.sh installs into a temporary prefix and
# builds examples/embed.c all three ways.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

file(STRINGS ${CMAKE_SOURCE_DIR}/include/tfuse.h _tfuse_version_line REGEX "^#define TFUSE_VERSION \"")
if(NOT _tfuse_version_line MATCHES "\"([0-9]+)\\.([0-9]+)\\.([0-9]+)\"")
  message(FATAL_ERROR "include/tfuse.h: no TFUSE_VERSION \"MAJOR.MINOR.PATCH\" line")
endif()
set(TFUSE_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")
set(TFUSE_SOVERSION "${CMAKE_MATCH_1}")
set_target_properties(tfuse PROPERTIES VERSION ${TFUSE_VERSION} SOVERSION ${TFUSE_SOVERSION})

# The complete archive: the objects of tfuse_static and of every internal
# static library it links, so that a program links one libtfuse.a (plus the
# system libraries below) and finds every symbol.
set(_tfuse_parts tfuse_static tfuse_frontend tfuse_passes tfuse_codegen tfuse_ir tfuse_cuda_rt tfuse_cache)
if(TFUSE_WITH_LLVM)
  list(APPEND _tfuse_parts tfuse_llvm)
endif()
set(_tfuse_objects "")
foreach(t ${_tfuse_parts})
  list(APPEND _tfuse_objects $<TARGET_OBJECTS:${t}>)
endforeach()
add_library(tfuse_archive STATIC ${_tfuse_objects})
set_target_properties(tfuse_archive PROPERTIES OUTPUT_NAME tfuse LINKER_LANGUAGE C)

# What a program linking libtfuse.a must link too: LLVM, oneDNN
# with its OpenMP, as this build was configured (by full path: LLVM's
# library directory has a libgomp.so of its own, LLVM's OpenMP, which a
# -L there would put in the place of the libgomp oneDNN uses), then dl,
# pthread, m. As libraries for the CMake package, as flags for tfuse.pc.
set(_tfuse_deps_cm "")
if(TFUSE_WITH_LLVM)
  set(_llvm_dirs "")
  foreach(f ${TFUSE_LLVM_LINK})
    if(f MATCHES "^-L(.+)")
      list(APPEND _llvm_dirs "${CMAKE_MATCH_1}")
    elseif(f MATCHES "^-l(.+)")
      set(_name "${CMAKE_MATCH_1}")
      find_library(_tfuse_dep_lib NAMES ${_name} HINTS ${_llvm_dirs} NO_CACHE)
      if(NOT _tfuse_dep_lib)
        message(FATAL_ERROR "tfuse: llvm-config names -l${_name}, which is not found")
      endif()
      list(APPEND _tfuse_deps_cm "${_tfuse_dep_lib}")
      unset(_tfuse_dep_lib)
    else()
      list(APPEND _tfuse_deps_cm "${f}")
    endif()
  endforeach()
endif()
# OpenBLAS is opened at run time (runtime/cpu/cpu_ops.c): nothing to link
if(TFUSE_WITH_ONEDNN)
  list(APPEND _tfuse_deps_cm "${TFUSE_DNNL_LIB}")
  foreach(l ${OpenMP_C_LIBRARIES})
    if(NOT l MATCHES "pthread")   # named below
      list(APPEND _tfuse_deps_cm "${l}")
    endif()
  endforeach()
endif()
list(APPEND _tfuse_deps_cm ${CMAKE_DL_LIBS} pthread m)
set(_tfuse_deps_pc "")
foreach(l ${_tfuse_deps_cm})
  if(IS_ABSOLUTE "${l}" OR l MATCHES "^-")
    list(APPEND _tfuse_deps_pc "${l}")
  else()
    list(APPEND _tfuse_deps_pc "-l${l}")
  endif()
endforeach()
# A sanitized libtfuse (TFUSE_SANITIZE) runs only in a sanitized program.
set(TFUSE_PC_LINK_FLAGS "")
set(TFUSE_CM_LINK_OPTIONS "")
if(TFUSE_SANITIZE)
  set(TFUSE_PC_LINK_FLAGS " -fsanitize=address,undefined")
  set(TFUSE_CM_LINK_OPTIONS "-fsanitize=address,undefined")
endif()
list(JOIN _tfuse_deps_pc " " TFUSE_PC_LIBS_PRIVATE)
set(TFUSE_CM_STATIC_DEPS "${_tfuse_deps_cm}")

# The prefix as seen from the .pc file's directory.
file(RELATIVE_PATH TFUSE_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
string(REGEX REPLACE "/$" "" TFUSE_PC_TO_PREFIX "${TFUSE_PC_TO_PREFIX}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/tfuse.pc.in ${CMAKE_BINARY_DIR}/install/tfuse.pc @ONLY)
set(TFUSE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tfuse)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/tfuseConfig.cmake.in ${CMAKE_BINARY_DIR}/install/tfuseConfig.cmake
                              INSTALL_DESTINATION ${TFUSE_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/install/tfuseConfigVersion.cmake VERSION ${TFUSE_VERSION}
                                 COMPATIBILITY SameMajorVersion)

install(TARGETS tfuse LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TFUSE_WITH_LLVM)   # beside libtfuse.so, where codegen/llvm_lazy.c looks for it
  install(TARGETS tfuse_llvm_module LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(TARGETS tfuse_archive ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/tfuse.h ${CMAKE_SOURCE_DIR}/include/tfuse_settings.def
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_BINARY_DIR}/install/tfuse.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(FILES ${CMAKE_BINARY_DIR}/install/tfuseConfig.cmake ${CMAKE_BINARY_DIR}/install/tfuseConfigVersion.cmake
        DESTINATION ${TFUSE_CMAKE_DIR})
set_target_properties(tfuse_cli PROPERTIES INSTALL_RPATH "\$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
install(TARGETS tfuse_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${CMAKE_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})
