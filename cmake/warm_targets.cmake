# SPDX-License-Identifier: Apache-2.0
# The targets that the build's kernel check and scripts/main.sh compile for without a GPU: sm_90a,
# and gfx90a where the kiln command KILN finds hipRTC (scripts/deps.sh installs it only when
# KILN_WITH_HIP=1). With KILN_WITH_HIP=1, as in CI, hipRTC is required: its absence is an error,
# not a quiet NVIDIA-only run. Prints `--target T` arguments for `kiln warm`, or, given WARM (a
# list of kiln warm's other arguments), runs `kiln warm` with them.
execute_process(COMMAND ${KILN} info --json OUTPUT_VARIABLE info RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${KILN} info --json failed (${result})")
endif()
set(hiprtc_found OFF)
string(JSON backends LENGTH "${info}" backends)
math(EXPR last "${backends} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${info}" backends ${i} name)
  if(name STREQUAL "hip")
    string(JSON hiprtc_found GET "${info}" backends ${i} compiler_found)
    string(JSON hiprtc GET "${info}" backends ${i} compiler)
  endif()
endforeach()

set(targets --target sm_90a)
if(hiprtc_found)
  list(APPEND targets --target gfx90a)
elseif("$ENV{KILN_WITH_HIP}" STREQUAL "1")
  message(FATAL_ERROR "KILN_WITH_HIP=1, but kiln finds no hipRTC (${hiprtc}): "
                      "KILN_WITH_HIP=1 bash scripts/deps.sh installs it")
else()
  message(NOTICE "kiln: no hipRTC here, so no gfx90a kernels (KILN_WITH_HIP=1 bash "
                 "scripts/deps.sh installs it)")
endif()

if(DEFINED WARM)
  execute_process(COMMAND ${KILN} warm ${WARM} ${targets} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "kiln warm failed (${result})")
  endif()
else()
  string(JOIN " " line ${targets})
  execute_process(COMMAND ${CMAKE_COMMAND} -E echo "${line}")
endif()
