#!/usr/bin/env bash
# tests/cli_install.sh — the installed library, as a C user sees it: `cmake --install` of this
# build into a temporary prefix gives the headers (each compiles alone with -std=c11 -pedantic-errors),
# libtessera.a, libtessera.so with its soname link, bin/tessera, tessera.pc and the CMake package;
# examples/ddp_train.c (and the README's DDP program), built out of the tree against that prefix three ways —
#   pkg-config --cflags --libs tessera             (shared library, run through an rpath)
#   pkg-config --static --libs tessera             (libtessera.a; no libtessera.so needed at run time)
#   find_package(Tessera): Tessera::tessera and Tessera::tessera_static
# — trains for 3 steps on 2 DDP ranks under the installed `tessera run` (without LD_LIBRARY_PATH):
# both ranks start, every rank exits 0 and rank 0 prints a loss or an accuracy.
#
# Only the flags of ddp_train.c's usage line are passed (--data --epochs --max-steps --batch --seed),
# and its output is matched loosely, so the test holds whatever the example becomes.
# usage: cli_install.sh path/to/build/tessera   (run in the build directory)
set -u
TS=${1:?usage: cli_install.sh path/to/tessera}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$(dirname "$TS")" && pwd)
[ -f "$BUILD/CMakeCache.txt" ] || BUILD=$PWD
CC=${CC:-cc}
DATA=/usr/share/datasets/fashion-mnist
for tool in cmake pkg-config "$CC"; do
  command -v "$tool" >/dev/null || { echo "skip: no $tool"; exit 77; }
done
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA (apt-get install dataset-fashion-mnist)"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
P=$T/prefix
. "$(dirname "$0")/testlib.sh"
# DT_NEEDED entries of an ELF file (empty without readelf)
needed() { command -v readelf >/dev/null && readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

# ---- install -------------------------------------------------------------------------------------
if ! cmake --install "$BUILD" --prefix "$P" > "$T/install.log" 2>&1; then
  bad "cmake --install $BUILD --prefix $P: $(cat "$T/install.log")"
  exit 1
fi
pc=$(find "$P" -name tessera.pc -path '*/pkgconfig/*' | head -1)
[ -n "$pc" ] || { bad "no tessera.pc under $P: $(cat "$T/install.log")"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
libdir=$(pkg-config --variable=libdir tessera)
[ "$(pkg-config --variable=prefix tessera)" = "$P" ] && ok "tessera.pc: prefix $P" \
  || bad "tessera.pc names prefix '$(pkg-config --variable=prefix tessera)', not $P"
for f in "$P/bin/tessera" "$P/include/tessera.h" "$libdir/libtessera.a" "$libdir/libtessera.so" \
         "$libdir/cmake/Tessera/TesseraConfig.cmake" "$libdir/cmake/Tessera/TesseraConfigVersion.cmake"; do
  [ -e "$f" ] || bad "not installed: ${f#$T/}"
done
for h in "$SRC"/include/tessera/*.h; do
  [ -f "$P/include/tessera/$(basename "$h")" ] || bad "not installed: include/tessera/$(basename "$h")"
done
if command -v readelf >/dev/null; then
  soname=$(readelf -d "$libdir/libtessera.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ -n "$soname" ] && [ -e "$libdir/$soname" ] && ok "libtessera.so, soname link $soname" \
    || bad "soname '$soname' of libtessera.so is not installed in $libdir"
fi

# ---- every public header compiles on its own -------------------------------------------------------
hdr_bad=0
for h in "$P/include/tessera.h" "$P"/include/tessera/*.h; do
  rel=${h#$P/include/}
  if ! out=$(echo "#include <$rel>" | "$CC" -std=c11 -Wall -Wextra -pedantic-errors -Werror -fsyntax-only \
             $(pkg-config --cflags tessera) -x c - 2>&1); then
    bad "<$rel> alone, -std=c11 -pedantic-errors: $out"; hdr_bad=1
  fi
done
[ $hdr_bad = 0 ] && ok "each installed header compiles alone (-std=c11 -Wall -Wextra -pedantic-errors)"

# ---- build examples/ddp_train.c out of the tree ------------------------------------------------------
EX=$SRC/examples/ddp_train.c
build() { # NAME CMD...: runs CMD, which writes $T/NAME
  local name=$1; shift
  if "$@" > "$T/$name.build.log" 2>&1 && [ -x "$T/$name" ]; then ok "built $name: $*"
  else bad "building $name: $* : $(cat "$T/$name.build.log")"; fi
}
build ddp_pc_shared "$CC" -O2 "$EX" -o "$T/ddp_pc_shared" $(pkg-config --cflags --libs tessera) -Wl,-rpath,"$libdir"
# pkg-config has no "static library" switch: -l:libtessera.a makes the linker take the archive
static_libs=$(pkg-config --static --libs tessera | sed -E 's/(^| )-ltessera( |$)/\1-l:libtessera.a\2/')
build ddp_pc_static "$CC" -O2 "$EX" -o "$T/ddp_pc_static" $(pkg-config --cflags tessera) $static_libs
mkdir -p "$T/consumer"
cat > "$T/consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(tessera_consumer C)
find_package(Tessera 0.1 REQUIRED)
message(STATUS "Tessera_DIR: ${Tessera_DIR}")
add_executable(ddp_cmake_shared ${DDP_SOURCE})
target_link_libraries(ddp_cmake_shared PRIVATE Tessera::tessera)
add_executable(ddp_cmake_static ${DDP_SOURCE})
target_link_libraries(ddp_cmake_static PRIVATE Tessera::tessera_static)
set_target_properties(ddp_cmake_shared ddp_cmake_static PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${OUT_DIR})
EOF
if cmake -S "$T/consumer" -B "$T/consumer/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$P" \
     -DDDP_SOURCE="$EX" -DOUT_DIR="$T" > "$T/consumer.log" 2>&1; then
  grep -q "Tessera_DIR: $P/" "$T/consumer.log" && ok "find_package(Tessera) found the installed copy" \
    || bad "find_package(Tessera) found another copy: $(grep Tessera_DIR "$T/consumer.log")"
  build ddp_cmake_shared cmake --build "$T/consumer/build" --target ddp_cmake_shared
  build ddp_cmake_static cmake --build "$T/consumer/build" --target ddp_cmake_static
else
  bad "find_package(Tessera) project: $(cat "$T/consumer.log")"
fi

# the shared builds load the installed libtessera.so, the static ones no libtessera.so at all
if command -v readelf >/dev/null; then
  for prog in ddp_pc_shared ddp_cmake_shared; do
    [ -x "$T/$prog" ] || continue
    if needed "$T/$prog" | grep -q '^libtessera\.so'; then ok "$prog needs libtessera.so"
    else bad "$prog does not load libtessera.so: $(needed "$T/$prog" | tr '\n' ' ')"; fi
  done
  for prog in ddp_pc_static ddp_cmake_static; do
    [ -x "$T/$prog" ] || continue
    if needed "$T/$prog" | grep -q '^libtessera\.so'; then bad "$prog loads libtessera.so: $(needed "$T/$prog" | tr '\n' ' ')"
    else ok "$prog has libtessera linked in"; fi
  done
fi
if command -v ldd >/dev/null && [ -x "$T/ddp_pc_shared" ]; then
  where=$(env -u LD_LIBRARY_PATH ldd "$T/ddp_pc_shared" | grep 'libtessera\.so')
  case "$where" in *"=> $libdir/"*) ok "ddp_pc_shared loads $libdir's libtessera (rpath)" ;;
                   *) bad "ddp_pc_shared resolves libtessera to: $where" ;; esac
fi

# ---- the README's complete DDP program (the ```c block after <!-- readme-ddp-program -->) ---------------
awk '/<!-- readme-ddp-program -->/{f=1; next} f && /^```c$/{g=1; next} g && /^```$/{exit} g' "$SRC/README.md" > "$T/readme_ddp.c"
if [ -s "$T/readme_ddp.c" ]; then
  build readme_ddp "$CC" -std=c11 -Wall -Wextra -Werror -O2 "$T/readme_ddp.c" -o "$T/readme_ddp" \
    $(pkg-config --cflags --libs tessera) -Wl,-rpath,"$libdir"
  if [ -x "$T/readme_ddp" ]; then
    out=$(cd "$T" && env -u LD_LIBRARY_PATH -u OMP_NUM_THREADS TS_DIST_TIMEOUT=60 "$P/bin/tessera" run -n 2 ./readme_ddp 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && grep -q '^\[rank 0\] epoch 1: loss [0-9.]*, test accuracy [0-9]' <<<"$out"; then
      ok "the README's program trained on 2 ranks: $(grep '^\[rank 0\] epoch 1' <<<"$out")"
    else
      bad "the README's program (exit $rc): $out"
    fi
  fi
else
  bad "no C block after <!-- readme-ddp-program --> in README.md"
fi

# ---- train: 2 ranks, 3 steps, under the installed launcher ----------------------------------------------
# The wrapper shows that each rank started; `tessera run` exits 0 only when every rank did.
cat > "$T/rank.sh" <<'EOF'
#!/bin/sh
echo "rank $RANK of $WORLD_SIZE starting"
exec "$@"
EOF
chmod +x "$T/rank.sh"
for prog in ddp_pc_shared ddp_pc_static ddp_cmake_shared ddp_cmake_static; do
  [ -x "$T/$prog" ] || continue
  out=$(cd "$T" && env -u LD_LIBRARY_PATH OMP_NUM_THREADS=1 TS_DIST_TIMEOUT=60 \
        "$P/bin/tessera" run -n 2 "$T/rank.sh" "./$prog" --data "$DATA" --epochs 1 --max-steps 3 --batch 32 --seed 1 2>&1)
  rc=$?
  if [ $rc -ne 0 ]; then bad "$prog: tessera run -n 2 exited $rc: $out"; continue; fi
  grep -q '^\[rank 0\] rank 0 of 2 starting' <<<"$out" && grep -q '^\[rank 1\] rank 1 of 2 starting' <<<"$out" \
    || { bad "$prog: both ranks did not start: $out"; continue; }
  line=$(grep -iE '^\[rank 0\] .*(loss|accuracy)' <<<"$out" | tail -1)
  if [ -n "$line" ]; then ok "$prog trained on 2 ranks: $line"; else bad "$prog: rank 0 printed no loss or accuracy: $out"; fi
done

cli_summary
