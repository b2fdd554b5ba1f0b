"""Builds rwfs's one C extension, ``rwfs.fuse._fuseopen`` (see src/rwfs/fuse/kernelflags.py).
Everything else about the package is in pyproject.toml."""

import subprocess

from setuptools import Extension, setup


def fuse3_include_dirs() -> list[str]:
    try:
        out = subprocess.run(
            ["pkg-config", "--cflags-only-I", "fuse3"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return ["/usr/include/fuse3"]
    return [flag[2:] for flag in out.split() if flag.startswith("-I")]


setup(
    ext_modules=[
        Extension(
            "rwfs.fuse._fuseopen",
            ["src/rwfs/fuse/_fuseopen.c"],
            include_dirs=fuse3_include_dirs(),
            libraries=["dl"],
        )
    ]
)
