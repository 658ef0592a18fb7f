# SPDX-License-Identifier: Apache-2.0
# Checks every code block of README (see blocks.cpp): builds the C and C++ blocks against the kiln
# installed in PREFIX and runs them; for each shell command, checks that what it names exists;
# compiles the Python blocks.
include(${CMAKE_CURRENT_LIST_DIR}/../consumer/run_installed.cmake)
file(REMOVE_RECURSE ${WORK_DIR})

# A C or C++ block, built as readme_L<its first line>: it must exit 0.
function(check_program name)
  run(${WORK_DIR}/build/${name})
endfunction()

# A shell command: `bash FILE` needs FILE in the source tree, parsing; `kiln SUBCOMMAND...` (any
# path ending in kiln) needs the installed kiln to print SUBCOMMAND's usage for --help; anything
# else must be a program on PATH.
function(check_command where program)
  if(program STREQUAL "bash")
    set(script ${SOURCE_DIR}/${ARGV2})
    execute_process(COMMAND bash -n ${script} RESULT_VARIABLE result)
    set(what "bash -n ${script}")
  elseif(program MATCHES "(^|/)kiln$")
    set(subcommands "")
    foreach(word IN LISTS ARGN)
      if(NOT word MATCHES "^[a-z]+$")
        break()
      endif()
      list(APPEND subcommands ${word})
    endforeach()
    # CLI11 answers `--help` for an unknown subcommand with the parent's help: check whose it is.
    string(JOIN " " usage kiln ${subcommands})
    set(what "${usage} --help")
    execute_process(COMMAND ${PREFIX}/bin/kiln ${subcommands} --help RESULT_VARIABLE result
                    OUTPUT_VARIABLE help)
    if(result EQUAL 0 AND NOT help MATCHES "Usage: ${usage} ")
      set(result "printed no usage of `${usage}`")
    endif()
  else()
    find_program(found_${program} ${program})
    set(result 0)
    if(NOT found_${program})
      set(result "not found")
    endif()
    set(what "${program} on PATH")
  endif()
  if(NOT result EQUAL 0)
    message(SEND_ERROR "${where}: ${what}: ${result}")
  endif()
endfunction()

# A Python block: it must compile.
function(check_python where file)
  find_program(PYTHON3 python3 REQUIRED)
  execute_process(COMMAND ${PYTHON3} -m py_compile ${file} RESULT_VARIABLE result
                  ERROR_VARIABLE error)
  if(NOT result EQUAL 0)
    message(SEND_ERROR "${where}: python3 -m py_compile: ${error}")
  endif()
endfunction()

run(${EXTRACT} ${README} ${CMAKE_CURRENT_LIST_DIR} ${WORK_DIR})
run(${CMAKE_COMMAND} -S ${WORK_DIR} -B ${WORK_DIR}/build -G Ninja -DCMAKE_PREFIX_PATH=${PREFIX})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -- -k 0)  # every block's errors, not the first's
include(${WORK_DIR}/checks.cmake)
