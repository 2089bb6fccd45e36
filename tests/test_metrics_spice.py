"""SPICE: missing CoreNLP jars, failed download, the launcher and its Java 17 flags."""

import zipfile
from types import SimpleNamespace

import pytest

from adjcap.metrics.java import find_javac, java_major_version
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
            z.writestr(f"{CORENLP_ZIP_DIR}/{jar}", b"")  # not real jars: enough to test extraction


def test_download_extracts_the_two_jars(tmp_path):
    zpath = tmp_path / "corenlp.zip"
    _fake_corenlp_zip(zpath)
    cfg = SpiceConfig(work_dir=tmp_path / "run", download=True, download_url=zpath.as_uri(),
                      download_dir=tmp_path / "cache")
    core, models = locate_corenlp(cfg)
    assert core == tmp_path / "cache" / CORENLP_JARS[0] and models.exists()


def test_launcher_command_and_failure_path(tmp_path):
    jars = tmp_path / "jars"
    jars.mkdir()
    for jar in CORENLP_JARS:  # empty (valid) jars: SPICE starts, then misses CoreNLP's classes
        with zipfile.ZipFile(jars / jar, "w"):
            pass
    cfg = SpiceConfig(work_dir=tmp_path / "run", corenlp_dir=jars, mem="1G", threads=1)
    cmd = spice_command(cfg, tmp_path / "in.json", tmp_path / "out.json")
    assert "-Xmx1G" in cmd and "-subset" in cmd and "-silent" in cmd
    assert str(tmp_path / "run" / "spice" / "cache") in cmd  # cache in the run dir, not site-packages
    if java_major_version() >= 9:
        assert "--add-opens" in cmd and "java.base/java.lang=ALL-UNNAMED" in cmd
    if find_javac() is not None:
        assert cmd[cmd.index("-cp") + 2] == "edu.anu.spice.AdjcapSpiceRunner"
        assert (tmp_path / "run" / "spice" / "runner" / "edu" / "anu" / "spice" / "AdjcapSpiceRunner.class").exists()
    with pytest.raises(SpiceUnavailable, match="SPICE failed") as e:
        compute_spice(PREDS, REFS, cfg)
    assert "edu/stanford/nlp" in str(e.value) or "edu.stanford.nlp" in str(e.value)
    assert not list((tmp_path / "run" / "spice").glob("spice-*.json"))  # temp files removed


def test_from_eval_cfg():
    ev = SimpleNamespace(spice=True, spice_jars="/opt/corenlp", spice_download=True, java="/usr/bin/java",
                         java_mem="12G")
    cfg = SpiceConfig.from_eval_cfg(ev, "/runs/x", cache_dir="/c")
    assert (str(cfg.corenlp_dir), cfg.download, cfg.java, cfg.mem) == ("/opt/corenlp", True, "/usr/bin/java", "12G")
    assert str(cfg.spice_dir) == "/runs/x/spice" and str(cfg.download_dir) == "/c/spice/lib"
