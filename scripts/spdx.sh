#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Puts the SPDX licence line on the first line of every tracked source file that lacks it (after
# a #! line), in the file's comment style: `// ...` in C and C++ (`/* ... */` where the file
# opens with one), `# ...` in Python, shell and CMake. DLPack's vendored header keeps its own.
# Idempotent: a file with the line in its first three lines is left alone, so it can run again
# after merges. `--check` changes nothing: it names each file that lacks the line and fails
# (exit 77, the test's skip, outside a git work tree).
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1-}" = --check ]; then check=1; fi
if ! git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  echo "spdx.sh: $(pwd) is not a git work tree; nothing to check" >&2
  exit 77
fi
tag="SPDX-License-Identifier: Apache-2.0"
missing=0
while IFS= read -r -d '' file; do
  case "$file" in
    include/kiln/third_party/*) continue ;;
    *.cpp | *.hpp | *.h | *.cuh | *.c)
      if head -n 1 "$file" | grep -q '^/\*'; then line="/* $tag */"; else line="// $tag"; fi ;;
    *.py | *.sh | *.cmake | CMakeLists.txt | */CMakeLists.txt | .ci/run) line="# $tag" ;;
    *) continue ;;
  esac
  if [ ! -s "$file" ] || head -n 3 "$file" | grep -q "$tag"; then continue; fi
  if [ "$check" = 1 ]; then
    echo "$file: no '$tag' in its first three lines (scripts/spdx.sh adds it)"
    missing=1
  elif head -n 1 "$file" | grep -q '^#!'; then
    sed -i "1a $line" "$file"
  else
    sed -i "1i $line" "$file"
  fi
done < <(git ls-files -z -- lib include kernels_src python scripts tests examples bench cmake \
  CMakeLists.txt .ci/run)
exit "$missing"
