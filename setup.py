"""Packaging: three folders, one package.

``phaseprof/`` is the top-level package (the file contract, the CLI, lazy re-exports);
``plugin/`` installs as ``phaseprof.plugin`` (TensorBoard side, no torch) and ``training_hooks/``
as ``phaseprof.training_hooks`` (training side, needs torch).
"""

from pathlib import Path

from setuptools import setup

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
        # logdirs in object stores (s3://, gs://, az://); boto3 also lets TensorBoard read s3:// scalars
        "s3": ["fsspec>=2023.1", "s3fs>=2023.1", "boto3"],
        "gcs": ["fsspec>=2023.1", "gcsfs>=2023.1"],
        "azure": ["fsspec>=2023.1", "adlfs>=2023.1"],
        "test": ["moto[server]>=5", "fsspec>=2023.1", "s3fs>=2023.1",  # moto brings boto3
                 "pytest>=8", "pytest-timeout>=2.3", "playwright>=1.45", "ruff>=0.6", "hypothesis>=6.100",
                 "lightning>=2.0", "transformers>=4.40", "accelerate>=0.26"],
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
