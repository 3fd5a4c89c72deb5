#!/usr/bin/env python3
"""Container health probe for derender-worker: ``derender-healthcheck [/healthz|/readyz]``.

Asks the worker's metrics server (``DERENDER_METRICS_PORT``, default 9464) on the loopback
address and exits 0 when the endpoint answers 2xx, 1 otherwise (Docker's HEALTHCHECK and
Compose's healthcheck read only the exit status). Standard library only: the slim image has
no curl or wget.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_PORT = "9464"
TIMEOUT_S = 3.0


def probe(path: str = "/healthz") -> int:
    port = os.environ.get("DERENDER_METRICS_PORT") or DEFAULT_PORT
    url = f"http://127.0.0.1:{port}{path if path.startswith('/') else '/' + path}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        print(f"{url}: HTTP {exc.code}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(probe(sys.argv[1] if len(sys.argv) > 1 else "/healthz"))
