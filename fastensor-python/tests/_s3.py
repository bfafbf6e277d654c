"""The local object stores the object-storage tests run against.

- ``s3://``: ``fastensor-s3-server`` (s3s-fs over a temporary directory, with fault
  injection; built by scripts/test and named by ``FASTENSOR_S3_SERVER``).
- ``gs://``: the same server with ``--anonymous``, reached through ``STORAGE_EMULATOR_HOST``
  as Google's tools reach an emulator: Google Cloud Storage's XML API, which the GCS client
  speaks for every read and write, is S3's REST protocol, unauthenticated here. (The
  ``gcp-storage-emulator`` of PyPI answers ``HEAD`` with 501, sends no ``ETag`` and has no
  XML multipart uploads or listings: a GCS client cannot load from it.)
- ``az://``: Azurite, Azure's own emulator (``npm install azurite``; scripts/test installs
  it and names its ``azurite-blob`` by ``FASTENSOR_AZURITE``), reached through
  ``AZURE_STORAGE_CONNECTION_STRING``. It has no fault injection: the fault tests run on
  the other two."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

BUCKET = "ckpt"
KEY_ID = "fastensor"
SECRET = "fastensor-secret"


class S3Server:
    """A running server on ``root``; ``url`` is its endpoint. With ``anonymous``, it is
    the GCS emulator (see the module documentation)."""

    scheme = "s3"
    #: Faults can be injected (``fault``, ``fired``) and bytes sent counted.
    faults = True

    def __init__(self, binary: str, root: Path, anonymous: bool = False) -> None:
        (root / BUCKET).mkdir(parents=True)
        self.root = root
        if anonymous:
            self.scheme = "gs"
        self.proc = subprocess.Popen(
            [binary, "--root", str(root), "--listen", "127.0.0.1:0"]
            + (["--anonymous"] if anonymous else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url_base = self.proc.stdout.readline().strip()
        assert self.url_base.startswith("http://127.0.0.1:"), self.url_base

    def url(self, key: str) -> str:
        """The URL of object ``key`` of the test bucket."""
        return f"{self.scheme}://{BUCKET}/{key}"

    def read(self, key: str) -> bytes:
        """The bytes the server holds for object ``key``."""
        return self.file(key).read_bytes()

    def exists(self, key: str) -> bool:
        return self.file(key).is_file()

    def env(self) -> dict[str, str]:
        """The environment that points the store's clients (fastensor's included) at this
        server."""
        if self.scheme == "gs":
            return {"STORAGE_EMULATOR_HOST": self.url_base}
        return {
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url_base,
        }

    @classmethod
    @contextlib.contextmanager
    def in_environment(cls, root: Path, anonymous: bool = False) -> Iterator[S3Server]:
        """A server on ``root`` while the block runs, the process environment pointing the
        store's clients at it (restored after)."""
        with serving(cls(server_binary() or "", root, anonymous)) as server:
            yield server

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
        host = self.url_base.removeprefix("http://")
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


@contextlib.contextmanager
def serving(server):
    """``server`` while the block runs, the process environment pointing its clients at
    it (restored after); stopped at the end."""
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


#: Azurite's account and key (public, the same in every copy of the emulator).
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZ_VERSION = "2021-08-06"


class Azurite:
    """Azure's blob emulator on a free loopback port, its data in ``root``, with the test
    container made."""

    scheme = "az"
    faults = False

    def __init__(self, binary: str, root: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                binary,
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--location",
                str(root),
                "--silent",
                "--skipApiVersionCheck",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert self.proc.poll() is None, "Azurite exited"
                assert time.monotonic() < deadline, "Azurite did not listen"
                time.sleep(0.1)
        status, body = self.request("PUT", f"/{BUCKET}", {"restype": "container"})
        assert status == 201, (status, body)

    def env(self) -> dict[str, str]:
        return {
            "AZURE_STORAGE_CONNECTION_STRING": (
                f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={AZ_KEY};"
                f"BlobEndpoint=http://127.0.0.1:{self.port}/{AZ_ACCOUNT};"
            )
        }

    def url(self, key: str) -> str:
        return f"az://{BUCKET}/{key}"

    def request(
        self, method: str, path: str, query: dict[str, str] | None = None, body: bytes = b""
    ) -> tuple[int, bytes]:
        """A request signed with the account's shared key, as Azure's tools sign it."""
        query = query or {}
        full = f"/{AZ_ACCOUNT}" + urllib.parse.quote(path)
        headers = {
            "x-ms-date": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
            "x-ms-version": AZ_VERSION,
        }
        if method == "PUT" and "restype" not in query:
            headers["x-ms-blob-type"] = "BlockBlob"
        length = str(len(body)) if body else ""
        canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        resource = f"/{AZ_ACCOUNT}{full}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
        to_sign = f"{method}\n\n\n{length}\n\n\n\n\n\n\n\n\n" + canonical_headers + resource
        mac = hmac.new(base64.b64decode(AZ_KEY), to_sign.encode(), hashlib.sha256).digest()
        headers["Authorization"] = f"SharedKey {AZ_ACCOUNT}:{base64.b64encode(mac).decode()}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        target = full + ("?" + urllib.parse.urlencode(query) if query else "")
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()

    def read(self, key: str) -> bytes:
        status, body = self.request("GET", f"/{BUCKET}/{key}")
        assert status == 200, (status, body[:200])
        return body

    def write(self, key: str, data: bytes) -> None:
        """Writes object ``key`` as Azure's own tools would (one Put Blob)."""
        status, body = self.request("PUT", f"/{BUCKET}/{key}", body=data)
        assert status == 201, (status, body[:200])

    def exists(self, key: str) -> bool:
        return self.request("HEAD", f"/{BUCKET}/{key}")[0] == 200

    def uploads_left(self) -> list[str]:
        """Always empty: Azure keeps the blocks of an upload never committed out of sight
        (and drops them after a week); there is nothing to look at."""
        return []

    def clear(self) -> None:
        """Nothing to clear: Azurite has no faults."""

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def azurite_binary() -> str | None:
    """Azurite's blob server, or ``None`` where none is given (and none is required)."""
    binary = os.environ.get("FASTENSOR_AZURITE")
    if not binary and os.environ.get("FASTENSOR_REQUIRE_S3"):
        raise RuntimeError("FASTENSOR_REQUIRE_S3 is set, but FASTENSOR_AZURITE is not")
    return binary or None


def server_binary() -> str | None:
    """The server binary, or ``None`` where none is given (and none is required)."""
    binary = os.environ.get("FASTENSOR_S3_SERVER")
    if not binary and os.environ.get("FASTENSOR_REQUIRE_S3"):
        raise RuntimeError("FASTENSOR_REQUIRE_S3 is set, but FASTENSOR_S3_SERVER is not")
    return binary or None
