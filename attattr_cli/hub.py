"""Whether the model and dataset hub can be reached (light: no torch)."""

from __future__ import annotations


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub endpoint, so that an offline machine gets one clear
    line at once instead of minutes of retries."""
    import socket
    from urllib.parse import urlparse

    try:
        from huggingface_hub import constants

        url = urlparse(constants.ENDPOINT)
    except Exception:  # noqa: BLE001 - no hub library, no hub
        return False
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
