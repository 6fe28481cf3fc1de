#!/usr/bin/env bash
# Wheels for the device check's machine, which has no network (benchmarks/device_check.sh
# installs them with pip --no-index --find-links .whl --no-deps). Run here, where PyPI is
# reachable; they go to .whl/ (git-ignored), which travels with the tree.
#
# The machine: x86-64 Linux, CPython 3.12, with CUDA torch + torchvision, numpy, pytest,
# hypothesis, wrapt; these are what streamio and its tests need beyond that, pinned to the
# versions CI tests with. Only binary wheels (a source build there would need the network).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
    "pillow==13.0.0"          # streamio[image] wants >= 13 (the resample kernel matches its resize)
    "simplejpeg==1.9.0"       # the CPU path's JPEG decoder (libjpeg-turbo, without the GIL)
    "smart-open==9.0.2"       # install_requires (its dependency wrapt is on the machine)
    "crc32c==2.9.post0"       # install_requires
    "protobuf==7.36.2"        # install_requires
    "torchdata==0.11.0"       # StatefulDataLoader: the prefetcher's resume test
    "backports.zstd==1.8.0"   # the zstd codec before Python 3.14 (the tests' imports)
    "setuptools==84.2.1"      # pip install --no-build-isolation -e . builds with it
)
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
ls -l .whl
du -sh .whl
