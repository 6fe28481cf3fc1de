"""Packaging for streamio. The C accelerator is optional: if it fails to build, the pure-Python
implementation (the reference the tests compare it with) is used."""

import os

from setuptools import Extension, find_packages, setup

speedups = Extension(
    "streamio._speedups",
    sources=["streamio/_speedups.c"],
    extra_compile_args=["-O3", "-std=c99"],
    optional=True,
)

setup(
    name="streamio",
    version="0.1.0",
    description="Stream CSV, TFRecord and RecordIO from pipes, HTTP and files into PyTorch and tf.data",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["streamio", "streamio.*"]),
    package_data={"streamio": ["py.typed", "_data/*"]},
    ext_modules=[speedups] if os.path.exists("streamio/_speedups.c") else [],
    python_requires=">=3.9",
    install_requires=["numpy>=1.21", "protobuf>=3.20", "smart-open>=6", "crc32c>=2.3"],
    extras_require={
        "torch": ["torch>=2.0"],
        "tf": ["tensorflow-cpu>=2.12; platform_machine=='x86_64'",
               "tensorflow>=2.12; platform_machine!='x86_64'"],
        "s3": ["smart-open[s3]>=6"],
        "gcs": ["smart-open[gcs]>=6"],
        "bench": ["pandas", "tfrecord"],
        "fuzz": ["atheris>=2.3"],
        "dev": ["pytest>=7", "hypothesis>=6", "pandas", "scipy", "tfrecord", "boto3",
                "moto[server]>=5"],
    },
    entry_points={"console_scripts": ["streamio=streamio.cli:main"]},
)
