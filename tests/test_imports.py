"""DESIGN.md import rules, each a test: adjcap -> libraries only; actors -> adjcap; jobs -> actors,
adjcap, ray; cli -> jobs, adjcap; nothing imports cli; no import cycles between modules; only
adjcap/demo, tests and benchmarks import adjcap.demo; no module imports another module's private name.

The distribution's two entry points live in the adjcap folder but sit at the top of the chain, beside
cli.py: adjcap/__main__.py (the console script) runs cli, and adjcap/api.py (the Python API) runs jobs.
They may import exactly that, only inside functions (``import adjcap`` loads neither), under the
installed name first (adjcap._cli, adjcap._jobs: setup.py installs cli.py and jobs/ there) and the
checkout's name second. Nothing imports them but adjcap/__init__ (api, lazily)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("adjcap", "actors", "jobs")
FORBIDDEN = {
    "adjcap": {"ray", "actors", "jobs", "cli"},
    "actors": {"jobs", "cli"},
    "jobs": {"cli"},
}
# entry module -> what it may import inside its functions: the checkout's name, and the installed one
ENTRIES = {"adjcap/__main__.py": ({"cli"}, {"adjcap._cli"}), "adjcap/api.py": ({"jobs"}, {"adjcap._jobs"})}
INSTALLED = {"adjcap._cli", "adjcap._jobs", "adjcap._actors"}


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
    for pkg, forbidden in FORBIDDEN.items():
        for f in (ROOT / pkg).rglob("*.py"):
            rel = f.relative_to(ROOT).as_posix()
            allowed = ENTRIES.get(rel, (set(), set()))[0]
            hit = _imports(f) & (forbidden - allowed)
            if hit:
                bad.append(f"{rel} imports {sorted(hit)}")
            if rel in ENTRIES and _module_level_imports(f) & forbidden:
                bad.append(f"{rel} imports {sorted(_module_level_imports(f) & forbidden)} at module level")
    for f in [*ROOT.glob("adjcap/**/*.py"), *ROOT.glob("actors/**/*.py"), *ROOT.glob("jobs/**/*.py")]:
        if "cli" in _imports(f) and f.relative_to(ROOT).as_posix() not in ENTRIES:
            bad.append(f"{f.relative_to(ROOT)} imports cli")
    assert not bad, "\n".join(bad)


def test_entry_points_import_only_their_layer_and_nothing_imports_them():
    """adjcap/__main__.py -> cli, adjcap/api.py -> jobs (inside functions, installed name first);
    no project module imports adjcap.__main__, and only adjcap/__init__ imports adjcap.api."""
    bad = []
    for rel, (names, installed) in ENTRIES.items():
        mods = {m for m, _ in _import_nodes(ROOT / rel)}
        app = {m for m in mods if m.split(".")[0] in {"jobs", "actors", "cli"} or ".".join(m.split(".")[:2]) in INSTALLED}
        wrong = {m for m in app if m.split(".")[0] not in names and ".".join(m.split(".")[:2]) not in installed}
        if wrong:
            bad.append(f"{rel} imports {sorted(wrong)}")
        if not any(".".join(m.split(".")[:2]) in installed for m in mods):
            bad.append(f"{rel} does not try the installed name {sorted(installed)}")
    for m, path in _sources().items():
        for mod, names in _import_nodes(path):
            if mod == "adjcap.__main__" or (mod == "adjcap" and "__main__" in names):
                bad.append(f"{path.relative_to(ROOT)} imports adjcap.__main__")
            if (mod == "adjcap.api" or (mod == "adjcap" and "api" in names)) and m != "adjcap":
                bad.append(f"{path.relative_to(ROOT)} imports adjcap.api")
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
            if ".".join(mod.split(".")[:2]) in INSTALLED and path.relative_to(ROOT).as_posix() in ENTRIES:
                continue  # an entry point trying the installed layout (see the module docstring)
            if private or any(part.startswith("_") and not part.startswith("__") for part in mod.split(".")):
                bad.append(f"{path.relative_to(ROOT)}: from {mod} import {', '.join(private) or '...'}")
    assert not bad, "\n".join(bad)


def test_actors_import_no_model_math_from_elsewhere():
    # actors may import adjcap (and ray for object refs, torch for device checks) but not jobs
    for f in (ROOT / "actors").rglob("*.py"):
        assert "jobs" not in _imports(f)
