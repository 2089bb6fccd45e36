"""Which TCP sockets a process tree listens on, read from /proc (Linux; no psutil needed)."""

from __future__ import annotations

import ipaddress
import os
import struct
from pathlib import Path

LISTEN = "0A"


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, []))
    return out


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _addr(hex_addr: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_addr)
    if not v6:
        return str(ipaddress.IPv4Address(struct.unpack("<I", raw)[0]))
    words = struct.unpack("<4I", raw)
    return str(ipaddress.IPv6Address(b"".join(struct.pack(">I", w) for w in words)))


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """[(pid, local address, port)] of the TCP sockets in LISTEN state that ``pids`` hold."""
    by_inode: dict[str, int] = {}
    for pid in pids:
        for ino in _socket_inodes(pid):
            by_inode[ino] = pid
    out = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, state, inode = f[1], f[3], f[9]
            if state != LISTEN or inode not in by_inode:
                continue
            host, port = local.split(":")
            out.append((by_inode[inode], _addr(host, v6), int(port, 16)))
    return out


def is_loopback(addr: str) -> bool:
    """127.0.0.0/8, ::1, and IPv4-mapped loopback (::ffff:127.0.0.1)."""
    ip = ipaddress.ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
