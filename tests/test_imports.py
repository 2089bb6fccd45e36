"""DESIGN.md import rules: adjcap -> libraries only; actors -> adjcap; jobs -> actors, adjcap, ray;
cli -> jobs, adjcap; nothing imports cli."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "adjcap": {"ray", "actors", "jobs", "cli"},
    "actors": {"jobs", "cli"},
    "jobs": {"cli"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_import_rules():
    bad = []
    for pkg, forbidden in FORBIDDEN.items():
        for f in (ROOT / pkg).rglob("*.py"):
            hit = _imports(f) & forbidden
            if hit:
                bad.append(f"{f.relative_to(ROOT)} imports {sorted(hit)}")
    for f in [*ROOT.glob("adjcap/**/*.py"), *ROOT.glob("actors/**/*.py"), *ROOT.glob("jobs/**/*.py")]:
        if "cli" in _imports(f):
            bad.append(f"{f.relative_to(ROOT)} imports cli")
    assert not bad, "\n".join(bad)


def test_actors_import_no_model_math_from_elsewhere():
    # actors may import adjcap (and ray for decorators, torch for device checks) but not jobs
    for f in (ROOT / "actors").rglob("*.py"):
        assert "jobs" not in _imports(f)
