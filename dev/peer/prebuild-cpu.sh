#!/usr/bin/env bash
# prebuild-cpu.sh SOURCE OUT.tar.xz [JOBS]: llama.cpp's llama-bench and
# llama-quantize for any x86-64 CPU, built once here so that the device need
# not build them (cpu16.sh -p OUT.tar.xz): GGML_BACKEND_DL with
# GGML_CPU_ALL_VARIANTS, one libggml-cpu-<variant>.so per ISA level (x64,
# sse42, ..., haswell, skylakex, icelake, cooperlake, zen4, sapphirerapids),
# of which ggml loads the best that the CPU runs at start, from the
# executable's folder. RPATH $ORIGIN, stripped, libgomp, libstdc++ and
# libgcc_s beside them: the folder runs wherever it is unpacked, without a
# compiler.
#
# SOURCE: trim-src.sh's tarball (built in a temporary folder), or a llama.cpp
# source tree (built in SOURCE/build, kept: a rerun only packs). OUT unpacks
# to one folder, llama.cpp-cpu-prebuilt/, with BUILD-INFO.txt (its first line
# names the source: REV=de3ff81 in the environment where SOURCE has no git).
# JOBS: make -j (default: nproc). 5.0 MB for de3ff81; 10 minutes on 2 cores.
set -euo pipefail
src=$1 out=$(cd "$(dirname "$2")" && pwd)/$(basename "$2") jobs=${3:-$(nproc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -d "$src" ]; then
	lc=$(cd "$src" && pwd) build=$lc/build
else
	lc=$tmp/src build=$tmp/build && mkdir -p "$lc" && tar -C "$lc" -xJf "$src"
fi
flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON
	-DBUILD_SHARED_LIBS=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
	-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN')
cmake -S "$lc" -B "$build" "${flags[@]}" >/dev/null
cmake --build "$build" -j"$jobs" --target llama-bench llama-quantize >/dev/null
pkg=$tmp/llama.cpp-cpu-prebuilt
mkdir -p "$pkg"
# The executables, the shared libraries under their SONAMEs (what the loader asks for) and the CPU variants
# (MODULEs, unversioned: ggml scans for libggml-cpu-*.so).
b=$build/bin
cp "$b/llama-bench" "$b/llama-quantize" "$b"/libggml-cpu-*.so "$pkg/"
for f in "$b/llama-bench" "$b/llama-quantize" "$b"/lib*.so; do
	for so in $(readelf -d "$f" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
		[ -e "$b/$so" ] && cp -L "$b/$so" "$pkg/$so"
	done
done
# libgomp (OpenMP), libstdc++ and libgcc_s of this compiler for a machine without it (or with an older one);
# glibc is taken as there (2.34 or later for a Debian 12 build).
for so in libgomp.so.1 libstdc++.so.6 libgcc_s.so.1; do cp -L "$(g++ -print-file-name=$so)" "$pkg/"; done
strip --strip-unneeded "$pkg"/*
{
	echo "llama.cpp ${REV:-$(git -C "$lc" log --oneline -1 2>/dev/null || echo "from $(basename "$src")")}"
	echo "built $(date -u +%FT%TZ) with $(g++ --version | head -1), cmake ${flags[*]}"
	echo "CPU variants: $(cd "$pkg" && ls libggml-cpu-*.so | sed 's/libggml-cpu-\(.*\)\.so/\1/' | tr '\n' ' ')"
} >"$pkg/BUILD-INFO.txt"
tar -C "$tmp" -cf - llama.cpp-cpu-prebuilt | xz -9 -T"$jobs" >"$out"
ls -l "$out"
