# radiance's CMake package version is its plugin ABI number (RAD_ABI_VERSION in rad_abi.h), so a
# project that asks for one fails at configure time, both numbers printed, rather than at dlopen:
#   find_package(radiance 31 REQUIRED)
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../rad_abi.h" _rad_abi_line REGEX "^#define RAD_ABI_VERSION [0-9]+")
string(REGEX REPLACE "^#define RAD_ABI_VERSION ([0-9]+).*" "\\1" PACKAGE_VERSION "${_rad_abi_line}")
if(PACKAGE_FIND_VERSION AND NOT PACKAGE_FIND_VERSION_MAJOR EQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
