"""What keeps a driver's Ray from failing users silently:

* :func:`reap_with_driver` - the embedded local Ray never outlives its driver. Ray's own servers and
  workers end when their driver is killed, but not all of them (its dashboard agent and runtime-env
  agent were still running a minute after a SIGKILL). A small reaper process, started with the
  embedded Ray, waits on a pipe from the driver; when the pipe closes (the driver exited or was
  killed: the kernel closes it either way), it kills every process that still has a file open in
  that Ray session's directory (Ray's servers, agents and workers all keep their logs open there).
* :class:`ClusterWatch` - a cluster that goes away ends the job in one line. A driver joined to a
  cluster (``--address``) checks that the cluster's GCS still accepts connections; when it has not for
  :data:`LOST_AFTER_S` seconds, the driver prints adjcap's one line (which cluster, that completed
  parts are kept, to rerun) and exits with :data:`EXIT_LOST_CLUSTER`, before Ray's own core worker
  gives up (after 60 s, with a page of C++ log and exit code 1).

This module imports only the standard library at its top: ``python -m adjcap.jobs.ray_guards FD``
is the reaper.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

LOST_AFTER_S = 20.0  # a GCS that refuses connections this long is gone (Ray itself gives up after 60 s)
CHECK_EVERY_S = 2.0
EXIT_LOST_CLUSTER = 69  # EX_UNAVAILABLE (sysexits.h): a service the command needs is unavailable


# -- the embedded Ray dies with its driver ----------------------------------------------------------------


def session_processes(session_dir: str | os.PathLike, exclude: set[int] = frozenset()) -> set[int]:
    """Pids of the processes with a file open under ``session_dir`` (Linux /proc; others: none)."""
    root = os.path.realpath(session_dir) + os.sep
    out: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit() or int(name) in exclude:
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith(root):
                out.add(int(name))
                break
    return out


def kill_session(session_dir: str | os.PathLike, exclude: set[int], within_s: float = 10.0) -> set[int]:
    """SIGKILL every process of the session until none is left (or ``within_s`` passed); returns the
    pids that were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = session_processes(session_dir, exclude)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    return killed


class Lifeline:
    """The driver's end of the reaper's pipe (:func:`reap_with_driver`)."""

    def __init__(self, pipe, reaper: subprocess.Popen):
        self.pipe, self.reaper = pipe, reaper

    def close(self, wait_s: float = 15.0) -> None:
        """Close the pipe (after ``ray.shutdown()``) and wait until the reaper has ended what was left of
        the session: a process the driver starts next (Java for the metrics) is forked with the driver's
        open files, among them Ray's session logs, and the reaper would take it for one of Ray's."""
        self.pipe.close()
        try:
            self.reaper.wait(wait_s)  # kill_session gives up after 10 s
        except subprocess.TimeoutExpired:
            pass


def reap_with_driver(session_dir: str, code_root: str | os.PathLike) -> Lifeline:
    """Start the reaper of the embedded Ray whose session directory is ``session_dir``; returns the
    pipe's write end, which the driver keeps open while Ray runs and closes after ``ray.shutdown()``
    (an exit or a kill closes it too). ``code_root``: the folder holding the ``adjcap`` package."""
    r, w = os.pipe()  # not inherited by the processes the driver starts later (PEP 446)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(code_root), os.environ.get("PYTHONPATH")])))
    reaper = subprocess.Popen([sys.executable, "-m", "adjcap.jobs.ray_guards", str(r), str(os.getpid()), session_dir],
                              pass_fds=(r,), env=env, start_new_session=True,  # a terminal's Ctrl-C does not reach it
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(r)
    return Lifeline(os.fdopen(w, "wb", buffering=0), reaper)


def _reaper(fd: int, driver: int, session_dir: str) -> None:
    with os.fdopen(fd, "rb") as pipe:
        while pipe.read(4096):  # returns b"" once every write end is closed: the driver is gone or done
            pass
    # the driver may still live (it closed the pipe after ray.shutdown()): never kill it
    kill_session(session_dir, exclude={os.getpid(), driver})


# -- a lost cluster ends the job in one line ---------------------------------------------------------------


def _answers(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class ClusterWatch:
    """A daemon thread that watches the cluster's GCS (``host:port``) while the driver is joined to it."""

    def __init__(self, address: str, gcs_address: str, lost_after_s: float = LOST_AFTER_S,
                 every_s: float = CHECK_EVERY_S):
        host, _, port = gcs_address.rpartition(":")
        self.address, self.gcs, self.host, self.port = address, gcs_address, host, int(port)
        self.lost_after_s, self.every_s = lost_after_s, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adjcap-cluster-watch", daemon=True)

    def message(self, seconds: float) -> str:
        gcs = "its GCS" if self.gcs == self.address else f"its GCS at {self.gcs}"
        return (f"error: lost the Ray cluster at {self.address} ({gcs} has not answered for "
                f"{seconds:.0f} s): completed feature parts are kept; once the cluster is back, rerun the same "
                "command to resume")

    def __enter__(self) -> "ClusterWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _run(self) -> None:
        since = None
        while not self._stop.wait(self.every_s):
            if _answers(self.host, self.port):
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= self.lost_after_s and not self._stop.is_set():
                sys.stderr.write(self.message(time.monotonic() - since) + "\n")
                sys.stderr.flush()
                os._exit(EXIT_LOST_CLUSTER)  # the main thread may be blocked inside Ray's C++ core: end here


if __name__ == "__main__":
    _reaper(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
