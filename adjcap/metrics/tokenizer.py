"""PTB tokenisation exactly as pycocoevalcap's ``PTBTokenizer`` does it.

Same jar (``stanford-corenlp-3.4.1.jar`` shipped in pycocoevalcap/tokenizer), same flags
(``-preserveLines -lowerCase``), same punctuation removal. The difference is where the temporary
input file lives: pycocoevalcap writes it into its own package directory, which fails when
site-packages is read-only; here it goes to ``tmp_dir`` (the run directory) or the system temp dir.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

from adjcap.java.runtime import MetricError, find_java, pycocoevalcap_dir, tail

# the punctuation tokens pycocoevalcap drops after tokenising (its PUNCTUATIONS list)
PUNCTUATIONS = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)

_TOKENIZER_CLASS = "edu.stanford.nlp.process.PTBTokenizer"


def tokenizer_jar() -> Path:
    jar = pycocoevalcap_dir() / "tokenizer" / "stanford-corenlp-3.4.1.jar"
    if not jar.exists():
        raise MetricError(f"PTB tokenizer jar not found at {jar}; reinstall pycocoevalcap==1.2")
    return jar


def _clean(text: str) -> str:
    # pycocoevalcap replaces '\n'; a bare '\r' (or other Java line terminators) would also split a
    # line in the Java reader and shift every following caption, so they become spaces too.
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\u2028", " ").replace(
        "\u2029", " "
    ).replace("\x85", " ")


def ptb_tokenize(
    captions: Mapping[Hashable, Sequence[str]],
    *,
    java: str = "java",
    tmp_dir: str | Path | None = None,
    timeout: float = 1800.0,
) -> dict[Hashable, list[str]]:
    """{id: [caption, ...]} -> {id: [tokenised caption, ...]} (lower-cased, punctuation removed).

    Output order and grouping follow the input. One Java process for all captions.
    """
    ids: list[Hashable] = []
    lines: list[str] = []
    for key, caps in captions.items():
        if isinstance(caps, str):
            raise TypeError(f"captions for {key!r} must be a list of strings, not a string")
        for c in caps:
            if not isinstance(c, str):
                raise TypeError(f"caption for {key!r} is {type(c).__name__}, expected str: {c!r}")
            ids.append(key)
            lines.append(_clean(c))
    out: dict[Hashable, list[str]] = {k: [] for k in captions}
    if not lines:
        return out
    exe = find_java(java)
    jar = tokenizer_jar()
    if tmp_dir is not None:
        Path(tmp_dir).mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="ptb-", suffix=".txt", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write("\n".join(lines).encode("utf-8"))
        cmd = [exe, "-cp", str(jar), _TOKENIZER_CLASS, "-preserveLines", "-lowerCase", name]
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise MetricError(f"PTB tokenizer timed out after {timeout:.0f}s on {len(lines)} captions") from e
    finally:
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
    if proc.returncode != 0:
        raise MetricError(f"PTB tokenizer failed (exit {proc.returncode}): {tail(proc.stderr)}")
    token_lines = proc.stdout.decode("utf-8").split("\n")
    if len(token_lines) < len(lines):
        raise MetricError(
            f"PTB tokenizer returned {len(token_lines)} lines for {len(lines)} captions; "
            f"stderr: {tail(proc.stderr)}"
        )
    for key, line in zip(ids, token_lines):
        out[key].append(" ".join(w for w in line.rstrip().split(" ") if w not in PUNCTUATIONS))
    return out
