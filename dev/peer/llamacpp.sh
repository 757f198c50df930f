# llamacpp.sh: sourced by llamacpp-cpu.sh and llamacpp-gpu.sh.
#
# llamacpp_build WORK BUNDLE CMAKE_FLAGS...: llama.cpp's source in WORK/llama.cpp (the release that the npm
# package node-llama-cpp ships as llama/gitRelease.bundle: npm pack, then a clone of the bundle; or BUNDLE
# where given: that git bundle, or a .tar.xz of the source tree, as trim-src.sh makes for the device's carry),
# built (Release, llama-bench and llama-quantize) with the extra cmake flags, unless already there.
llamacpp_build() {
	local work=$1 bundle=$2 lc=$1/llama.cpp
	shift 2
	if [ ! -d "$lc" ]; then
		if [ -z "$bundle" ]; then
			(cd "$work" && npm pack node-llama-cpp >/dev/null && tar xzf node-llama-cpp-*.tgz)
			bundle=$work/package/llama/gitRelease.bundle
		fi
		case $bundle in
		*.tar.xz) mkdir -p "$lc" && tar -C "$lc" -xJf "$bundle" ;;
		*) git clone -q "$bundle" "$lc" ;;
		esac
	fi
	if [ ! -x "$lc/build/bin/llama-bench" ] || [ ! -x "$lc/build/bin/llama-quantize" ]; then
		cmake -S "$lc" -B "$lc/build" -DCMAKE_BUILD_TYPE=Release "$@" \
			-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
			-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >/dev/null
		cmake --build "$lc/build" -j"$(nproc)" --target llama-bench llama-quantize >/dev/null
	fi
}

# manifold_bins REPO WORK BIN: prints the folder holding `bench` and `mkgguf`: BIN where given, else
# WORK/bin after building them from REPO.
manifold_bins() {
	if [ -n "$3" ]; then
		echo "$3"
		return
	fi
	mkdir -p "$2/bin"
	(cd "$1" && CGO_ENABLED=0 go build -o "$2/bin/" ./cmd/bench ./dev/peer/mkgguf)
	echo "$2/bin"
}
