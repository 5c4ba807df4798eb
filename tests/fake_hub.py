"""A local fake of the Hugging Face Hub's HTTP interface, enough for huggingface_hub's snapshot_download and
hf_hub_download: repo info, the recursive file listing with sizes, and resolve/ with HEAD metadata headers and
ranged GETs. It can drop a file's first download midway (to test resuming), throttle, and lie about a file's
size in the listing (to test the disk-space refusal). Every request is recorded."""
from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, bytes]
    listed_sizes: dict[str, int] = field(default_factory=dict)  # sizes the listing claims instead of the real ones

    def etag(self, path: str) -> str:
        data = self.files[path]
        if is_lfs(path):
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id

    def entry(self, path: str) -> dict:
        size = self.listed_sizes.get(path, len(self.files[path]))
        # "oid": the git blob id (for an LFS file, its pointer's; any id will do here)
        entry = {"type": "file", "path": path, "size": size, "oid": self.etag(path) if not is_lfs(path)
                 else hashlib.sha1(self.files[path]).hexdigest()}
        if is_lfs(path):
            entry["lfs"] = {"oid": self.etag(path), "size": size, "pointerSize": 134}
        return entry


def is_lfs(path: str) -> bool:
    return path.endswith((".safetensors", ".bin"))


class FakeHub:
    """Serves `repos` ({"owner/name": Repo}) on 127.0.0.1; use as a context manager."""

    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.drop_first_download: set[str] = set()  # "owner/name/path": the first GET sends half, then hangs up
        self.bytes_per_second: float | None = None
        self.down = False
        self._dropped: set[str] = set()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        """Unreachable from now on: new connections are refused, and kept-alive ones hang up at the next request."""
        self.down = True
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

    def downloads(self, path_suffix: str) -> list[str | None]:
        """The Range header of each GET of a file whose path ends with `path_suffix`."""
        return [range_ for method, path, range_ in self.requests
                if method == "GET" and "/resolve/" in path and path.endswith(path_suffix)]

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _serve(self, head: bool):
                if hub.down:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                path = unquote(urlparse(self.path).path)
                with hub._lock:
                    hub.requests.append((self.command, path, self.headers.get("Range")))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 6:
                    return self._api(f"{parts[2]}/{parts[3]}", parts[4], "/".join(parts[6:]))
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._resolve(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), head)
                self._json(404, {"error": "not found"})

            def _api(self, repo_id: str, what: str, below: str):
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                if what == "revision":
                    return self._json(200, {"id": repo_id, "sha": COMMIT,
                                            "siblings": [{"rfilename": p} for p in repo.files]})
                if what == "tree":
                    return self._json(200, [repo.entry(p) for p in sorted(repo.files) if p.startswith(below)])
                self._json(404, {"error": "not found"})

            def _resolve(self, repo_id: str, filename: str, head: bool):
                repo = hub.repos.get(repo_id)
                if repo is None or filename not in repo.files:
                    return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                data = repo.files[filename]
                start = 0
                if (range_ := self.headers.get("Range")) and not head:
                    start = int(range_.removeprefix("bytes=").split("-")[0])
                body = data[start:]
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{repo.etag(filename)}"')
                if is_lfs(filename):
                    self.send_header("X-Linked-Etag", f'"{repo.etag(filename)}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if head:
                    return
                key = f"{repo_id}/{filename}"
                with hub._lock:
                    drop = key in hub.drop_first_download and key not in hub._dropped
                    if drop:
                        hub._dropped.add(key)
                if drop:
                    self._write(body[:len(body) // 2])
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self._write(body)

            def _write(self, body: bytes):
                chunk = 64 * 1024
                for offset in range(0, len(body), chunk):
                    self.wfile.write(body[offset:offset + chunk])
                    if hub.bytes_per_second:
                        threading.Event().wait(chunk / hub.bytes_per_second)

            def _json(self, status: int, value, headers=None):
                body = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, header in (headers or {}).items():
                    self.send_header(name, header)
                self.end_headers()
                self.wfile.write(body)

        return Handler


@contextlib.contextmanager
def hub_serving(repos: dict[str, Repo], cache: Path, monkeypatch):
    """A FakeHub of `repos` with huggingface_hub pointed at it, online, and its cache in `cache`."""
    from huggingface_hub import constants
    with FakeHub(repos) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield hub
