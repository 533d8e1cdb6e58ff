"""Is a download host reachable? The one network check before fedshield downloads data or
weights (``data.download``, ``model.params.pretrained_download``), so that "no network" is
its own clear error and not a library's traceback or a hint to switch downloads on."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def unreachable(url: str, timeout: float = 5.0) -> str | None:
    """Why ``url``'s host cannot be reached (DNS, no route, refused, timeout), or None when
    a TCP connection to it opens."""
    parts = urlsplit(url)
    host = parts.hostname or url
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"{host}:{port}: {err.strerror or err}"
    return None


__all__ = ["unreachable"]
