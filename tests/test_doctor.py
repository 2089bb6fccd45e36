"""`adjcap doctor`'s line on bytecode: without it on disk, every Ray worker compiles torch anew."""

import compileall
import sys

from adjcap.machine.doctor import bytecode_status


def test_bytecode_line_says_missing_only_where_nothing_may_write_it(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "adjcap_probe_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    line = bytecode_status(("adjcap_probe_pkg", "no_such_package_here"))
    assert line.startswith("MISSING for adjcap_probe_pkg, and PYTHONDONTWRITEBYTECODE is set"), line
    assert f"-m compileall -q -j 0 {tmp_path / 'site'}" in line
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert bytecode_status(("adjcap_probe_pkg",)) == "not yet for adjcap_probe_pkg (written on their first import)"
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert compileall.compile_dir(str(pkg), quiet=1)
    assert bytecode_status(("adjcap_probe_pkg",)) == "ok"
