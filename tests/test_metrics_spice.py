"""SPICE: missing CoreNLP jars, failed download, digest checks, the launcher and its Java 17 flags."""

import hashlib
import io
import os
import random
import stat
import warnings
import zipfile
from types import SimpleNamespace

import pytest

from adjcap.java.runtime import find_javac, java_major_version
from adjcap.java.trust import MANIFEST_NAME
from adjcap.metrics.spice import (
    CORENLP_JARS,
    CORENLP_ZIP_DIR,
    SpiceConfig,
    SpiceUnavailable,
    compute_spice,
    locate_corenlp,
    spice_command,
    spice_status,
)

PREDS = {"1": "a dog runs on the grass"}
REFS = {"1": ["a dog running on grass", "a brown dog in a field"]}


def test_missing_jars_raise_a_clear_message(tmp_path):
    cfg = SpiceConfig(work_dir=tmp_path / "run", corenlp_dir=tmp_path / "empty")
    with pytest.raises(SpiceUnavailable) as e:
        compute_spice(PREDS, REFS, cfg)
    msg = str(e.value)
    for needle in (*CORENLP_JARS, "eval.spice_jars", "eval.spice_download", str(tmp_path / "empty")):
        assert needle in msg
    status = spice_status(SimpleNamespace(spice=True, spice_jars=str(tmp_path / "empty"), spice_download=False,
                                          java="java", java_mem="2G"), tmp_path)
    assert status.startswith("unavailable")
    assert spice_status(SimpleNamespace(spice=False)).startswith("disabled")


def test_prepare_owns_the_corenlp_download():
    """One owner of every download: the metric's default URL is `adjcap prepare`'s [spice] source
    (sources.toml), and no Python module of the library writes the URL again."""
    from pathlib import Path

    import adjcap
    from adjcap.prepare.corenlp import corenlp_url
    from adjcap.prepare.sources import load_sources

    assert SpiceConfig(work_dir=None).download_url is None
    assert corenlp_url() == load_sources(None)["spice"]["url"]
    root = Path(adjcap.__file__).parent
    assert not [p for p in root.rglob("*.py") if not p.is_symlink() and "nlp.stanford.edu" in p.read_text()]


def test_download_failure_is_clean(tmp_path):
    # a closed port on the loopback: fails at once, no traffic leaves the machine
    cfg = SpiceConfig(work_dir=tmp_path, corenlp_dir=None, download=True,
                      download_url="http://127.0.0.1:9/corenlp.zip", download_timeout=5)
    with pytest.raises(SpiceUnavailable, match="Downloading them failed"):
        locate_corenlp(cfg)
    assert not list((tmp_path / "spice" / "lib").glob("*.jar"))  # nothing half-written


def _fake_corenlp_zip(path):
    with zipfile.ZipFile(path, "w") as z:
        for jar in CORENLP_JARS:
            z.writestr(f"{CORENLP_ZIP_DIR}/{jar}", f"not a real {jar}")  # enough to test extraction
    return path


def _pin(monkeypatch, **digests):
    """Pin extra digests ({file name: {algo: [hex]}}) as if they were in the packaged digests file."""
    import adjcap.java.trust as trust
    import adjcap.prepare.corenlp as unpacker  # `adjcap prepare` unpacks the jars (it owns every download)

    table = {k: dict(v) for k, v in trust.expected_digests().items()}
    for name, algos in digests.items():
        table[name] = {a: frozenset(d) for a, d in algos.items()}
    monkeypatch.setattr(trust, "expected_digests", lambda: table)
    monkeypatch.setattr(unpacker, "expected_digests", lambda: table)


def _sha(path, algo="sha256"):
    return hashlib.new(algo, path.read_bytes()).hexdigest()


def test_a_zip_that_does_not_match_its_digest_is_not_extracted(tmp_path):
    zpath = _fake_corenlp_zip(tmp_path / "corenlp.zip")
    cfg = SpiceConfig(work_dir=tmp_path / "run", download=True, download_url=zpath.as_uri(),
                      download_dir=tmp_path / "cache")
    with pytest.raises(SpiceUnavailable, match="sha1 differs"):
        locate_corenlp(cfg)
    assert not list((tmp_path / "cache").glob("*.jar"))


def test_download_extracts_the_two_jars_of_a_verified_zip(tmp_path, monkeypatch):
    zpath = _fake_corenlp_zip(tmp_path / "corenlp.zip")
    _pin(monkeypatch, **{f"{CORENLP_ZIP_DIR}.zip": {"sha1": [_sha(zpath, "sha1")]}})
    cfg = SpiceConfig(work_dir=tmp_path / "run", download=True, download_url=zpath.as_uri(),
                      download_dir=tmp_path / "cache")
    core, models = locate_corenlp(cfg)
    assert core == tmp_path / "cache" / CORENLP_JARS[0] and models.exists()
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700
    # found again without downloading: the jars match the manifest written when they were extracted
    cfg.download = False
    assert locate_corenlp(cfg) == (core, models)
    core.write_bytes(b"changed after extraction")
    with pytest.raises(SpiceUnavailable, match="not a verified copy"):
        locate_corenlp(cfg)


def test_user_jars_are_verified_and_a_zip_in_spice_jars_is_used(tmp_path, monkeypatch):
    jars = tmp_path / "jars"
    jars.mkdir()
    for jar in CORENLP_JARS:
        (jars / jar).write_bytes(b"PK planted")
    cfg = SpiceConfig(work_dir=tmp_path / "run", corenlp_dir=jars)
    with pytest.raises(SpiceUnavailable, match="not a verified copy of stanford-corenlp-3.6.0"):
        locate_corenlp(cfg)
    # the zip beside them (its digest pinned) is used instead: the jars come from it
    zpath = _fake_corenlp_zip(jars / f"{CORENLP_ZIP_DIR}.zip")
    _pin(monkeypatch, **{f"{CORENLP_ZIP_DIR}.zip": {"sha1": [_sha(zpath, "sha1")]}})
    core, _ = locate_corenlp(cfg)
    assert core == tmp_path / "run" / "spice" / "lib" / CORENLP_JARS[0]


def test_jars_extracted_by_adjcap_into_a_private_dir_are_accepted_there(tmp_path, monkeypatch):
    """What `adjcap prepare spice` can do: extract_corenlp into {data}/spice/lib leaves a manifest."""
    from adjcap.prepare.corenlp import extract_corenlp

    zpath = _fake_corenlp_zip(tmp_path / "corenlp.zip")
    _pin(monkeypatch, **{f"{CORENLP_ZIP_DIR}.zip": {"sha1": [_sha(zpath, "sha1")]}})
    dest = tmp_path / "data" / "spice" / "lib"
    dest.mkdir(parents=True, mode=0o700)
    extract_corenlp(zpath, dest, source=str(zpath))
    cfg = SpiceConfig(work_dir=tmp_path / "run", corenlp_dir=dest)
    assert locate_corenlp(cfg)[0] == dest / CORENLP_JARS[0]
    os.chmod(dest, 0o777)  # a manifest in a directory others can write is not trusted
    with pytest.raises(SpiceUnavailable):
        locate_corenlp(cfg)


def test_a_shared_spice_dir_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "spice").mkdir(parents=True)
    os.chmod(run / "spice", 0o777)
    jars = tmp_path / "jars"
    jars.mkdir()
    cfg = SpiceConfig(work_dir=run, corenlp_dir=jars)
    with pytest.raises(SpiceUnavailable, match="writable by other users"):
        locate_corenlp(SpiceConfig(work_dir=run, corenlp_dir=jars, download=True,
                                   download_url="http://127.0.0.1:9/x.zip"))
    assert cfg.spice_dir == run / "spice"


def test_launcher_command_and_failure_path(tmp_path, monkeypatch):
    jars = tmp_path / "jars"
    jars.mkdir()
    for jar in CORENLP_JARS:  # empty (valid) jars: SPICE starts, then misses CoreNLP's classes
        with zipfile.ZipFile(jars / jar, "w"):
            pass
    _pin(monkeypatch, **{j: {"sha256": [_sha(jars / j)]} for j in CORENLP_JARS})
    cfg = SpiceConfig(work_dir=tmp_path / "run", corenlp_dir=jars, mem="1G", threads=1)
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    cmd = spice_command(cfg, tmp_path / "in.json", tmp_path / "out.json", scratch)
    assert "-Xmx1G" in cmd and "-subset" in cmd and "-silent" in cmd
    assert str(tmp_path / "run" / "spice" / "cache") in cmd  # cache in the run dir, not site-packages
    assert stat.S_IMODE(os.stat(tmp_path / "run" / "spice" / "cache").st_mode) == 0o700
    cp = cmd[cmd.index("-cp") + 1].split(os.pathsep)
    assert not any(p.endswith("*") for p in cp)  # every classpath entry is named, no wildcard
    if java_major_version() >= 9:
        assert "--add-opens" in cmd and "java.base/java.lang=ALL-UNNAMED" in cmd
    if find_javac() is not None:
        assert cmd[cmd.index("-cp") + 2] == "edu.anu.spice.AdjcapSpiceRunner"
        assert cp[0] == str(scratch / "runner")  # compiled for this run, in its private scratch dir
        assert (scratch / "runner" / "edu" / "anu" / "spice" / "AdjcapSpiceRunner.class").exists()
    with pytest.raises(SpiceUnavailable, match="SPICE failed") as e:
        compute_spice(PREDS, REFS, cfg)
    assert "edu/stanford/nlp" in str(e.value) or "edu.stanford.nlp" in str(e.value)
    assert not list((tmp_path / "run" / "spice").glob("spice-*.json"))  # temp files not left in the run


def test_from_eval_cfg():
    ev = SimpleNamespace(spice=True, spice_jars="/opt/corenlp", spice_download=True, java="/usr/bin/java",
                         java_mem="12G")
    cfg = SpiceConfig.from_eval_cfg(ev, "/runs/x", cache_dir="/c")
    assert (str(cfg.corenlp_dir), cfg.download, cfg.java, cfg.mem) == ("/opt/corenlp", True, "/usr/bin/java", "12G")
    assert str(cfg.spice_dir) == "/runs/x/spice" and str(cfg.download_dir) == "/c/spice/lib"


def _corenlp_zip_bytes(tmp_path, entries=None) -> bytes:
    """A tiny CoreNLP zip (two jars of incompressible bytes, stored) or one with the given entries."""
    rnd = random.Random(3)
    entries = entries or [(f"{CORENLP_ZIP_DIR}/{jar}", rnd.randbytes(16 * 1024)) for jar in CORENLP_JARS]
    p = tmp_path / "crafted.zip"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names, on purpose
        with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
            for name, data in entries:
                z.writestr(name, data)
    return p.read_bytes()


def test_eval_download_goes_through_the_prepare_downloader_stall_resume_and_leftovers(tmp_path, monkeypatch):
    """eval.spice_download uses `adjcap prepare`'s downloader: a stalled server ends at the deadline
    with the bytes kept, the next call resumes them with Range + If-Range, a killed run's half
    extraction is removed, and nothing is left but the verified jars and their manifest."""
    from test_prepare_deadlines import Slow

    body = _corenlp_zip_bytes(tmp_path)
    _pin(monkeypatch, **{f"{CORENLP_ZIP_DIR}.zip": {"sha1": [hashlib.sha1(body).hexdigest()]}})
    lib = tmp_path / "cache"
    with Slow("stall-after", head=5000, body=body) as s:
        cfg = SpiceConfig(work_dir=tmp_path / "run", download=True, download_url=s.url, download_dir=lib,
                          download_timeout=1)
        with pytest.raises(SpiceUnavailable, match=r"Downloading them failed: http://127\.0\.0\.1:\d+/files/body\.bin: no data for 1 s"):
            locate_corenlp(cfg)
        part = lib / ".download" / f"{CORENLP_ZIP_DIR}.zip.partial"
        assert part.read_bytes() == body[:5000] and not list(lib.glob("*.jar"))
        half = lib / ".extract-k1ll3d"  # what a run killed while extracting would leave
        half.mkdir()
        (half / "stanford-corenlp-3.6.0.jar").write_bytes(b"half")
        s.mode = "ok"
        core, models = locate_corenlp(cfg)
        assert s.requests[1:] == [("bytes=5000-", s.etag)]
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        assert core.read_bytes() == z.read(f"{CORENLP_ZIP_DIR}/{CORENLP_JARS[0]}")
        assert models.read_bytes() == z.read(f"{CORENLP_ZIP_DIR}/{CORENLP_JARS[1]}")
    assert sorted(p.name for p in lib.iterdir()) == sorted([*CORENLP_JARS, ".prepare-run.lock", MANIFEST_NAME])


def test_eval_download_refuses_a_hostile_zip_even_with_a_matching_digest(tmp_path, monkeypatch):
    """The extraction is `adjcap prepare`'s: a pinned zip whose jar appears twice (in another case) is
    refused whole, nothing is extracted and the download is not kept."""
    from test_prepare_deadlines import Slow

    jar = f"{CORENLP_ZIP_DIR}/{CORENLP_JARS[0]}"
    body = _corenlp_zip_bytes(tmp_path, [(jar, b"genuine"), (f"{CORENLP_ZIP_DIR}/{CORENLP_JARS[1]}", b"m"),
                                         (jar.upper(), b"planted")])
    _pin(monkeypatch, **{f"{CORENLP_ZIP_DIR}.zip": {"sha1": [hashlib.sha1(body).hexdigest()]}})
    lib = tmp_path / "cache"
    with Slow("ok", body=body) as s:
        cfg = SpiceConfig(work_dir=tmp_path / "run", download=True, download_url=s.url, download_dir=lib)
        with pytest.raises(SpiceUnavailable, match="appears twice"):
            locate_corenlp(cfg)
    assert [p.name for p in lib.iterdir()] == [".prepare-run.lock"]
