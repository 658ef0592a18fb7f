# SPDX-License-Identifier: Apache-2.0
# Fails, naming each one, on an #include "..." in lib/ that runs up the layers of the host code:
#   cmake -DSOURCE_DIR=<repo> -P cmake/check_layers.cmake   (ctest: include_layers)
#
# The layers of lib/, bottom to top; a folder includes its own files and those of the layers
# below it, never a higher layer's, nor a folder beside it on its own layer:
#   0 core     errors, logging, specs, targets, tensors, the environment (config), user text
#   1 kernels  one description per kernel: schema, targets, threads and shared memory from the
#              typed config, spec; the tuning tables
#   2 params   each kernel family's Params schema (registry, which lists the kernels)
#     cache    disk storage: entries, tiers, trust, keys, statistics
#     backend  the vendors' compilers and drivers, the compilers' fact memo (stored through an
#              interface of its own, MemoStore, that the runtime wires to the disk cache)
#   3 jit      a spec made a compile unit: kernel sources, unit and key, manifests, the recorder
#   4 runtime  Runtime, the kernel store that joins jit, cache and backend, and the device calls
#              that only the ops make (device_calls.hpp)
#   5 ops      attention, decode, elementwise: arguments -> choose -> spec -> launch
#   6 capi     the C API (lib/capi.cpp)
#     cli      the kiln command
# The public headers (include/kiln/, included as "kiln/...") are the API that every layer may
# read; generated files (build_id.inc) are no layer's.
cmake_minimum_required(VERSION 3.22)

set(layers core kernels params,cache,backend jit runtime ops capi,cli)

# An include that runs up anyway, as "<file>|<include>" below lib/ (none today), each with a
# comment giving its reason and a `// NOTE:` at the include saying the same. An exception that no
# longer occurs fails too, so this list stays true.
set(allowed)

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<kiln repository> -P check_layers.cmake")
endif()
set(lib ${SOURCE_DIR}/lib)

set(level 0)
foreach(layer IN LISTS layers)
  string(REPLACE "," ";" folders "${layer}")
  foreach(folder IN LISTS folders)
    set(level_of_${folder} ${level})
  endforeach()
  math(EXPR level "${level} + 1")
endforeach()

# The folder a path below lib/ belongs to: its first component, or a loose file's stem (capi).
function(folder_of path out)
  if(path MATCHES "^([^/]+)/")
    set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
  else()
    get_filename_component(stem ${path} NAME_WE)
    set(${out} ${stem} PARENT_SCOPE)
  endif()
endfunction()

file(GLOB_RECURSE sources RELATIVE ${lib} ${lib}/*.cpp ${lib}/*.hpp ${lib}/*.h)
list(SORT sources)
set(problems)
set(seen)
foreach(source IN LISTS sources)
  folder_of(${source} from)
  if(NOT DEFINED level_of_${from})
    list(APPEND problems "lib/${source}: its folder '${from}' is in no layer: add it to the map")
    continue()
  endif()
  file(STRINGS ${lib}/${source} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"([^\"]+)\"" _ "${line}")
    set(included ${CMAKE_MATCH_1})
    if(NOT EXISTS ${lib}/${included})
      continue()  # a public header or a generated file
    endif()
    folder_of(${included} to)
    if(to STREQUAL from)
      continue()
    endif()
    if(NOT DEFINED level_of_${to})
      list(APPEND problems "lib/${source} includes \"${included}\", of '${to}', in no layer")
    elseif(level_of_${to} GREATER_EQUAL level_of_${from})
      if("${source}|${included}" IN_LIST allowed)
        list(APPEND seen "${source}|${included}")
        continue()
      endif()
      if(level_of_${to} EQUAL level_of_${from})
        set(why "a folder beside it on layer ${level_of_${from}}")
      else()
        set(why "layer ${level_of_${to}}, above its own ${level_of_${from}}")
      endif()
      list(APPEND problems
           "lib/${source} (${from}) includes \"${included}\" (${to}): ${why}")
    endif()
  endforeach()
endforeach()

foreach(exception IN LISTS allowed)
  if(NOT exception IN_LIST seen)
    list(APPEND problems "${exception}: allowed, but no longer included: take it off the list")
  endif()
endforeach()

list(LENGTH problems count)
if(count GREATER 0)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "${count} problem(s) with the layers of lib/ (the map at the top of "
                      "cmake/check_layers.cmake says which folder sits where):\n  ${text}")
endif()
list(LENGTH sources files)
list(LENGTH seen exceptions)
message(STATUS "include layers: ${files} files of lib/, no include runs up (${exceptions} allowed)")
