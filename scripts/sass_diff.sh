#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Whether a change to kernels_src changed the machine code: compiles every spec of a manifest
# (`kiln warm` format) from kernels_src at git revision BASE and from the work tree's, without a
# GPU, and compares the executable sections (.text.*) of each pair of cubins byte for byte.
# Prints a line per spec, `same` or `DIFFERS` with both sides' instructions, registers and spill
# bytes; exits 1 if any differs. With cuobjdump on PATH, each differing pair's SASS is written to
# $SASS_DIFF_OUT (default ./sass_diff) for diff.
#
#   scripts/sass_diff.sh [BASE] [MANIFEST [WORK_MANIFEST]]
#
# BASE defaults to main. MANIFEST defaults to the default warm set for $TARGET (sm_90a); narrow
# it with e.g. `build/bin/kiln warm --list --target sm_90a | grep forward_tma > tma.txt`. The
# Params headers come from the library that compiles: KILN (default build/bin/kiln) for the work
# tree, KILN_BASE (default KILN) for BASE, so a change to include/kiln/params is seen when
# KILN_BASE is a build of BASE. Without MANIFEST each side lists its own default set and the
# pairs are taken line by line, so specs whose text changed (a constant added) still pair up; with
# WORK_MANIFEST too, BASE compiles MANIFEST and the work tree WORK_MANIFEST, paired likewise.
# TARGET overrides the target.
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-main}"
kiln="${KILN:-build/bin/kiln}"
kiln_base="${KILN_BASE:-$kiln}"
target="${TARGET:-sm_90a}"
out="${SASS_DIFF_OUT:-sass_diff}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/base"
git archive "$base" kernels_src | tar -x -C "$work/base"
for side in base work; do
  dir="$work/base/kernels_src" side_kiln="$kiln_base"
  if [ "$side" = work ]; then dir="$PWD/kernels_src" side_kiln="$kiln"; fi
  if [ "$side" = work ] && [ -n "${3-}" ]; then
    cp "$3" "$work/$side.txt"
  elif [ -n "${2-}" ]; then
    cp "$2" "$work/$side.txt"
  else
    "$side_kiln" warm --list --target "$target" > "$work/$side.txt"
  fi
  "$side_kiln" warm --quiet --target "$target" --kernels-dir "$dir" \
    --cache-dir "$work/$side-cache" "$work/$side.txt" > /dev/null
done

python3 - "$work" "$out" <<'EOF'
import json, pathlib, shutil, struct, subprocess, sys

work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])

def entries(cache):
    """spec -> (metadata, cubin) of every entry (layout in lib/cache/entry_file.hpp)."""
    found = {}
    for path in cache.rglob("*.kbin"):
        data = path.read_bytes()
        meta_bytes = struct.unpack_from("<Q", data, 48)[0]
        meta = json.loads(data[56:56 + meta_bytes])
        found[meta["spec"]] = (meta, data[56 + meta_bytes:])
    return found

def text_sections(elf):
    """name -> bytes of every .text.* section of a 64-bit little-endian ELF."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    sections = {}
    for name_at, _, _, _, offset, size in headers:
        name = elf[names + name_at:elf.index(b"\0", names + name_at)].decode()
        if name.startswith(".text."):
            sections[name] = elf[offset:offset + size]
    return sections

def summary(meta, text):
    instructions = sum(len(t) for t in text.values()) // 16  # 16 bytes each on sm_70 and later
    return (f"{instructions} instructions, {meta['registers']} registers, "
            f"{meta['spill_bytes']} spill bytes")

base, work_side = entries(work / "base-cache"), entries(work / "work-cache")
specs = [(work / f"{side}.txt").read_text().split("\n") for side in ("base", "work")]
pairs = [(b, w) for b, w in zip(*specs) if b or w]
if len(specs[0]) != len(specs[1]):
    sys.exit(f"the two sides list {len(specs[0])} and {len(specs[1])} specs: no pairs")
differ = 0
for number, (spec0, spec1) in enumerate(pairs):
    (meta0, elf0), (meta1, elf1) = base[spec0], work_side[spec1]
    spec = spec0 if spec0 == spec1 else f"{spec0}\n      -> {spec1}"
    text0, text1 = text_sections(elf0), text_sections(elf1)
    if text0 == text1:
        print(f"same     {spec}")
        continue
    differ += 1
    print(f"DIFFERS  {spec}\n  base: {summary(meta0, text0)}\n  work: {summary(meta1, text1)}")
    if shutil.which("cuobjdump"):
        out.mkdir(parents=True, exist_ok=True)
        for side, elf in (("base", elf0), ("work", elf1)):
            cubin = work / f"{number}.{side}.cubin"
            cubin.write_bytes(elf)
            sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True,
                                  text=True, check=True).stdout
            (out / f"{number}.{side}.sass").write_text(sass)
        print(f"  diff {out}/{number}.base.sass {out}/{number}.work.sass")
print(f"{len(pairs) - differ} of {len(pairs)} specs have the same code")
sys.exit(1 if differ else 0)
EOF
