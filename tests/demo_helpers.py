"""Helpers shared by the demo tests: free ports, process checks by PID, running startup/server.sh."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_SH = ROOT / "startup" / "server.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Running and not a zombie (an exited child nobody reaped yet counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "")
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (what the service may have spawned)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid and alive(int(entry.name)):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def listening_addresses(port: int) -> set[str]:
    """IPv4 addresses with a socket in LISTEN state on ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        ip_hex, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(ip_hex)[::-1]))
    return found


def server_sh(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run startup/server.sh from the repository root (``env``: extra environment variables)."""
    full_env = dict(os.environ, **(env or {}))
    cmd = ["bash", str(SERVER_SH), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=full_env)
