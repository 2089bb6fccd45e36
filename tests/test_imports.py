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


def _modules(path: Path) -> set[str]:
    """Full dotted names of every absolute import in ``path`` (function-local imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_demo_wing_stays_apart():
    """Only adjcap/demo, tests, benchmarks and the demo job import adjcap.demo; the model loaders
    import no benchmark data code."""
    bad = []
    for f in [*ROOT.glob("adjcap/**/*.py"), *ROOT.glob("actors/**/*.py")]:
        if (ROOT / "adjcap" / "demo") in f.parents:
            continue
        if any(m == "adjcap.demo" or m.startswith("adjcap.demo.") for m in _modules(f)):
            bad.append(f"{f.relative_to(ROOT)} imports adjcap.demo")
    for f in ROOT.glob("adjcap/models/*.py"):
        if any(m == "adjcap.data" or m.startswith("adjcap.data.") for m in _modules(f)):
            bad.append(f"{f.relative_to(ROOT)} imports adjcap.data")
    assert not bad, "\n".join(bad)
