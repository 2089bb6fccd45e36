"""The import rules (docs/architecture.md, "Layers"), each a test: the library (adjcap.*) -> libraries
only; adjcap.actors -> the library; adjcap.jobs -> adjcap.actors, the library, ray; adjcap.cli -> jobs,
the library; nothing imports adjcap.cli; no import cycles between modules; only adjcap/demo, tests and
benchmarks import adjcap.demo; no module imports another module's private name.

The application layer lives in the repository's jobs/, actors/ and cli.py, reached as adjcap.jobs,
adjcap.actors and adjcap.cli through the links in adjcap/ (one layout). The library's one import of it
is adjcap/__init__ exposing the Python API lazily (adjcap.jobs.api, inside a function); the entry
point adjcap/__main__ runs adjcap.cli."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = {"adjcap.jobs": ROOT / "jobs", "adjcap.actors": ROOT / "actors"}  # the application layer's folders
CLI = "adjcap.cli"
FORBIDDEN = {  # layer -> what it never imports
    "library": {"ray", "adjcap.actors", "adjcap.jobs", CLI},
    "adjcap.actors": {"adjcap.jobs", CLI},
    "adjcap.jobs": {CLI},
}
# the library's modules that may import the application layer, and what (inside a function only)
ENTRIES = {"adjcap": {"adjcap.jobs.api"}, "adjcap.__main__": {CLI}}


def _layer(module: str) -> str:
    return next((a for a in APP if module == a or module.startswith(a + ".")), "library" if module != CLI else CLI)


def _module_name(path: Path) -> str:
    for name, folder in APP.items():
        if path.is_relative_to(folder):
            parts = [*name.split("."), *path.relative_to(folder).with_suffix("").parts]
            break
    else:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    """module name -> file, for the library (adjcap/ without its links), the application layer's
    folders and cli.py (pathlib's rglob does not follow the links adjcap/jobs and adjcap/actors)."""
    files = [*(ROOT / "adjcap").rglob("*.py"), *(p for f in APP.values() for p in f.rglob("*.py"))]
    files = [f for f in files if not f.is_symlink()]
    out = {_module_name(p): p for p in files}
    out[CLI] = ROOT / "cli.py"
    return out


def _hits(mod: str, names: list[str], prefixes: set[str]) -> set[str]:
    """What an import statement brings in (``from a import b``: a.b) that is or lies under a prefix."""
    targets = [f"{mod}.{n}" for n in names] or [mod]
    return {t for t in targets for p in prefixes if t == p or t.startswith(p + ".") or p == mod}


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


def _module_level_imports(path: Path) -> set[str]:
    """Top-level names imported outside any function (what importing the module runs)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                out.update(a.name.split(".")[0] for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.add(child.module.split(".")[0])
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return out


def test_import_rules():
    bad = []
    for m, path in _sources().items():
        forbidden = FORBIDDEN.get(_layer(m), set())
        allowed = ENTRIES.get(m, set())
        for mod, names in _import_nodes(path):
            hit = {h for h in _hits(mod, names, forbidden) if not _hits(h, [], allowed)}
            if "ray" in forbidden and mod.split(".")[0] == "ray":
                hit.add(mod)
            if hit:
                bad.append(f"{path.relative_to(ROOT)} ({m}) imports {sorted(hit)}")
        if allowed and {x for x in _module_level_imports(path)} & {"ray"}:
            bad.append(f"{path.relative_to(ROOT)} imports ray at module level")
    assert not bad, "\n".join(bad)


def test_entry_points_import_only_their_layer_and_nothing_imports_them():
    """adjcap/__init__ -> adjcap.jobs.api, adjcap/__main__ -> adjcap.cli, each inside a function or
    as the entry point's whole body; no module imports adjcap.__main__ or adjcap.cli, and only
    adjcap/__init__ imports the facade adjcap.jobs.api."""
    bad = []
    init = _sources()["adjcap"]
    tree = ast.parse(init.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("adjcap.") for n in top):
        bad.append("adjcap/__init__.py imports the project at module level")
    for m, path in _sources().items():
        for mod, names in _import_nodes(path):
            full = {mod, *(f"{mod}.{n}" for n in names)}
            if "adjcap.__main__" in full:
                bad.append(f"{path.relative_to(ROOT)} imports adjcap.__main__")
            if CLI in full and m != "adjcap.__main__":
                bad.append(f"{path.relative_to(ROOT)} imports adjcap.cli")
            if "adjcap.jobs.api" in full and m != "adjcap":
                bad.append(f"{path.relative_to(ROOT)} imports adjcap.jobs.api")
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
        if m.startswith("adjcap.demo") or m == "adjcap.jobs.demo":
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
            if not mod.split(".")[0] in {"adjcap", "benchmarks", "tests"}:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private or any(part.startswith("_") and not part.startswith("__") for part in mod.split(".")):
                bad.append(f"{path.relative_to(ROOT)}: from {mod} import {', '.join(private) or '...'}")
    assert not bad, "\n".join(bad)


def test_actors_import_no_model_math_from_elsewhere():
    # actors may import adjcap (and ray for object refs, torch for device checks) but not jobs
    for f in APP["adjcap.actors"].rglob("*.py"):
        assert not any(_hits(m, n, {"adjcap.jobs"}) for m, n in _import_nodes(f)), f
