"""A stand-in Hugging Face Hub: serves repositories from memory with the hub's URL layout and headers.

Code that downloads through ``huggingface_hub`` is pointed at it with ``HF_ENDPOINT`` (or
``endpoint=``), so tests exercise the real client against the same protocol, offline:

``HEAD|GET /{datasets|models}/{owner}/{name}/resolve/{revision}/{path}`` (models also without the
prefix) answers with ``X-Repo-Commit`` (the revision's commit), an ``ETag`` (a plain git file: its
git blob sha1; a Git LFS file: its sha256, also in ``X-Linked-Etag`` with ``X-Linked-Size``),
``Content-Length``, ``Accept-Ranges: bytes``; ``Range: bytes=N-`` gets ``206`` with
``Content-Range``. ``GET /api/{datasets|models}/{owner}/{name}[/revision/{revision}]`` gives the
repository info (``sha``, ``siblings`` with sizes). Unknown repository, revision or file: ``404``
with the ``X-Error-Code`` huggingface_hub maps to its errors (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``).

For failure tests: ``delay_s`` sleeps between ``chunk_bytes`` chunks of a body (a slow link, to
kill a client mid-download); :meth:`HubStandin.tamper` serves a file with one byte flipped while
its headers keep the published checksum (a corrupted transfer). Every request is logged in
``requests`` (method, path, Range header).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from r3rag.testing.standin_judge import free_port
from r3rag.testing.threaded_server import ThreadedServer


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandin(ThreadedServer):
    label = "stand-in hub"

    """``HubStandin({"datasets/owner/name": {"path": b"..."}}).start()``; ``.url`` is the endpoint."""

    def __init__(self, repos: dict[str, dict[str, bytes]] | None = None, lfs: bool = True,
                 chunk_bytes: int = 64 << 10, delay_s: float = 0.0, host: str = "127.0.0.1", port: int = 0) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.lfs = lfs
        self.chunk_bytes = chunk_bytes
        self.delay_s = delay_s
        self.host = host
        self.port = port or free_port(host)
        self.requests: list[dict[str, Any]] = []
        self.tampered: set[tuple[str, str]] = set()
        for key, files in (repos or {}).items():
            self.add(key, files)
        self.app = self._build_app()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def add(self, key: str, files: dict[str, bytes]) -> None:
        """Add or replace repository ``key`` (``datasets/owner/name`` or ``models/owner/name``)."""
        kind = key.split("/", 1)[0]
        if kind not in ("datasets", "models") or key.count("/") != 2:
            raise ValueError(f"repository key {key!r}: expected datasets/OWNER/NAME or models/OWNER/NAME")
        self.repos[key] = dict(files)

    def commit(self, key: str) -> str:
        h = hashlib.sha1()
        for path, data in sorted(self.repos[key].items()):
            h.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()

    def tamper(self, key: str, path: str) -> None:
        """Serve ``path`` with its middle byte flipped (headers unchanged)."""
        self.tampered.add((key, path))

    def _body(self, key: str, path: str) -> bytes:
        data = self.repos[key][path]
        if (key, path) in self.tampered and data:
            i = len(data) // 2
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        return data

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="r3rag stand-in Hugging Face Hub")

        def not_found(code: str, message: str, commit: str | None = None) -> Response:
            headers = {"X-Error-Code": code, "X-Error-Message": message}
            if commit:
                headers["X-Repo-Commit"] = commit
            return JSONResponse({"error": message}, status_code=404, headers=headers)

        def find(kind: str, owner: str, name: str, revision: str) -> tuple[str, str] | Response:
            key = f"{kind}/{owner}/{name}"
            if key not in self.repos:
                return not_found("RepoNotFound", f"Repository {owner}/{name} not found")
            commit = self.commit(key)
            if revision not in ("main", commit):
                return not_found("RevisionNotFound", f"Revision {revision} not found")
            return key, commit

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "repos": sorted(self.repos)}

        async def info(kind: str, owner: str, name: str, revision: str = "main") -> Response:
            found = find(kind, owner, name, revision)
            if isinstance(found, Response):
                return found
            key, commit = found
            siblings = [{"rfilename": p, "size": len(d)} for p, d in sorted(self.repos[key].items())]
            return JSONResponse({"id": f"{owner}/{name}", "sha": commit, "siblings": siblings, "private": False})

        app.add_api_route("/api/{kind}/{owner}/{name}", info, methods=["GET"])
        app.add_api_route("/api/{kind}/{owner}/{name}/revision/{revision}", info, methods=["GET"])

        async def resolve(request: Request, owner: str, name: str, revision: str, path: str, kind: str = "models") -> Response:
            self.requests.append({"method": request.method, "path": f"{kind}/{owner}/{name}/{path}",
                                  "range": request.headers.get("range")})
            found = find(kind, owner, name, revision)
            if isinstance(found, Response):
                return found
            key, commit = found
            if path not in self.repos[key]:
                return not_found("EntryNotFound", f"{path} does not exist at {revision}", commit)
            published = self.repos[key][path]
            size = len(published)
            headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            if self.lfs:
                sha = hashlib.sha256(published).hexdigest()
                headers.update({"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(size)})
            else:
                headers["ETag"] = f'"{git_blob_sha1(published)}"'
            start, status = 0, 200
            rng = request.headers.get("range")
            if rng:
                try:
                    first, _, last = rng.removeprefix("bytes=").partition("-")
                    start = int(first)
                    end = int(last) if last else size - 1
                except ValueError:
                    return JSONResponse({"error": f"bad Range {rng!r}"}, status_code=400)
                if start >= size or end < start:
                    return Response(status_code=416, headers={"Content-Range": f"bytes */{size}", **headers})
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            else:
                end = size - 1
            headers["Content-Length"] = str(end - start + 1)
            if request.method == "HEAD":
                return Response(status_code=status, headers=headers)
            body = self._body(key, path)[start:end + 1]

            async def stream():
                for i in range(0, len(body), self.chunk_bytes):
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    yield body[i:i + self.chunk_bytes]

            return StreamingResponse(stream(), status_code=status, headers=headers)

        async def resolve_kind(request: Request, kind: str, owner: str, name: str, revision: str, path: str) -> Response:
            if kind not in ("datasets", "models"):
                return JSONResponse({"error": "not found"}, status_code=404)
            return await resolve(request, owner, name, revision, path, kind)

        app.add_api_route("/{kind}/{owner}/{name}/resolve/{revision}/{path:path}", resolve_kind, methods=["GET", "HEAD"])
        app.add_api_route("/{owner}/{name}/resolve/{revision}/{path:path}", resolve, methods=["GET", "HEAD"])
        return app
