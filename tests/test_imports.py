"""DESIGN.md import rules, each a test: adjcap -> libraries only; actors -> adjcap; jobs -> actors,
adjcap, ray; cli -> jobs, adjcap; nothing imports cli; no import cycles between modules; only
adjcap/demo, tests and benchmarks import adjcap.demo; no module imports another module's private name."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("adjcap", "actors", "jobs")
FORBIDDEN = {
    "adjcap": {"ray", "actors", "jobs", "cli"},
    "actors": {"jobs", "cli"},
    "jobs": {"cli"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "cli.py"]
    return {_module_name(p): p for p in files}


def _import_nodes(path: Path):
    """(imported module, names) for every absolute import anywhere in the file (function-local too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]


def _imports(path: Path) -> set[str]:
    return {mod.split(".")[0] for mod, _ in _import_nodes(path)}


def _internal_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> project modules it imports (``from a.b import c`` counts a.b.c when c is a module)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for mod, names in _import_nodes(path):
            targets = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in mods] or ([mod] if mod in mods else [])
            edges[m].update(t for t in targets if t != m)
    return edges


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


def test_no_import_cycles_between_modules():
    """A package's __init__ re-exporting its submodules is not a cycle; everything else is."""
    mods = _sources()
    edges = _internal_edges(mods)
    for m in mods:  # a package may import its own submodules (re-exports)
        edges[m] = {t for t in edges[m] if not t.startswith(m + ".")}
    # an importer of a package really depends on the submodule it names; follow through __init__
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_only_the_demo_wing_imports_the_demo():
    """adjcap.demo is imported only by itself, the demo job (jobs/demo.py), tests and benchmarks."""
    bad = []
    for m, path in _sources().items():
        if m.startswith("adjcap.demo") or m == "jobs.demo":
            continue
        for mod, names in _import_nodes(path):
            if mod.startswith("adjcap.demo") or (mod == "adjcap" and "demo" in names):
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_models_do_not_import_data():
    bad = [f"{p.relative_to(ROOT)} imports {mod}" for p in (ROOT / "adjcap" / "models").rglob("*.py")
           for mod, _ in _import_nodes(p) if mod.startswith("adjcap.data")]
    assert not bad, "\n".join(bad)


def test_no_module_imports_a_private_name():
    files = [*_sources().values(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]
    bad = []
    for path in files:
        for mod, names in _import_nodes(path):
            if not mod.split(".")[0] in {"adjcap", "actors", "jobs", "cli", "benchmarks", "tests"}:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private or any(part.startswith("_") and not part.startswith("__") for part in mod.split(".")):
                bad.append(f"{path.relative_to(ROOT)}: from {mod} import {', '.join(private) or '...'}")
    assert not bad, "\n".join(bad)


def test_actors_import_no_model_math_from_elsewhere():
    # actors may import adjcap (and ray for object refs, torch for device checks) but not jobs
    for f in (ROOT / "actors").rglob("*.py"):
        assert "jobs" not in _imports(f)
