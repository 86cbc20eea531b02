"""The SDK's tests run against a real `airlock serve` (started by .ci/sdks):
AIRLOCK_TEST_SERVER is its base URL, AIRLOCK_TEST_API_KEY an organization's key."""

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from airlock_client import Client

AGENTS = Path(__file__).resolve().parents[2] / "testdata" / "agents"


@pytest.fixture(scope="session")
def server() -> tuple[str, str]:
    url, key = (
        os.environ.get("AIRLOCK_TEST_SERVER"),
        os.environ.get("AIRLOCK_TEST_API_KEY"),
    )
    if not url or not key:
        pytest.fail("set AIRLOCK_TEST_SERVER and AIRLOCK_TEST_API_KEY (.ci/sdks does)")
    return url, key


@pytest.fixture
def client(server):
    with Client(*server) as c:
        yield c


class CuttingProxy:
    """A loopback TCP relay to the server that cuts the first event stream
    after relaying its first event, and records each stream request's
    `Last-Event-ID` header (None when absent)."""

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self.upstream = (u.hostname, u.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.streams: list[str | None] = []
        self.cut = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(down,), daemon=True).start()

    def _relay(self, down: socket.socket) -> None:
        up = socket.create_connection(self.upstream)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = down.recv(65536)
            if not chunk:
                down.close()
                up.close()
                return
            head += chunk
        up.sendall(head)
        lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (h.partition(":") for h in lines[1:])
        }
        cut_this = False
        if headers.get("accept") == "text/event-stream":
            with self._lock:
                self.streams.append(headers.get("last-event-id"))
                cut_this = not self.cut.is_set()
                self.cut.set()
        threading.Thread(target=self._pump, args=(down, up), daemon=True).start()
        seen = b""
        while True:
            try:
                chunk = up.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            down.sendall(chunk)
            seen += chunk
            if cut_this and b"\nid:" in seen:
                break
        for s in (down, up):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    @staticmethod
    def _pump(down: socket.socket, up: socket.socket) -> None:
        while True:
            try:
                chunk = down.recv(65536)
                if not chunk:
                    return
                up.sendall(chunk)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def cutting_proxy(server):
    p = CuttingProxy(server[0])
    yield p
    p.close()
