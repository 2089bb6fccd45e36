"""The embedded local Ray listens on loopback only, and its auth token file is private (0600)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from .listening import is_loopback

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]

# run in a fresh interpreter: Ray's token loader and node state are per process
PROBE = r"""
import json, os, sys
import ray
from adjcap.config import Config
from pathlib import Path
from adjcap.jobs.ray_session import ray_session
from tests.faults.listening import comm, descendants, listening

with ray_session(Config()):
    @ray.remote
    def pid():
        return os.getpid()
    workers = ray.get([pid.remote() for _ in range(2)])
    socks = [(p, comm(p), a, port) for p, a, port in listening(descendants(os.getpid()))]
    node_ip = ray.util.get_node_ip_address()
tok = Path.home() / ".ray" / "auth_token"  # where Ray writes it (RAY_AUTH_TOKEN_PATH unset)
print("PROBE " + json.dumps({"sockets": socks, "workers": workers, "node_ip": node_ip, "token": str(tok),
                             "token_exists": tok.exists(),
                             "token_mode": (os.stat(tok).st_mode & 0o777) if tok.exists() else None,
                             "dir_mode": os.stat(tok.parent).st_mode & 0o777}))
"""


def test_local_ray_binds_loopback_and_keeps_its_token_private(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    out = json.loads(line[len("PROBE "):])
    socks = out["sockets"]
    names = {s[1] for s in socks}
    assert "gcs_server" in names and "raylet" in names, socks  # we really looked at Ray's servers
    exposed = [s for s in socks if not is_loopback(s[2])]
    assert not exposed, f"Ray sockets listening beyond loopback: {exposed}"
    assert is_loopback(out["node_ip"])
    assert out["token"] == str(home / ".ray" / "auth_token")
    assert out["token_exists"], "token authentication is expected to be on for a local Ray"
    assert stat.S_IMODE(out["token_mode"]) == 0o600
    assert out["dir_mode"] == 0o700
