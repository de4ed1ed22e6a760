"""The command's HTTP over the daemon's socket, against the standard library's server as the daemon runs it."""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autobatch.daemon.client import request


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802  # http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        for n in range(3):
            self.wfile.write((json.dumps({"n": n, "echo": json.loads(body)}) + "\n").encode())
            self.wfile.flush()
        self.wfile.write(b'{"exit": 0}')  # the last line without its newline

    def do_GET(self) -> None:  # noqa: N802
        payload = json.dumps({"ok": True}).encode()
        self.send_response(404)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def path(tmp_path: Path) -> Iterator[str]:
    where = str(tmp_path / "s.sock")
    server = _Server(where, _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield where
    server.shutdown()
    server.server_close()


def test_a_streamed_answer_is_read_line_by_line(path: str) -> None:
    answer = request(path, "POST", "/v1/run", json.dumps({"argv": ["tune"]}).encode(), timeout=10)
    try:
        assert answer.status == 200
        lines = [answer.readline() for _ in range(4)]
        assert [json.loads(line).get("n") for line in lines[:3]] == [0, 1, 2]
        assert json.loads(lines[0])["echo"] == {"argv": ["tune"]}
        assert lines[3] == b'{"exit": 0}' and answer.readline() == b""  # the body's end is the connection's
    finally:
        answer.close()


def test_a_whole_answer_and_its_status(path: str) -> None:
    answer = request(path, "GET", "/v1/status", timeout=10)
    assert answer.status == 404 and json.loads(answer.read()) == {"ok": True}
    answer.close()


def test_an_answer_that_is_not_http_is_an_error(tmp_path: Path) -> None:
    where = str(tmp_path / "x.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(where)
    listener.listen(1)

    def garbage() -> None:
        peer, _ = listener.accept()
        peer.recv(4096)
        peer.sendall(b"SSH-2.0-not-http\r\n\r\n")
        peer.close()

    threading.Thread(target=garbage, daemon=True).start()
    with pytest.raises(http.client.HTTPException):
        request(where, "GET", "/v1/status", timeout=10)
    listener.close()
