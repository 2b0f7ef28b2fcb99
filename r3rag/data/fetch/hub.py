"""Resumable, checksummed downloads of single files from a Hugging Face repository.

``huggingface_hub`` builds the URL (``{endpoint}/datasets/{repo}/resolve/{revision}/{path}``; the
endpoint is ``HF_ENDPOINT`` unless given), the headers (token, user agent) and does the transfer
(:func:`huggingface_hub.file_download.http_get`: ``Range`` requests, retries that resume inside
one process, a progress bar). What it no longer does since ``hf_hub_download`` gives every
download a process-unique temporary name and deletes it on failure is *continue after the process
was killed*; so the partial bytes live here in ``FILE.<etag>.part``:

1. ``HEAD`` the file (:func:`remote_file`): its commit, ETag and size. For a file stored with Git
   LFS (every data file of these releases) the ETag is the content's sha256.
2. Append to ``FILE.<etag16>.part`` from its current size (``Range: bytes=N-``); part files of
   another ETag (the file changed upstream) are deleted first, so old bytes are never joined to
   new ones.
3. Check the size, then the sha256 against the ETag when it is one; a mismatch deletes the part
   file and raises :class:`CorruptDownload` naming the file; only then rename to ``FILE``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from r3rag.errors import R3RagError

SHA256 = re.compile(r"^[0-9a-f]{64}$")
HASH_CHUNK = 8 << 20


class FetchError(R3RagError):
    """A download or conversion failed; the message is one line naming the file."""


class CorruptDownload(FetchError):
    """A downloaded file's bytes do not match the checksum it was published with."""


@dataclass(frozen=True)
class RemoteFile:
    repo: str
    path: str
    revision: str
    commit: str
    etag: str
    size: int | None
    url: str  # where the bytes are (after the hub's redirect, if any)
    resolve_url: str  # the hub's own URL of the file

    @property
    def sha256(self) -> str | None:
        """The published sha256 (the ETag of an LFS file), or None for a plain git file."""
        return self.etag if SHA256.match(self.etag) else None

    @property
    def source(self) -> str:
        return f"{self.repo}@{self.commit[:12]}:{self.path}"


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a failed hub request raises: huggingface_hub's HTTP errors and its HTTP client's
    (``httpx2`` in huggingface_hub 2.x, ``httpx`` before)."""
    import importlib

    from huggingface_hub.errors import HfHubHTTPError

    errs: list[type[BaseException]] = [HfHubHTTPError]
    for mod in ("httpx2", "httpx"):
        try:
            errs.append(importlib.import_module(mod).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


def _hub_error(repo: str, path: str, err: Exception, endpoint: str | None) -> FetchError:
    """One line for a hub failure: not found, unreachable, refused."""
    from huggingface_hub import constants

    where = endpoint or constants.ENDPOINT
    name = type(err).__name__
    first = getattr(err, "server_message", None) or (str(err).strip().splitlines() or [name])[0]
    if "NotFound" in name:
        return FetchError(f"{repo}: {path}: not found on {where} ({name}: {first})")
    return FetchError(f"{repo}: {path}: cannot fetch from {where} ({name}: {first})")


def remote_file(repo: str, path: str, revision: str = "main", endpoint: str | None = None,
                repo_type: str = "dataset") -> RemoteFile:
    """Metadata of one file, from a ``HEAD`` of its resolve URL."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import get_hf_file_metadata

    url = hf_hub_url(repo, path, repo_type=repo_type, revision=revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint)
    except (*_network_errors(), OSError, ValueError) as err:
        raise _hub_error(repo, path, err, endpoint) from None
    if not meta.commit_hash or not meta.etag:
        raise FetchError(f"{repo}: {path}: {url} answered without X-Repo-Commit/ETag headers: "
                         "HF_ENDPOINT does not point at a Hugging Face Hub")
    return RemoteFile(repo, path, revision, meta.commit_hash, meta.etag, meta.size, meta.location or url, url)


def part_path(dest: Path, etag: str) -> Path:
    return dest.with_name(f"{dest.name}.{etag[:16]}.part")


def partial_bytes(dest: Path, remote: RemoteFile) -> int:
    """Bytes of ``remote`` already downloaded towards ``dest`` (0 when none)."""
    part = part_path(dest, remote.etag)
    return part.stat().st_size if part.is_file() else 0


def file_sha256(path: Path, progress: bool = False, label: str | None = None) -> str:
    """sha256 of a file, read in 8 MB blocks (a progress bar for big files when asked)."""
    from tqdm import tqdm

    h = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as fh, tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {label or path.name}",
                                     disable=not progress or size < (256 << 20), leave=False) as bar:
        while block := fh.read(HASH_CHUNK):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


def download(remote: RemoteFile, dest: Path, progress: bool = True) -> str:
    """Download ``remote`` to ``dest``, continuing a part file left by an earlier run; returns the
    sha256 of the finished file (checked against the published one where there is one)."""
    from urllib.parse import urlparse

    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest, remote.etag)
    for stale in dest.parent.glob(f"{dest.name}.*.part"):
        if stale != part:
            stale.unlink()
    done = part.stat().st_size if part.is_file() else 0
    if remote.size is not None and done > remote.size:  # not a prefix of this file: start again
        part.unlink()
        done = 0
    headers = build_hf_headers()
    if urlparse(remote.url).netloc != urlparse(remote.resolve_url).netloc:
        headers.pop("authorization", None)  # a signed CDN URL: the token stays with the hub
    try:
        with part.open("ab") as fh:
            http_get(remote.url, fh, resume_size=done, headers=headers, expected_size=remote.size,
                     displayed_filename=remote.path, tqdm_class=None if progress else _quiet_tqdm())
    except (*_network_errors(), ValueError) as err:
        raise _hub_error(remote.repo, remote.path, err, remote.resolve_url.split("/datasets/")[0]) from None
    except OSError as err:
        if "Consistency check failed" in str(err):
            got = part.stat().st_size if part.is_file() else 0
            part.unlink(missing_ok=True)
            raise CorruptDownload(f"{dest}: received {got} bytes, the hub said {remote.size}; rerun to download it again") from None
        raise
    digest = file_sha256(part, progress=progress, label=remote.path)
    if remote.sha256 is not None and digest != remote.sha256:
        part.unlink()
        raise CorruptDownload(f"{dest}: corrupt download (sha256 {digest[:12]}..., published {remote.sha256[:12]}...); "
                              "deleted, rerun to download it again")
    part.replace(dest)
    return digest


def _quiet_tqdm() -> type:
    """A tqdm class that draws nothing (``--quiet``)."""
    from tqdm.auto import tqdm

    class Quiet(tqdm):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Quiet
