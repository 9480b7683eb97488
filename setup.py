"""The one compiled part of prefixscope: ``prefixscope.replay._native`` (replay/_native.c).

Everything else is in pyproject.toml. The extension is optional: where it cannot be built (no C
compiler, no OpenSSL headers: Debian's libssl-dev) the install still succeeds and replay runs
its pure-Python path, with the same results (``prefixscope.replay.native``; docs/replay.md).
``make test`` installs libssl-dev first, and under ``CI=true`` a missing extension fails
``tests/test_replay_native.py``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "prefixscope.replay._native",
            ["replay/_native.c"],
            libraries=["crypto"],  # OpenSSL's SHA-256, as CPython's hashlib uses
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
