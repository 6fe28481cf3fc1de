"""Packaging for streamio. The C accelerator is optional: if it fails to build, the pure-Python
implementation (the reference the tests compare it with) is used."""

import os

from setuptools import Extension, find_packages, setup

# One C file per kernel family (streamio/_c/speedups.h says which holds what); the fuzz harness
# in tests/fuzz/ builds its sanitizer variant from this same list.
SPEEDUPS_SOURCES = [
    "streamio/_c/module.c",
    "streamio/_c/crc.c",
    "streamio/_c/framing.c",
    "streamio/_c/pb_batch.c",
    "streamio/_c/pb_example.c",
    "streamio/_c/pb_recordio.c",
    "streamio/_c/csv.c",
    "streamio/_c/shuffle.c",
    "streamio/_c/mix.c",
    "streamio/_c/resample.c",
    "streamio/_c/resample_x86.c",
]

speedups = Extension(
    "streamio._speedups",
    sources=SPEEDUPS_SOURCES,
    depends=["streamio/_c/speedups.h", "streamio/_c/pb_wire.h", "streamio/_c/pb_batch.h",
             "streamio/_c/resample.h"],
    extra_compile_args=["-O3", "-std=c99"],
    optional=True,
)

setup(
    name="streamio",
    version="0.1.0",
    description="Stream CSV, TFRecord and RecordIO from pipes, HTTP and files into PyTorch and tf.data",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license_expression="Apache-2.0",  # SPDX (the License classifiers are deprecated)
    license="Apache-2.0",  # the same, for setuptools older than 77
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Operating System :: MacOS",
        "Programming Language :: C",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
    packages=find_packages(include=["streamio", "streamio.*"]),
    package_data={"streamio": ["py.typed", "_data/*"]},
    ext_modules=[speedups] if os.path.exists("streamio/_c/module.c") else [],
    python_requires=">=3.9",
    install_requires=["numpy>=1.21", "protobuf>=3.20", "smart-open>=6", "crc32c>=2.3",
                      # map(backend="process") ships its function by value, so a child never
                      # imports the user's script; 3.1 is the first to support Python 3.13.
                      "cloudpickle>=3.1"],
    extras_require={
        "torch": ["torch>=2.0"],
        "tf": ["tensorflow-cpu>=2.12; platform_machine=='x86_64'",
               "tensorflow>=2.12; platform_machine!='x86_64'"],
        "s3": ["smart-open[s3]>=6"],
        "gcs": ["smart-open[gcs]>=6"],
        # ISA-L inflates gzip/zlib ~2x faster than zlib here (benchmarks/inflate.py); used
        # automatically when installed, zlib otherwise.
        "fast-inflate": ["isal>=1.6"],
        # Zstandard: the stdlib's compression.zstd from 3.14, its backport before (bounded
        # decompress(max_length), which the zstandard package lacks).
        "zstd": ["backports.zstd>=1.0; python_version<'3.14'"],
        # Pillow: PNG, and JPEG where simplejpeg has no wheel; its resize is what streamio's
        # resample kernel reproduces byte for byte, as of 13 (which runs the vertical pass first
        # for some shapes); simplejpeg: libjpeg-turbo JPEG decoding without the GIL (see
        # streamio/decoders/image.py and docs/images.md).
        "image": ["pillow>=13", "simplejpeg>=1.6"],
        "bench": ["pandas", "tfrecord", "isal>=1.6", "zlib-ng>=0.5", "pillow>=13",
                  "simplejpeg>=1.6"],
        "fuzz": ["atheris>=2.3"],
        # streamio.ray: Ray Data source and sink (tested with 2.60); pyarrow for its blocks.
        "ray": ["ray[data,train]>=2.40", "pyarrow>=14"],
        "dev": ["pytest>=7",
                # xdist: the README's test command runs the suite in several processes.
                "pytest-xdist>=3", "hypothesis>=6", "pandas", "scipy", "tfrecord", "boto3",
                "moto[server]>=5", "isal>=1.6", "zlib-ng>=0.5",
                # torchdata's StatefulDataLoader: the resume tests (tests/pipeline/test_resume.py).
                "torchdata>=0.8",
                "backports.zstd>=1.0; python_version<'3.14'",
                # diagnose --plot draws its timeline with matplotlib (optional for users).
                "matplotlib"],
    },
    entry_points={"console_scripts": ["streamio=streamio.cli:main"]},
)
