# SPDX-License-Identifier: Apache-2.0
# Writes OUTPUT, a C string literal naming the source this build compiles: the commit's short
# hash, "-dirty" when tracked files differ from it, or "unknown" outside a git checkout. Run at
# every build; OUTPUT is rewritten only when the id changes, so an unchanged id rebuilds nothing.
# NOTE: only a checkout whose top is SOURCE_DIR names it: a source tree unpacked inside another
# repository (FetchContent's _deps, an sdist) would otherwise report that repository's commit.
execute_process(
  COMMAND git -C ${SOURCE_DIR} rev-parse --show-toplevel
  OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
if(NOT failed)
  file(REAL_PATH "${top}" top)
  file(REAL_PATH "${SOURCE_DIR}" source)
  if(NOT top STREQUAL source)
    set(failed 1)
  endif()
endif()
if(NOT failed)
  execute_process(
    COMMAND git -C ${SOURCE_DIR} rev-parse --short=12 HEAD
    OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
endif()
if(failed OR commit STREQUAL "")
  set(id "unknown")
else()
  execute_process(COMMAND git -C ${SOURCE_DIR} diff --quiet HEAD -- RESULT_VARIABLE dirty
                  ERROR_QUIET)
  set(id "${commit}")
  if(dirty)
    set(id "${commit}-dirty")
  endif()
endif()
set(text "\"${id}\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUTPUT} "${text}")
endif()
