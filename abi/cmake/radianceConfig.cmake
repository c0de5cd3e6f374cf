# radiance's CMake package: build plugins against the installed abi/ headers, linking nothing of
# radiance's (the specification's "Build, install, search path"). `rad-config --cmakedir` prints this
# folder; point find_package at it with -Dradiance_DIR=... or CMAKE_PREFIX_PATH.
#
#   cmake_minimum_required(VERSION 3.21)
#   project(mykernels LANGUAGES C CXX)
#   find_package(radiance REQUIRED)        # or find_package(radiance 31 REQUIRED): the ABI number
#   rad_plugin_defaults()                  # C11/C++20, PIC, an optimising build unless asked otherwise
#   rad_add_plugin(mykernels kernels SOURCES rows.cpp HIP_SOURCES kernels.hip)
#
# Sets RADIANCE_ABI_VERSION, RADIANCE_INCLUDE_DIR, RADIANCE_HOME (the home of this radiance: the
# installed in-tree plugins), RADIANCE_KERNELS_DIR, RADIANCE_ARCHITECTURES_DIR,
# RADIANCE_QUANTIZERS_DIR, and the target radiance::abi (the headers). `cmake --install` puts a
# plugin in RAD_PLUGIN_INSTALL_HOME/<kind>; that is RADIANCE_HOME unless -DRAD_PLUGIN_INSTALL_HOME (or
# the environment variable of that name at configure time) says another home.
#
# HIP_SOURCES are device code in the HIP-flavoured C++ that nvcc, hipcc, nvrtc and hiprtc all take
# (no headers of their own beyond local ones). They are built into code objects the plugin carries
# (rad_code_objects.h declares the table; rad_stream.h's rad_code_object_for picks one):
#   RAD_CUDA_ARCHS   e.g. "90;100": a cubin each, by nvcc (RAD_NVCC), with CUDA_OPTIONS
#   RAD_GPU_TARGETS  e.g. "gfx90a;gfx1030" (else GPU_TARGETS): a code object each, by hipcc
#                    (RAD_HIPCC, HIP_PLATFORM=amd, -include hip/hip_runtime.h), with HIP_OPTIONS
#   RAD_DEVICE_SOURCE (ON): the source itself, local includes inlined, which the engine compiles at
#                    run time (nvrtc, hiprtc) for a card the build did not target
# every one with -O3 and, outside Debug, -DNDEBUG; AMD code objects uncompressed. The plugin's
# RAD_BUILD_TARGET macro names what it carries: "host", each target, "cuda hip" for the source, and
# RAD_BUILD_TARGET_EXTRA (for tests: "fake", the engine's stand-in card, which takes the source).
include_guard(GLOBAL)

get_filename_component(RADIANCE_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(_RAD_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
file(STRINGS "${RADIANCE_INCLUDE_DIR}/rad_abi.h" _rad_abi_line REGEX "^#define RAD_ABI_VERSION [0-9]+")
string(REGEX REPLACE "^#define RAD_ABI_VERSION ([0-9]+).*" "\\1" RADIANCE_ABI_VERSION "${_rad_abi_line}")
if(NOT RADIANCE_ABI_VERSION MATCHES "^[0-9]+$")
  message(FATAL_ERROR "radiance: no RAD_ABI_VERSION in ${RADIANCE_INCLUDE_DIR}/rad_abi.h")
endif()
# abi/ and plugins/ sit side by side in the source tree and in the installed package (radiance/abi,
# radiance/plugins): the home this radiance loads last.
get_filename_component(RADIANCE_HOME "${RADIANCE_INCLUDE_DIR}/../plugins" ABSOLUTE)
set(RADIANCE_KERNELS_DIR "${RADIANCE_HOME}/kernels")
set(RADIANCE_ARCHITECTURES_DIR "${RADIANCE_HOME}/architectures")
set(RADIANCE_QUANTIZERS_DIR "${RADIANCE_HOME}/quantizers")

if(DEFINED ENV{RAD_PLUGIN_INSTALL_HOME} AND NOT "$ENV{RAD_PLUGIN_INSTALL_HOME}" STREQUAL "")
  set(_rad_install_home "$ENV{RAD_PLUGIN_INSTALL_HOME}")
else()
  set(_rad_install_home "${RADIANCE_HOME}")
endif()
set(RAD_PLUGIN_INSTALL_HOME "${_rad_install_home}" CACHE PATH "the home cmake --install puts radiance plugins in")
set(RAD_CUDA_ARCHS "" CACHE STRING "NVIDIA architectures to build cubins for (e.g. 90;100)")
set(RAD_GPU_TARGETS "${GPU_TARGETS}" CACHE STRING "AMD targets to build code objects for (e.g. gfx90a;gfx1030)")
option(RAD_DEVICE_SOURCE "carry the device source for the engine to compile at run time" ON)
set(RAD_BUILD_TARGET_EXTRA "" CACHE STRING "more words for the plugin's build_target")

if(NOT TARGET radiance::abi)
  add_library(radiance::abi INTERFACE IMPORTED)
  set_target_properties(radiance::abi PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${RADIANCE_INCLUDE_DIR}")
endif()

macro(rad_plugin_defaults)
  if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
    set(CMAKE_BUILD_TYPE Release CACHE STRING "the build type" FORCE)
  endif()
  set(CMAKE_C_STANDARD 11)
  set(CMAKE_C_STANDARD_REQUIRED ON)
  set(CMAKE_CXX_STANDARD 20)
  set(CMAKE_CXX_STANDARD_REQUIRED ON)
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
endmacro()

function(_rad_device_objects name unity depends out_objects out_targets)
  set(objects "")
  set(targets "")
  set(ndebug "$<$<NOT:$<CONFIG:Debug>>:-DNDEBUG>")
  if(RAD_CUDA_ARCHS)
    find_program(RAD_NVCC nvcc HINTS "$ENV{CUDA_HOME}/bin" /usr/local/cuda/bin REQUIRED)
    foreach(arch IN LISTS RAD_CUDA_ARCHS)
      set(cubin "${CMAKE_CURRENT_BINARY_DIR}/${name}.sm_${arch}.cubin")
      add_custom_command(OUTPUT "${cubin}"
        COMMAND "${RAD_NVCC}" -x cu -cubin -arch=sm_${arch} -O3 ${ndebug} ${ARGN_CUDA} -o "${cubin}" "${unity}"
        DEPENDS ${depends} COMMENT "nvcc: ${name} for sm_${arch}" COMMAND_EXPAND_LISTS VERBATIM)
      list(APPEND objects "sm_${arch}=${cubin}")
      list(APPEND targets "sm_${arch}")
    endforeach()
  endif()
  if(RAD_GPU_TARGETS)
    find_program(RAD_HIPCC hipcc HINTS "$ENV{ROCM_PATH}/bin" /opt/rocm/bin REQUIRED)
    foreach(gfx IN LISTS RAD_GPU_TARGETS)
      set(code "${CMAKE_CURRENT_BINARY_DIR}/${name}.${gfx}.hsaco")
      add_custom_command(OUTPUT "${code}"
        COMMAND "${CMAKE_COMMAND}" -E env HIP_PLATFORM=amd "${RAD_HIPCC}" --genco --offload-arch=${gfx}
                -include hip/hip_runtime.h -O3 ${ndebug} ${ARGN_HIP} -o "${code}" "${unity}"
        DEPENDS ${depends} COMMENT "hipcc: ${name} for ${gfx}" COMMAND_EXPAND_LISTS VERBATIM)
      list(APPEND objects "${gfx}=${code}")
      list(APPEND targets "${gfx}")
    endforeach()
  endif()
  if(RAD_DEVICE_SOURCE)
    list(APPEND objects "source=${unity}")
    list(APPEND targets cuda hip)
  endif()
  set(${out_objects} "${objects}" PARENT_SCOPE)
  set(${out_targets} "${targets}" PARENT_SCOPE)
endfunction()

# rad_add_plugin(name kernels|architectures|quantizers SOURCES ... [HIP_SOURCES ...]
#                [HIP_OPTIONS ...] [CUDA_OPTIONS ...])
function(rad_add_plugin name kind)
  cmake_parse_arguments(PARSE_ARGV 2 RAD "" "" "SOURCES;HIP_SOURCES;HIP_OPTIONS;CUDA_OPTIONS")
  if(NOT kind MATCHES "^(kernels|architectures|quantizers)$")
    message(FATAL_ERROR "rad_add_plugin(${name} ${kind}): the kind is kernels, architectures or quantizers "
                        "(the folder of a home the engine loads it from)")
  endif()
  if(NOT RAD_SOURCES)
    message(FATAL_ERROR "rad_add_plugin(${name}): no SOURCES (the exports and the host rows)")
  endif()
  if(RAD_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "rad_add_plugin(${name}): unknown arguments ${RAD_UNPARSED_ARGUMENTS}")
  endif()
  add_library(${name} MODULE ${RAD_SOURCES})
  set_target_properties(${name} PROPERTIES PREFIX "" SUFFIX ".so" POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(${name} PRIVATE radiance::abi)
  # a helper called without rad_plugin.h would pass its float as a double: refuse to build that
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:C>:-Werror=implicit-function-declaration>)
  set(targets host)
  if(RAD_HIP_SOURCES)
    set(generated "${CMAKE_CURRENT_BINARY_DIR}/${name}_generated")
    set(unity "${generated}/${name}_device.hip")
    set(unity_text "")
    set(depends "${_RAD_CMAKE_DIR}/rad_embed.cmake")
    foreach(source IN LISTS RAD_HIP_SOURCES)
      get_filename_component(source "${source}" ABSOLUTE)
      get_filename_component(folder "${source}" DIRECTORY)
      file(GLOB headers "${folder}/*.h" "${folder}/*.hpp" "${folder}/*.cuh")
      list(APPEND depends "${source}" ${headers})
      string(APPEND unity_text "#include \"${source}\"\n")
    endforeach()
    file(WRITE "${unity}.in" "${unity_text}")
    configure_file("${unity}.in" "${unity}" COPYONLY)
    set(ARGN_CUDA ${RAD_CUDA_OPTIONS})
    set(ARGN_HIP ${RAD_HIP_OPTIONS})
    _rad_device_objects(${name} "${unity}" "${depends}" objects device_targets)
    list(APPEND targets ${device_targets})
    set(files "")
    foreach(object IN LISTS objects)
      string(REGEX REPLACE "^[^=]*=" "" file "${object}")
      list(APPEND files "${file}")
    endforeach()
    file(WRITE "${generated}/rad_code_objects.h"
      "/* generated by rad_add_plugin: the code objects ${name} carries (rad_stream.h) */\n"
      "#pragma once\n#include \"rad_stream.h\"\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
      "extern __attribute__((visibility(\"hidden\"))) const RadCodeObject rad_code_objects[];\n"
      "extern __attribute__((visibility(\"hidden\"))) const int32_t rad_code_object_count;\n"
      "#ifdef __cplusplus\n}\n#endif\n")
    string(REPLACE ";" "|" objects_arg "${objects}")
    add_custom_command(OUTPUT "${generated}/${name}_code_objects.c"
      COMMAND "${CMAKE_COMMAND}" "-DOUTPUT=${generated}/${name}_code_objects.c" "-DOBJECTS=${objects_arg}"
              -P "${_RAD_CMAKE_DIR}/rad_embed.cmake"
      DEPENDS ${files} ${depends} COMMENT "embedding ${name}'s code objects" VERBATIM)
    target_sources(${name} PRIVATE "${generated}/${name}_code_objects.c")
    get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
    if(NOT "C" IN_LIST languages)  # valid C and C++ alike
      set_source_files_properties("${generated}/${name}_code_objects.c" PROPERTIES LANGUAGE CXX)
    endif()
    target_include_directories(${name} PRIVATE "${generated}")
  endif()
  list(APPEND targets ${RAD_BUILD_TARGET_EXTRA})
  list(REMOVE_DUPLICATES targets)
  string(REPLACE ";" " " targets "${targets}")
  target_compile_definitions(${name} PRIVATE "RAD_BUILD_TARGET=\"${targets}\"")
  install(TARGETS ${name} LIBRARY DESTINATION "${RAD_PLUGIN_INSTALL_HOME}/${kind}")
  message(STATUS "radiance plugin ${name} (${kind}, ABI ${RADIANCE_ABI_VERSION}): builds for '${targets}', "
                 "installs into ${RAD_PLUGIN_INSTALL_HOME}/${kind}")
endfunction()
