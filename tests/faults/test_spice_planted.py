"""Files planted by another local user where SPICE used to look (a fixed $TMPDIR/adjcap-spice) are
never executed, and jars that fail verification leave SPICE reported missing, with the reason."""

import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest

from adjcap.config import EvalCfg
from adjcap.metrics.evaluate import evaluate_predictions
from adjcap.java.runtime import find_javac
from adjcap.metrics.spice import CORENLP_JARS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

# what an attacker would plant: SPICE's launcher class (and, in fake CoreNLP jars, SPICE's own main)
# that leaves a marker file when run
PLANTED = """package edu.anu.spice;
public final class {name} {{
    public static void main(String[] a) throws Exception {{
        java.nio.file.Files.writeString(java.nio.file.Path.of("{marker}"), "ran");
    }}
}}
"""


def _compile_planted(work: Path, marker: Path) -> Path:
    javac = find_javac()
    if javac is None:
        pytest.fail("this test needs a JDK (javac) to build the planted classes")
    src = work / "src" / "edu" / "anu" / "spice"
    src.mkdir(parents=True)
    for name in ("AdjcapSpiceRunner", "SpiceScorer"):
        (src / f"{name}.java").write_text(PLANTED.format(name=name, marker=marker))
    out = work / "classes"
    subprocess.run([javac, "-d", str(out), *map(str, src.glob("*.java"))], check=True, timeout=300)
    return out


def _plant_jar(path: Path, classes: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for f in classes.rglob("*.class"):
            z.write(f, f.relative_to(classes).as_posix())


def _give_away(path: Path) -> None:
    """Make ``path`` look like another user's (when running as root) and world-writable."""
    for p in [path, *path.rglob("*")]:
        if os.geteuid() == 0:
            os.chown(p, 65534, 65534)
        os.chmod(p, 0o777)


def test_planted_launcher_and_jars_are_never_run(tmp_path, monkeypatch, small_coco):
    pred, refs, _ = small_coco
    shared_tmp = tmp_path / "shared-tmp"  # stands for /tmp: world-writable, sticky
    shared_tmp.mkdir()
    os.chmod(shared_tmp, 0o1777)
    marker = tmp_path / "PLANTED-CODE-RAN"
    classes = _compile_planted(tmp_path / "attacker", marker)

    old = shared_tmp / "adjcap-spice" / "spice"  # the fixed directory older versions used
    runner = old / "runner"
    runner.mkdir(parents=True)
    subprocess.run(["cp", "-r", f"{classes}/.", str(runner)], check=True)
    for jar in CORENLP_JARS:
        _plant_jar(old / "lib" / jar, classes)
        _plant_jar(shared_tmp / jar, classes)
    _give_away(shared_tmp / "adjcap-spice")
    # the attacker's jars in a directory of the user's own (e.g. copied there unknowingly)
    own = tmp_path / "own-jars"
    for jar in CORENLP_JARS:
        _plant_jar(own / jar, classes)

    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    monkeypatch.setenv("ADJCAP_CACHE", str(tmp_path / "user-cache"))
    assert tempfile.gettempdir() == str(shared_tmp)

    # 1. a plain evaluation (no spice_jars): SPICE missing (jars not found), nothing planted runs
    rep = evaluate_predictions(pred, refs, fmt="coco", spice_cfg=EvalCfg(spice=True))
    assert not marker.exists(), "a class planted in the shared temp dir was executed"
    assert rep["metrics"]["SPICE"] is None and "not found" in rep["notes"]["SPICE"]
    assert rep["metrics"]["CIDEr"] is not None and rep["metrics"]["METEOR"] is not None
    assert not marker.exists()

    # 2. pointed at the planted jars: refused (other people can change them), never run
    for where, why in ((old / "lib", "can be changed by other users"), (shared_tmp, "can be changed by other users"),
                       (own, "not a verified copy")):
        rep = evaluate_predictions(pred, refs, fmt="coco", spice_cfg=EvalCfg(spice=True, spice_jars=str(where)))
        assert not marker.exists(), f"a planted jar in {where} was executed"
        note = rep["notes"]["SPICE"]
        assert rep["metrics"]["SPICE"] is None and why in note, (where, note)
        assert "\n" not in note  # one line
        assert rep["metrics"]["CIDEr"] is not None
        assert not marker.exists()
