"""The optional on-disk cache of compiled regions and meta-inference results."""

import os
import warnings

from . import _C


def set_cache_dir(path) -> None:
    """Persists compiled regions and meta-inference results under ``path``.

    ``path`` (str or os.PathLike) is a directory, created when missing; the
    files go to a subdirectory named by a version stamp (file format, torch
    version, a build id of this extension), so a cache written by another
    build is never read. ``None`` turns the disk cache off (the in-memory
    caches always stay on). Overrides the environment variable
    ``TORCH_TPU_CACHE_DIR``, which is read once, at the first cache lookup.

    A later process with the same directory skips PyTorch's meta kernels and
    region compiles for what an earlier one saw (``disk_cache_hits`` in
    :func:`torch_tpu_eager.metrics`). Concurrent processes may share a
    directory. A directory that cannot be created or written gives a
    ``UserWarning`` and the caches stay in memory only. Raises TypeError for a
    path that is neither str, os.PathLike nor None, ValueError for "".
    """
    if path is None:
        _C._set_cache_dir("")
        return
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"set_cache_dir: expected a str, os.PathLike or None, got {type(path).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str) or path == "":
        raise ValueError("set_cache_dir: expected a non-empty directory path (None turns the disk cache off)")
    err = _C._set_cache_dir(os.path.abspath(path))
    if err:
        warnings.warn(
            f"torch_tpu_eager disk cache: {path} is not usable ({err}); "
            "compiled regions and meta results stay in memory only",
            stacklevel=2,
        )


def cache_dir():
    """The directory of the on-disk cache in use (str), or None when it is off."""
    return _C._cache_dir() or None


def cache_stamp() -> str:
    """The version stamp of this build: the subdirectory of the cache directory it reads and writes."""
    return _C._cache_stamp()
