# SPDX-License-Identifier: Apache-2.0
# Builds the consumer project in SOURCE_DIR with find_package(kiln) against the kiln installed in
# PREFIX and runs it, and its C program again with pkg-config's flags alone; when STRIPPED is
# true, checks that nothing installed kept its debug info; when CLI is true, runs the installed
# `kiln` command too.
include(${CMAKE_CURRENT_LIST_DIR}/run_installed.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G Ninja -DCMAKE_PREFIX_PATH=${PREFIX})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer ${WORK_DIR}/cache)
run(${WORK_DIR}/build/consumer_c)

# The C file's DLPack header must be the installed one, not a copy the system happens to have:
# `deps` lists the headers a build of it read.
function(check_dlpack_from_prefix deps how)
  string(REGEX MATCH "[^\n ]*/dlpack/dlpack.h" dlpack "${deps}")
  cmake_path(IS_PREFIX PREFIX "${dlpack}" NORMALIZE in_prefix)
  if(NOT in_prefix)
    message(FATAL_ERROR "${how}, kiln.h included '${dlpack}', not a dlpack.h installed in ${PREFIX}")
  endif()
endfunction()
find_program(NINJA ninja REQUIRED)
execute_process(COMMAND ${NINJA} -C ${WORK_DIR}/build -t deps CMakeFiles/consumer_c.dir/c_api.c.o
                OUTPUT_VARIABLE deps)
check_dlpack_from_prefix("${deps}" "through find_package(kiln)")

# pkg-config: the same C program built with nothing but `pkg-config --cflags --libs kiln`, whose
# kiln.pc finds the prefix from its own place; DLPack's header must come from the prefix here too.
find_program(PKG_CONFIG pkg-config REQUIRED)
find_program(CC NAMES cc gcc REQUIRED)
file(GLOB_RECURSE pc_file ${PREFIX}/*/pkgconfig/kiln.pc)
if(NOT pc_file)
  message(FATAL_ERROR "no kiln.pc installed in ${PREFIX}")
endif()
cmake_path(GET pc_file PARENT_PATH pc_dir)
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir} ${PKG_CONFIG} --cflags
                        --libs kiln OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE
                        RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs kiln failed (${result})")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
cmake_path(GET pc_dir PARENT_PATH libdir)
run(${CC} ${SOURCE_DIR}/c_api.c ${flags} -Wl,-rpath,${libdir} -MD -MF ${WORK_DIR}/pc.d -o
    ${WORK_DIR}/consumer_pc)
run(${WORK_DIR}/consumer_pc)
file(READ ${WORK_DIR}/pc.d deps)
check_dlpack_from_prefix("${deps}" "with pkg-config's flags")

# What is installed carries no debug info (KILN_INSTALL_STRIP), as a release would.
if(STRIPPED)
  find_program(READELF readelf REQUIRED)
  file(GLOB_RECURSE binaries ${PREFIX}/*/libkiln.so.*.*.* ${PREFIX}/bin/kiln)
  foreach(binary IN LISTS binaries)
    execute_process(COMMAND ${READELF} -S --wide ${binary} OUTPUT_VARIABLE sections)
    if(sections MATCHES "\\.debug_info")
      message(FATAL_ERROR "${binary} was installed with its debug info")
    endif()
  endforeach()
endif()

if(CLI)
  run(${PREFIX}/bin/kiln --version)
  run(${PREFIX}/bin/kiln info)
endif()
