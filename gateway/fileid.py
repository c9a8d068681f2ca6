"""A file's identity as seen by the pollers that take a changed file up again: the config
watch (``watch.py``), the listeners' certificates (``certs.py``), the API key and JWKS files
(``security/credentials.py``).

No I/O beyond one ``os.stat``; no imports of the gateway's own.
"""
from __future__ import annotations

import os

__all__ = ["FileId", "file_id"]

# (device, inode, mtime in ns, size)
FileId = tuple[int, int, int, int]


def file_id(path: str | None) -> FileId | None:
    """The identity of the file at ``path``: ``os.stat``'s device, inode, mtime (ns) and size.

    ``os.stat`` follows symlinks, so the identity is the resolved file's: an editor's write
    changes mtime and size, an atomic rename the inode, and Kubernetes' swap of a mounted
    ConfigMap's or Secret's ``..data`` symlink the resolved inode. Two equal identities mean
    "no change seen"; a rewrite of the same size within one tick of a coarse file-system clock
    leaves the identity unchanged, which is for the caller to allow for.

    ``None`` when ``path`` is ``None`` (an optional file not configured) or cannot be stat'ed
    (missing — e.g. briefly, mid-swap — or unreadable: any ``OSError``).
    """
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size
