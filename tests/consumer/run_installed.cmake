# SPDX-License-Identifier: Apache-2.0
# run(COMMAND...): runs a command as a user of the kiln installed in PREFIX would, with no
# LD_LIBRARY_PATH (what is installed must find its own libraries) and a cache in WORK_DIR; stops
# the script if it fails.
function(run)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
                          KILN_CACHE_DIR=${WORK_DIR}/cache ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${ARGN}")
  endif()
endfunction()
