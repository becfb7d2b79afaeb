#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (Gloo, PyTorch) for the installed torch: `make horovod` runs this.
#
# Horovod's last release, 0.28.1 (2023), does not compile against torch >= 2.1: its two CMakeLists.txt
# files ask for C++14, and torch's headers stop with "#error C++17 or later compatible compiler is
# required to use PyTorch". Upstream raised the standard to C++17 in its repository after that release
# ("Compile using C++17 when using PyTorch 2.1", horovod/horovod#3998) but never released it. This
# script applies exactly that change to the source package from the registry and nothing else, builds
# a wheel with Gloo (no MPI, TensorFlow or MXNet), caches it per torch version, and installs it. A
# second run installs the cached wheel at once.
#
# Usage: tools/build_horovod.sh PYTHON CACHE_DIR   (needs g++ and cmake; Debian: apt-get install g++ cmake)
set -euo pipefail
python=$1
cache=$2
version=0.28.1
torch_version=$("$python" -c "import torch; print(torch.__version__)")
wheels="$cache/torch-$torch_version"
wheel=$(ls "$wheels"/horovod-"$version"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    for tool in g++ cmake; do
        command -v "$tool" >/dev/null || { echo "build_horovod: $tool is needed (Debian: apt-get install g++ cmake)" >&2; exit 1; }
    done
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$python" -m pip download --quiet --no-deps --no-binary :all: "horovod==$version" -d "$work"
    tar -xzf "$work/horovod-$version.tar.gz" -C "$work"
    src="$work/horovod-$version"
    # The fix: C++17 where torch needs it, in the two files that set C++14 (the top level and the torch extension).
    sed -i 's/^set(CMAKE_CXX_STANDARD 14)$/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt"
    sed -i 's/^    set(CMAKE_CXX_STANDARD 14)$/    set(CMAKE_CXX_STANDARD 17)/' "$src/horovod/torch/CMakeLists.txt"
    if grep -q "CMAKE_CXX_STANDARD 14" "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; then
        echo "build_horovod: the C++ standard could not be raised in horovod $version's CMakeLists.txt" >&2
        exit 1
    fi
    echo "build_horovod: building horovod $version for torch $torch_version (a few minutes)" >&2
    start=$(date +%s)
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
        HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
        "$python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" "$src"
    mkdir -p "$wheels"
    cp "$work"/dist/horovod-"$version"-*.whl "$wheels"/
    wheel=$(ls "$wheels"/horovod-"$version"-*.whl | head -n 1)
    echo "build_horovod: built $(basename "$wheel") in $(( $(date +%s) - start )) s" >&2
fi
"$python" -m pip install --quiet "$wheel"
"$python" -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '$version', 'with gloo:', hvd.gloo_built())"
