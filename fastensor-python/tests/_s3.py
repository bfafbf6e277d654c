"""The local S3 server the object-storage tests run against (``fastensor-s3-server``: s3s-fs
over a temporary directory, with fault injection; built by scripts/test and named by
``FASTENSOR_S3_SERVER``)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

BUCKET = "ckpt"
KEY_ID = "fastensor"
SECRET = "fastensor-secret"


class S3Server:
    """A running server on ``root``; ``url`` is its endpoint."""

    def __init__(self, binary: str, root: Path) -> None:
        (root / BUCKET).mkdir(parents=True)
        self.root = root
        self.proc = subprocess.Popen(
            [binary, "--root", str(root), "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.url

    def env(self) -> dict[str, str]:
        """The environment that points AWS clients (fastensor's included) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
        }

    @classmethod
    @contextlib.contextmanager
    def in_environment(cls, root: Path) -> Iterator[S3Server]:
        """A server on ``root`` while the block runs, the process environment pointing AWS
        clients at it (restored after)."""
        server = cls(server_binary() or "", root)
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            yield server
        finally:
            server.stop()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def file(self, key: str) -> Path:
        """Where the server keeps object ``key`` of the test bucket."""
        return self.root / BUCKET / key

    def uploads_left(self) -> list[str]:
        """Multipart uploads (or their parts) the server still holds."""
        return sorted(n for n in os.listdir(self.root) if n.startswith(".upload"))

    def _faults(self, method: str, body: dict | None = None) -> dict:
        host = self.url.removeprefix("http://")
        conn = http.client.HTTPConnection(host, timeout=10)
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, "/_faults", body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read()
        assert 200 <= resp.status < 300, (resp.status, text)
        return json.loads(text) if text else {}

    def fault(
        self, kind: str, method: str = "GET", times: int = 1, delay_ms: int | None = None
    ) -> None:
        """The next ``times`` requests of ``method`` meet fault ``kind`` (``delay`` takes
        ``delay_ms``)."""
        rule: dict = {"kind": kind, "method": method, "times": times}
        if delay_ms is not None:
            rule["delay_ms"] = delay_ms
        self._faults("POST", rule)

    def sent_bytes(self) -> int:
        """Body bytes of every S3 response since the last :meth:`clear`."""
        return int(self._faults("GET")["sent_bytes"])

    def clear(self) -> None:
        """No faults left; counters reset."""
        self._faults("DELETE")

    def fired(self, kind: str) -> int:
        """Faults of ``kind`` met since the last :meth:`clear`."""
        return int(self._faults("GET").get("fired", {}).get(kind, 0))


def server_binary() -> str | None:
    """The server binary, or ``None`` where none is given (and none is required)."""
    binary = os.environ.get("FASTENSOR_S3_SERVER")
    if not binary and os.environ.get("FASTENSOR_REQUIRE_S3"):
        raise RuntimeError("FASTENSOR_REQUIRE_S3 is set, but FASTENSOR_S3_SERVER is not")
    return binary or None
