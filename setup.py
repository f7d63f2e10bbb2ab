"""Packaging: three folders, one package.

``phaseprof/`` is the top-level package (the file contract, the CLI, lazy re-exports);
``plugin/`` installs as ``phaseprof.plugin`` (TensorBoard side, no torch) and ``training_hooks/``
as ``phaseprof.training_hooks`` (training side, needs torch).
"""

from pathlib import Path

from setuptools import setup

# Logdirs in object stores (s3://, gs://, az://): each store's client, in ranges that install
# together in one command. s3fs and gcsfs each need an fsspec of their own release; aiobotocore
# (s3fs's client) pins botocore to a few releases, and boto3 (TensorBoard's reader of s3://
# scalars, moto's client) pins botocore too: left open, pip tries every newer boto3 before one
# that fits (minutes). When aiobotocore moves on, move its range and boto3's together (boto3 X.Y.Z
# needs botocore X.Y.Z); tests/test_extras.py resolves them all as a fresh install would.
S3 = ["fsspec>=2026.7", "s3fs>=2026.7,<2027", "aiobotocore>=3.10,<3.11", "boto3>=1.43.115,<1.43.118"]
GCS = ["fsspec>=2026.7", "gcsfs>=2026.7,<2027"]
AZURE = ["fsspec>=2026.7", "adlfs>=2026.8,<2027"]

setup(
    name="phaseprof",
    version="0.1.0",
    description="Per-step forward/backward/optimizer phase profiling for PyTorch, in TensorBoard and the terminal",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    python_requires=">=3.10",
    packages=[
        "phaseprof",
        "phaseprof.cli",
        "phaseprof.plugin",
        "phaseprof.plugin.reading",
        "phaseprof.plugin.analysis",
        "phaseprof.plugin.serving",
        "phaseprof.training_hooks",
        "phaseprof.training_hooks.integrations",
    ],
    package_dir={
        "phaseprof": "phaseprof",
        "phaseprof.plugin": "plugin",
        "phaseprof.training_hooks": "training_hooks",
    },
    package_data={"phaseprof.plugin": ["static/*", "http_api.md"]},
    install_requires=[
        "tensorboard>=2.14",
        "msgspec>=0.18",
        "numpy>=1.23",
        "rich>=13",
        # the CRC-32C of the scalars' event records, in C: TensorBoard's pure-Python one costs tens
        # to hundreds of µs a step on the training process's recorder thread (imported there only)
        "google-crc32c>=1.5",
        # gzip and deflate through zlib-ng (the same formats): a gzipped trace inflates in half the
        # time of zlib's, and the analysis and step index deflate faster and smaller
        "zlib-ng>=0.5",
    ],
    extras_require={
        "torch": ["torch>=2.1"],
        "tb-profiler": ["torch-tb-profiler==0.4.3"],
        # the framework callbacks (phaseprof.lightning, phaseprof.transformers); install torch first
        "lightning": ["lightning>=2.0"],
        "transformers": ["transformers>=4.40", "accelerate>=0.26"],
        "s3": S3, "gcs": GCS, "azure": AZURE,
        # the tests need every store's client and emulator: moto (S3), gcp-storage-emulator (GCS);
        # Azurite (Azure) comes from npm, pinned in tests/azurite/package.json
        "test": S3 + GCS + AZURE + ["moto[server]>=5.2,<5.3", "gcp-storage-emulator==2026.7.19",
                                    "pytest>=8", "pytest-timeout>=2.3", "playwright>=1.45",
                                    "ruff>=0.6", "hypothesis>=6.100", "lightning>=2.0",
                                    "transformers>=4.40", "accelerate>=0.26"],
    },
    entry_points={
        "console_scripts": ["phaseprof = phaseprof.cli:main"],
        "tensorboard_plugins": ["phaseprof = phaseprof.plugin.serving.loader:PhaseprofLoader"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "License :: OSI Approved :: BSD License",
    ],
)
