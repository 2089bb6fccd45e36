"""METEOR 1.5 through pycocoevalcap's jar, speaking the same stdio protocol as pycocoevalcap's
``Meteor`` wrapper (one ``SCORE`` line per image, then one ``EVAL`` line over all statistics), so
the numbers are identical. Differences: the requests are pipelined (a writer thread) instead of
one round trip per image, Java's stderr goes to a file (a full pipe cannot stall it), a dead or
failing jar raises a :class:`MetricError` with its stderr instead of hanging on a held lock, and
the heap size is configurable.

:func:`meteor_scores` is what evaluations call: it cuts captions longer than
:data:`MAX_METEOR_CHARS` (a 100,000-character caption makes METEOR's aligner exhaust a 2 GB heap and
the JVM die) and says how many it cut, and it turns a METEOR failure into "METEOR missing, because
..." instead of losing the other metrics.
"""

from __future__ import annotations

import atexit
import logging
import subprocess
import tempfile
import threading
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from adjcap.java.runtime import MetricError, find_java, pycocoevalcap_dir, tail

log = logging.getLogger(__name__)

# Real captions are well under 300 characters; 1,000 keeps METEOR's alignment search small (a
# 100,000-character caption exhausts a 2 GB heap) while never touching an ordinary caption.
MAX_METEOR_CHARS = 1000


def meteor_jar() -> Path:
    jar = pycocoevalcap_dir() / "meteor" / "meteor-1.5.jar"
    if not jar.exists():
        raise MetricError(f"METEOR jar not found at {jar}; reinstall pycocoevalcap==1.2")
    return jar


class MeteorScorer:
    """A running METEOR process; use as a context manager, call :meth:`compute_score` any number
    of times (e.g. once per NoCaps domain)."""

    def __init__(self, *, java: str = "java", mem: str = "2G", tmp_dir: str | Path | None = None):
        jar = meteor_jar()
        exe = find_java(java)
        self._stderr = tempfile.TemporaryFile(dir=tmp_dir)
        # same arguments as pycocoevalcap; cwd = the jar's directory so that data/paraphrase-en.gz
        # is found exactly as there
        cmd = [exe, "-jar", f"-Xmx{mem}", jar.name, "-", "-", "-stdio", "-l", "en", "-norm"]
        self._proc = subprocess.Popen(
            cmd, cwd=str(jar.parent), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._lock = threading.Lock()

    # ---- protocol ------------------------------------------------------------------------
    @staticmethod
    def _score_line(hypothesis: str, references: Sequence[str]) -> str:
        hypothesis = hypothesis.replace("|||", "").replace("  ", " ")
        return " ||| ".join(("SCORE", " ||| ".join(references), hypothesis))

    def _fail(self, what: str) -> MetricError:
        self._stderr.seek(0)
        err = self._stderr.read()
        code = self._proc.poll()
        return MetricError(
            f"METEOR {what} (java exit code {code}). If it ran out of memory raise the heap "
            f"(METEOR uses -Xmx2G by default). stderr: {tail(err)}"
        )

    def _readline(self) -> bytes:
        line = self._proc.stdout.readline()
        if not line:
            raise self._fail("stopped before answering")
        return line

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]]
    ) -> tuple[float, list[float]]:
        """Same inputs and outputs as pycocoevalcap's ``Meteor.compute_score`` (tokenised text)."""
        if gts.keys() != res.keys():
            raise ValueError("METEOR: references and predictions must have the same image ids")
        ids = list(gts.keys())
        if not ids:
            raise ValueError("METEOR: nothing to score")
        for i in ids:
            if len(res[i]) != 1:
                raise ValueError(f"METEOR: image {i!r} needs exactly one prediction, got {len(res[i])}")
        requests = [self._score_line(res[i][0], gts[i]) for i in ids]
        with self._lock:
            if self._proc.poll() is not None:
                raise self._fail("is not running")
            writer_error: list[BaseException] = []

            def write() -> None:
                try:
                    for r in requests:
                        self._proc.stdin.write((r + "\n").encode())
                    self._proc.stdin.flush()
                except BaseException as e:  # broken pipe: reported by the reader below
                    writer_error.append(e)

            t = threading.Thread(target=write, daemon=True)
            t.start()
            stats = []
            try:
                for _ in ids:
                    stats.append(self._readline().decode().strip())
            finally:
                t.join()
            if writer_error:
                raise self._fail(f"could not be fed ({writer_error[0]!r})")
            eval_line = "EVAL ||| " + " ||| ".join(stats)
            try:
                self._proc.stdin.write((eval_line + "\n").encode())
                self._proc.stdin.flush()
            except OSError as e:
                raise self._fail(f"could not be fed ({e!r})") from e
            try:
                scores = [float(self._readline().strip()) for _ in ids]
                score = float(self._readline().strip())
            except ValueError as e:
                raise self._fail(f"answered something that is not a number ({e})") from e
        return score, scores

    # ---- lifetime ------------------------------------------------------------------------
    def alive(self) -> bool:
        proc = getattr(self, "_proc", None)
        return proc is not None and proc.poll() is None

    def close(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is None:
            return
        try:
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        self._stderr.close()
        self._proc = None

    def __enter__(self) -> MeteorScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def clip_caption(text: str, limit: int = MAX_METEOR_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, at a word boundary when there is one."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    return cut[:space] if space > limit // 2 else cut


@dataclass
class MeteorOutcome:
    """METEOR of one corpus: corpus score and per-image scores (raw, 0-1), or None with the reason
    in ``note``; ``note`` also says when over-long captions were cut."""

    score: float | None
    per_image: list[float] | None
    note: str | None = None


def meteor_scores(
    gts: Mapping[Hashable, Sequence[str]],
    res: Mapping[Hashable, Sequence[str]],
    *,
    meteor: MeteorScorer | None = None,
    java: str = "java",
    limit: int = MAX_METEOR_CHARS,
) -> MeteorOutcome:
    """METEOR for an evaluation: captions (predictions and references) over ``limit`` characters
    are cut (with a warning that says how many), and a :class:`MetricError` (no Java, the JVM died,
    ...) gives ``score=None`` with the reason instead of an exception."""
    n_cut = 0

    def clip(t: str) -> str:
        nonlocal n_cut
        c = clip_caption(t, limit)
        n_cut += c is not t
        return c

    g = {i: [clip(r) for r in refs] for i, refs in gts.items()}
    r = {i: [clip(c) for c in caps] for i, caps in res.items()}
    cut_note = None
    if n_cut:
        cut_note = f"{n_cut} captions longer than {limit} characters were cut to {limit} for METEOR only"
        log.warning("METEOR: %s", cut_note)
    try:
        met = meteor if meteor is not None else shared_meteor(java)
        score, per = met.compute_score(g, r)
    except MetricError as e:
        reason = " ".join(str(e).split())  # one line
        return MeteorOutcome(None, None, f"n/a: {reason[:500]}" + (f"; {cut_note}" if cut_note else ""))
    return MeteorOutcome(score, per, cut_note)


# METEOR takes seconds to start (it loads its paraphrase table), so one process per
# (java, heap) is kept for the life of the Python process and shared by every evaluation.
_SHARED: dict[tuple[str, str], MeteorScorer] = {}
_SHARED_LOCK = threading.Lock()


def shared_meteor(java: str = "java", mem: str = "2G") -> MeteorScorer:
    """The process-wide METEOR scorer for this java and heap (restarted if it died)."""
    key = (java, mem)
    with _SHARED_LOCK:
        m = _SHARED.get(key)
        if m is None or not m.alive():
            if m is not None:
                m.close()
            m = MeteorScorer(java=java, mem=mem)
            _SHARED[key] = m
        return m


def try_shared_meteor(java: str = "java", mem: str = "2G") -> MeteorScorer | None:
    """:func:`shared_meteor`, or None when METEOR cannot start (the evaluation then reports METEOR
    missing with the reason, from :func:`meteor_scores`)."""
    try:
        return shared_meteor(java, mem)
    except MetricError:
        return None


@atexit.register
def close_shared() -> None:
    """Stop the shared METEOR processes."""
    with _SHARED_LOCK:
        for m in _SHARED.values():
            m.close()
        _SHARED.clear()
