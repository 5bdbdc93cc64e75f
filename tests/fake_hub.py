"""A small stand-in for the Hugging Face hub on 127.0.0.1, for tests.

It serves the endpoints `huggingface_hub` uses to resolve and download a
model repository (`model_info`, `list_repo_tree`, `hf_hub_download`'s HEAD
and GET), with the hub's error headers, and records every request. It
serves on an ephemeral port from a daemon thread, and shuts itself down
after `lifetime` seconds if nobody stops it first.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class FakeHub:
    """Repositories in memory: `add(repo_id, files)` and `tag(...)`; the
    requests seen so far in `requests` as `(method, path)`.

    Args:
        lifetime: seconds after which the server stops by itself.
        token: the access token that opens gated repositories.
    """

    def __init__(self, lifetime: float = 120.0, token: str = "hf_test_token"):
        self.repos: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.token = token
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
        )
        self._timer = threading.Timer(lifetime, self._server.shutdown)
        self._timer.daemon = True

    def start(self) -> FakeHub:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def add(self, repo_id: str, files: dict[str, bytes], gated: bool = False) -> str:
        """A repository whose `main` holds `files`; returns the commit id."""
        self.repos[repo_id] = {"refs": {}, "commits": {}, "gated": gated}
        return self.tag(repo_id, "main", files)

    def tag(self, repo_id: str, name: str, files: dict[str, bytes]) -> str:
        """Points revision `name` of `repo_id` at a new commit of `files`."""
        digest = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
        repo = self.repos[repo_id]
        repo["commits"][digest] = dict(files)
        repo["refs"][name] = digest
        return digest

    def fetched(self) -> set[str]:
        """Repository paths of the files requested (HEAD or GET)."""
        paths = set()
        for _, path in self.requests:
            parts = path.strip("/").split("/")
            if len(parts) > 4 and parts[2] == "resolve":
                paths.add("/".join(parts[4:]))
        return paths


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a stuck client cannot hold a thread for long

        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self._serve(body=False)

        def do_GET(self):
            self._serve(body=True)

        def _send(self, status, headers=(), payload=b"", body=True):
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self.wfile.write(payload)

        def _error(self, status, code, body, commit=None):
            headers = [("X-Error-Code", code), ("Content-Type", "application/json")]
            if commit:
                headers.append(("X-Repo-Commit", commit))
            payload = json.dumps({"error": code}).encode()
            self._send(status, headers, payload, body)

        def _json(self, data, body):
            payload = json.dumps(data).encode()
            self._send(200, [("Content-Type", "application/json")], payload, body)

        def _serve(self, body):
            path = urlsplit(self.path).path
            hub.requests.append((self.command, unquote(path)))
            parts = path.strip("/").split("/")
            api = parts[:2] == ["api", "models"]
            if api:
                parts = parts[2:]
                if len(parts) == 2:  # `model_info` without a revision
                    parts += ["revision", "main"]
            if len(parts) < 4:
                return self._error(404, "RepoNotFound", body)
            repo = hub.repos.get("/".join(parts[:2]))
            if repo is None:
                return self._error(404, "RepoNotFound", body)
            revision = unquote(parts[3])
            commit = repo["refs"].get(revision, revision)
            if commit not in repo["commits"]:
                return self._error(404, "RevisionNotFound", body)
            files = repo["commits"][commit]
            if api and parts[2] == "revision":
                siblings = [{"rfilename": name} for name in sorted(files)]
                info = {"id": "/".join(parts[:2]), "sha": commit, "siblings": siblings}
                return self._json({**info, "gated": repo["gated"] and "manual"}, body)
            if api and parts[2] == "tree":
                tree = [
                    {
                        "type": "file",
                        "path": name,
                        "size": len(data),
                        "oid": hashlib.sha1(data).hexdigest(),
                    }
                    for name, data in sorted(files.items())
                ]
                return self._json(tree, body)
            if api or parts[2] != "resolve":
                return self._error(404, "EntryNotFound", body)
            authorization = self.headers.get("Authorization", "")
            if repo["gated"] and authorization != f"Bearer {hub.token}":
                return self._error(401, "GatedRepo", body)
            name = unquote("/".join(parts[4:]))
            if name not in files:
                return self._error(404, "EntryNotFound", body, commit)
            data = files[name]
            headers = [
                ("X-Repo-Commit", commit),
                ("ETag", f'"{hashlib.sha256(data).hexdigest()}"'),
                ("Content-Type", "application/octet-stream"),
            ]
            self._send(200, headers, data, body)

    return Handler
