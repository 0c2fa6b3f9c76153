# cmake/TesseraInstall.cmake — `cmake --install build --prefix P` (and `make install`):
#
#   P/include/tessera.h, P/include/tessera/*.h         the public headers (the whole directory)
#   P/lib/libtessera.a, libtessera.so{,.0,.0.1.0}       static and shared library
#   P/bin/tessera                                       the command (linked with the static library)
#   P/lib/pkgconfig/tessera.pc                          pkg-config: --libs (shared), --static --libs
#   P/lib/cmake/Tessera/TesseraConfig.cmake, ...        find_package(Tessera): Tessera::tessera (shared),
#                                                       Tessera::tessera_static
#
# ("lib" is CMAKE_INSTALL_LIBDIR: lib64 or lib/<multiarch> on some systems.) What a static link
# needs is computed from what CMake found above — OpenBLAS, OpenMP, zlib, libcrypto, libjpeg, MPI by their
# library paths, libturbojpeg and libspng as the pkg-config modules they were found as — so the
# installed files name the libraries of this machine's build, and nothing else. Both files are
# relocatable: tessera.pc is written at install time with the prefix given to `cmake --install`,
# TesseraConfig.cmake finds the prefix from its own location.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
set(TS_PKGCONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Installed programs and the shared library keep the run paths of libraries found outside the
# linker's default directories (OpenBLAS's OpenMP build, OpenMPI), as in the build tree.
set_target_properties(tessera_shared tessera PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
set_target_properties(tessera_shared PROPERTIES EXPORT_NAME tessera)
set_target_properties(tessera_static PROPERTIES EXPORT_NAME tessera_static)
# Link options this build gives every program (the sanitizers' runtimes under TS_SANITIZE) are
# needed by every program that links the library, shared or static: the package passes them on.
get_directory_property(TS_GLOBAL_LINK_OPTIONS LINK_OPTIONS)
if(TS_GLOBAL_LINK_OPTIONS)
  set_property(TARGET tessera_shared tessera_static APPEND PROPERTY INTERFACE_LINK_OPTIONS ${TS_GLOBAL_LINK_OPTIONS})
endif()
list(JOIN TS_GLOBAL_LINK_OPTIONS " " TS_PC_LINK_OPTIONS)
string(STRIP "-L\${libdir} -ltessera ${TS_PC_LINK_OPTIONS}" TS_PC_LIBS)
# The installed names work in a parent project that uses add_subdirectory(tessera) too.
add_library(Tessera::tessera ALIAS tessera_shared)
add_library(Tessera::tessera_static ALIAS tessera_static)

install(TARGETS tessera_shared tessera_static EXPORT TesseraTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS tessera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}) # Tessera_EXECUTABLE in the package
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

# ---- CMake package -----------------------------------------------------------------------------
install(EXPORT TesseraTargets NAMESPACE Tessera:: DESTINATION ${TS_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesseraConfig.cmake.in
  ${PROJECT_BINARY_DIR}/TesseraConfig.cmake INSTALL_DESTINATION ${TS_CMAKE_DIR})
# 0.x: a minor version may change the API
write_basic_package_version_file(${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/TesseraConfig.cmake ${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
  DESTINATION ${TS_CMAKE_DIR})

# ---- pkg-config --------------------------------------------------------------------------------
# ts_pc_link_flags(out item...): linker flags for library paths and flags. A path
# /dir/libNAME.so (or .a) becomes -lNAME, preceded by -L/dir -Wl,-rpath,/dir when the linker
# would not search /dir by itself; -flags and -lNAME pass through; a bare NAME becomes -lNAME.
# (find modules' "optimized A debug B" lists: A.)
function(ts_pc_link_flags out)
  set(flags "")
  set(skip OFF)
  foreach(item IN LISTS ARGN)
    if(skip OR item STREQUAL "optimized" OR item STREQUAL "general")
      set(skip OFF)
    elseif(item STREQUAL "debug")
      set(skip ON)
    elseif(item MATCHES "^(.*)/lib([^/]+)\\.(so|a)(\\.[0-9.]+)?$")
      set(dir "${CMAKE_MATCH_1}")
      set(name "${CMAKE_MATCH_2}")
      if(NOT dir IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
        list(APPEND flags "-L${dir}" "-Wl,-rpath,${dir}")
      endif()
      list(APPEND flags "-l${name}")
    elseif(item MATCHES "^-")
      separate_arguments(parts UNIX_COMMAND "${item}")
      list(APPEND flags ${parts})
    elseif(item MATCHES "^[A-Za-z0-9_.+-]+$")
      list(APPEND flags "-l${item}")
    elseif(item)
      message(FATAL_ERROR "tessera.pc: do not know how to link '${item}'")
    endif()
  endforeach()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

# What libtessera.a needs, in link order (the pkg-config modules come after, from Requires.private).
set(TS_PC_PRIVATE "")
if(TS_WITH_CUDA)
  ts_pc_link_flags(f ${TS_CUDA_LIBS})
  list(APPEND TS_PC_PRIVATE ${f} -lstdc++)
endif()
if(TS_WITH_DNNL)
  ts_pc_link_flags(f ${DNNL_LIB})
  list(APPEND TS_PC_PRIVATE ${f})
endif()
ts_pc_link_flags(f ${OPENBLAS_LIB})
list(APPEND TS_PC_PRIVATE ${f})
if(TS_WITH_MPI)
  ts_pc_link_flags(f ${MPI_C_LIBRARIES} ${MPI_C_LINK_FLAGS})
  list(APPEND TS_PC_PRIVATE ${f})
endif()
ts_pc_link_flags(f ${JPEG_LIBRARIES} ${ZLIB_LIBRARIES} ${OPENSSL_CRYPTO_LIBRARY})
list(APPEND TS_PC_PRIVATE ${f})
# OpenMP: the compiler flag (-fopenmp links the runtime), then its libraries (gomp, pthread).
set(f "${OpenMP_C_FLAGS}")
foreach(lib IN LISTS OpenMP_C_LIB_NAMES)
  list(APPEND f "${OpenMP_${lib}_LIBRARY}")
endforeach()
ts_pc_link_flags(f ${f} ${CMAKE_THREAD_LIBS_INIT} m)
list(APPEND TS_PC_PRIVATE ${f})
list(REMOVE_DUPLICATES TS_PC_PRIVATE)
list(JOIN TS_PC_PRIVATE " " TS_PC_LIBS_PRIVATE)
set(TS_PC_REQUIRES_PRIVATE "${TURBOJPEG_MODULE_NAME} ${SPNG_MODULE_NAME}")

# tessera.pc is written when installing, with the prefix of that install (cmake --install --prefix):
# configured here leaving @TS_PC_PREFIX@ in place, which the install step replaces (under DESTDIR,
# recorded in install_manifest.txt; nothing is written into the build tree then).
set(TS_PC_PREFIX "@TS_PC_PREFIX@")
configure_file(${PROJECT_SOURCE_DIR}/cmake/tessera.pc.in ${PROJECT_BINARY_DIR}/tessera.pc.in @ONLY)
set(TS_PC_TEMPLATE ${PROJECT_BINARY_DIR}/tessera.pc.in)
string(CONFIGURE [[
  file(READ "@TS_PC_TEMPLATE@" _ts_pc)
  string(REPLACE "@TS_PC_PREFIX@" "${CMAKE_INSTALL_PREFIX}" _ts_pc "${_ts_pc}")
  set(_ts_pc_dir "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/@TS_PKGCONFIG_DIR@")
  message(STATUS "Installing: ${_ts_pc_dir}/tessera.pc")
  file(MAKE_DIRECTORY "${_ts_pc_dir}")
  file(WRITE "${_ts_pc_dir}/tessera.pc" "${_ts_pc}")
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${_ts_pc_dir}/tessera.pc")
]] TS_PC_INSTALL_CODE @ONLY)
install(CODE "${TS_PC_INSTALL_CODE}")
