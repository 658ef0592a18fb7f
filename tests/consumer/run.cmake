# Builds the consumer project in SOURCE_DIR with find_package(kiln) against the kiln installed in
# PREFIX and runs it; when CLI is true, runs the installed `kiln` command too.
include(${CMAKE_CURRENT_LIST_DIR}/run_installed.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G Ninja -DCMAKE_PREFIX_PATH=${PREFIX})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer ${WORK_DIR}/cache)
run(${WORK_DIR}/build/consumer_c)

# The C file's <dlpack/dlpack.h> must be the installed one, not a copy the system happens to have.
find_program(NINJA ninja REQUIRED)
execute_process(COMMAND ${NINJA} -C ${WORK_DIR}/build -t deps CMakeFiles/consumer_c.dir/c_api.c.o
                OUTPUT_VARIABLE deps)
string(REGEX MATCH "[^\n ]*/dlpack/dlpack.h" dlpack "${deps}")
cmake_path(IS_PREFIX PREFIX "${dlpack}" NORMALIZE in_prefix)
if(NOT in_prefix)
  message(FATAL_ERROR "kiln.h included '${dlpack}', not a dlpack.h installed in ${PREFIX}")
endif()

if(CLI)
  run(${PREFIX}/bin/kiln --version)
  run(${PREFIX}/bin/kiln info)
endif()
