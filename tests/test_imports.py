"""The import rules (docs/architecture.md, "Layers"), each a test: the library (adjcap.*) -> libraries
only; adjcap.actors -> the library; adjcap.jobs -> adjcap.actors, the library, ray; adjcap.cli -> jobs,
the library; nothing imports adjcap.cli; no import cycles between modules; only adjcap/demo, tests and
benchmarks import adjcap.demo; no module imports another module's private name. Within the
library every import runs down the layers of :data:`LAYERS` (one table, lowest first), and no
module reaches itself through imports; both count imports inside functions and name the file and
line of the offending import.

The application layer lives in the repository's jobs/, actors/ and cli.py, reached as adjcap.jobs,
adjcap.actors and adjcap.cli through the links in adjcap/ (one layout). The library's one import of it
are its two entry points: the Python API adjcap.api (caption and run call the jobs, inside those
functions), exposed lazily by adjcap/__init__, and adjcap/__main__, which runs adjcap.cli."""

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = {"adjcap.jobs": ROOT / "jobs", "adjcap.actors": ROOT / "actors"}  # the application layer's folders
CLI = "adjcap.cli"
FORBIDDEN = {  # layer -> what it never imports
    "library": {"ray", "adjcap.actors", "adjcap.jobs", CLI},
    "adjcap.actors": {"adjcap.jobs", CLI},
    "adjcap.jobs": {CLI},
}
# the library's modules that may import the application layer, and what (inside a function only): the
# package's entry points, the Python API (the jobs it runs) and the command line's
ENTRIES = {"adjcap.api": {"adjcap.jobs.caption", "adjcap.jobs.demo", "adjcap.jobs.run"}, "adjcap.__main__": {CLI}}


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


# The job reads its pools from the run plan alone (RunPlan.pools, adjcap.engine.cluster_plan.PoolPlan: layout, actors,
# batch sizes, runtime environments, and each actor's resources on the cluster's facts): the jobs import
# nothing of the pool planning (adjcap.engine.pools) and, of adjcap.engine.cluster_plan, only the plan's and the cluster's
# data (docs/architecture.md, "Pools")
POOL_PLANNING = "adjcap.engine.pools"
CLUSTER_PLAN = "adjcap.engine.cluster_plan"
CLUSTER_DATA = {"ClusterPlan", "NodeType", "PoolPlan", "ResourceError", "launcher_node_types", "merge_up"}


def test_the_jobs_read_their_pools_from_the_run_plan_alone():
    bad = []
    for m, path in _sources().items():
        if _layer(m) != "adjcap.jobs":
            continue
        for mod, names in _import_nodes(path):
            targets = [f"{mod}.{n}" for n in names] if names else [mod]
            for t in targets:
                if t == POOL_PLANNING or t.startswith(POOL_PLANNING + "."):
                    bad.append(f"{path.relative_to(ROOT)} imports {t}: read the run plan's pools (RunPlan.pools)")
                elif t == CLUSTER_PLAN or (t.startswith(CLUSTER_PLAN + ".") and t.rsplit(".", 1)[1] not in CLUSTER_DATA):
                    bad.append(f"{path.relative_to(ROOT)} imports {t}: plan through the run plan's PoolPlan "
                               f"(the jobs take only {', '.join(sorted(CLUSTER_DATA))})")
    assert not bad, "\n".join(bad)


def test_entry_points_import_only_their_layer_and_nothing_imports_them():
    """adjcap/__init__ -> adjcap.api (inside a function), adjcap.api -> the jobs it runs (inside
    caption and run), adjcap/__main__ -> adjcap.cli; no module imports adjcap.__main__ or adjcap.cli,
    and only adjcap/__init__ imports the Python API adjcap.api."""
    bad = []
    init = _sources()["adjcap"]
    tree = ast.parse(init.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "adjcap" for n in top):
        bad.append("adjcap/__init__.py imports the project at module level")
    api = ast.parse(_sources()["adjcap.api"].read_text())
    for n in api.body:  # the Python API imports the application layer only inside the functions that run a job
        if isinstance(n, ast.ImportFrom) and _hits(n.module or "", [a.name for a in n.names], FORBIDDEN["library"]):
            bad.append(f"adjcap/api.py:{n.lineno} imports the application layer at module level")
    for m, path in _sources().items():
        for mod, names in _import_nodes(path):
            full = {mod, *(f"{mod}.{n}" for n in names)}
            if "adjcap.__main__" in full:
                bad.append(f"{path.relative_to(ROOT)} imports adjcap.__main__")
            if CLI in full and m != "adjcap.__main__":
                bad.append(f"{path.relative_to(ROOT)} imports adjcap.cli")
            if "adjcap.api" in full and m != "adjcap":
                bad.append(f"{path.relative_to(ROOT)} imports adjcap.api")
    assert not bad, "\n".join(bad)


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


# The layers, lowest first (docs/architecture.md, "Layers"): a module imports its own layer and the
# layers below it, never one above, counting imports inside functions. A module's layer is the
# entry with the longest prefix of its name; every module has one (a new module is added here).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # helpers that know nothing of a run: "did you mean", the one deep merge and flattener of nested
    # settings, the pickers' names and needs (what the config checks without torch); storage's files
    # written atomically, their content ids, the one file lock and the one Parquet part writer; the
    # machine's numerics and accelerators; of the models, the LAVIS environment, beam search, the entity
    # filter and the dispatch audit (host reads and KV bytes per decode step); of the engine, the
    # feature row's schema, the verifier families' records (the config reads them without torch), what
    # counts as a GPU failure and the CPU half of an image transform
    # (pixel_prep: the decode tasks resize and crop for the pools' models). A package's entry here
    # holds its __init__ and those of its modules that no longer entry below names.
    ("foundations", ("adjcap.registry", "adjcap.nested", "adjcap.picker_needs", "adjcap.storage", "adjcap.machine",
                     "adjcap.models.lavis_env", "adjcap.models.decoding", "adjcap.models.entities",
                     "adjcap.models.dispatch_audit", "adjcap.engine.features", "adjcap.engine.gpu_errors", "adjcap.engine.verifier_families",
                     "adjcap.engine.pixel_prep")),
    # reading benchmarks and corpora: files in, records out (knows no configuration)
    ("data", ("adjcap.data",)),
    # the configuration (a package, one job a module): the schema, the keys and "did you mean", the presets,
    # loading with overrides, validation (checks names against the data layouts and picker needs)
    ("settings", ("adjcap.config",)),
    # a run directory's layout: the one writer and reader of a run (reads its config back)
    ("run directory", ("adjcap.storage.rundir",)),
    # the frozen models and the caption corpus index they search
    ("models", ("adjcap.models",)),
    ("index", ("adjcap.index",)),
    # the engine (adjcap/engine/): one image through the stages, its state, the stage functions, the
    # stage registry (stages and model families as data, the captioner families stage 3 picks from) and
    # the pools it lays out, identities, the stage cache, the transport between pools, where a pool's
    # last actor writes its batch (batch_sink), the in-process pipeline, a job's run plan (records,
    # corpus, identities, pools, run directory: built once at the edge); and what made a run (provenance)
    ("stages", ("adjcap.engine", "adjcap.storage.provenance")),
    # the learned rerankers over the feature table
    ("rerank", ("adjcap.rerank",)),
    # Java and the jars it runs: found and trusted, shared by needs, prepare and the metrics
    ("java", ("adjcap.java",)),
    # what a config needs on this machine (looked up, never fetched)
    ("needs", ("adjcap.machine.needs",)),
    # the paper's tables as data and the runs they need
    ("reproduce plans", ("adjcap.reproduce",)),
    # fetching and laying out everything (the one owner of downloads)
    ("prepare", ("adjcap.prepare",)),
    # the caption metrics (they ask prepare for SPICE's jars)
    ("metrics", ("adjcap.metrics",)),
    # the per-image samples table (metrics per image, CHAIR objects)
    ("samples", ("adjcap.storage.samples",)),
    # what a user reads of runs: reports, reproduced tables, the doctor, tracking
    ("views", ("adjcap.report", "adjcap.machine.doctor")),
    # the demo world and its tiny models (reads everything below to build and check itself)
    ("demo", ("adjcap.demo",)),
    # the application layer: thin actors, the Ray jobs and the Python API facade, the console script
    ("actors", ("adjcap.actors",)),
    ("jobs", ("adjcap.jobs",)),
    ("cli", ("adjcap.cli",)),
]
# the package's entry points sit above everything: adjcap/__init__ (the Python API, lazily), the Python
# API adjcap.api and __main__ (the command line)
ENTRY_MODULES = ("adjcap", "adjcap.api", "adjcap.__main__")


def _rank(module: str) -> tuple[int, str] | None:
    """(layer index, layer name) of a module, or None when no entry of LAYERS names it."""
    if module in ENTRY_MODULES:
        return len(LAYERS), "entry"
    best = None
    for i, (name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), i, name)
    return None if best is None else (best[1], best[2])


def _located_edges(mods: dict[str, Path]):
    """(importer, imported project module, file, line) for every import anywhere in every file."""
    for m, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pairs = [(a.name, []) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                pairs = [(node.module, [a.name for a in node.names])]
            else:
                continue
            for mod, names in pairs:
                targets = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in mods] or ([mod] if mod in mods else [])
                for t in targets:
                    if t != m and not t.startswith(m + "."):  # a package importing its own submodules
                        yield m, t, path, node.lineno


def test_the_package_root_keeps_few_modules():
    """The package root keeps the few modules a user imports (at most 15, the links counted); the rest
    live in the subpackages named for what they hold (adjcap/engine, storage, machine, models, ...)."""
    root = sorted(p.name for p in (ROOT / "adjcap").glob("*.py"))
    assert len(root) <= 15, f"{len(root)} modules in adjcap/ (at most 15: move one into its subpackage): {root}"


def test_every_module_has_a_layer():
    missing = sorted(m for m in _sources() if _rank(m) is None)
    assert not missing, "modules without a layer (add them to LAYERS in tests/test_imports.py): " + ", ".join(missing)


def test_imports_run_down_the_layers():
    """No import from a lower layer to a higher one, also inside a function; each named by file and line."""
    mods = _sources()
    bad = []
    for m, t, path, line in _located_edges(mods):
        a, b = _rank(m), _rank(t)
        if a is not None and b is not None and b[0] > a[0]:
            bad.append(f"{path.relative_to(ROOT)}:{line}: {m} ({a[1]}) imports {t} ({b[1]}), a higher layer")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle_counting_imports_inside_functions():
    """No module reaches itself through imports (a package importing its own submodules is not a
    cycle); the cycle is named with the file and line of each of its imports."""
    mods = _sources()
    where: dict[tuple[str, str], str] = {}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, t, path, line in _located_edges(mods):
        edges[m].add(t)
        where.setdefault((m, t), f"{path.relative_to(ROOT)}:{line}")
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                ring = stack[stack.index(t):] + [t]
                cycles.append(" -> ".join(f"{a} ({where[(a, b)]})" for a, b in zip(ring, ring[1:])) + f" -> {t}")
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def import_depth() -> tuple[int, list[str]]:
    """The longest chain of module imports (modules in it, the chain), counting imports inside
    functions: how many layers a change at the bottom can travel up."""
    mods = _sources()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, t, _, _ in _located_edges(mods):
        edges[m].add(t)

    @functools.lru_cache(maxsize=None)
    def chain(m: str) -> tuple[str, ...]:
        return (m, *max((chain(t) for t in sorted(edges[m])), key=len, default=()))

    longest = max((chain(m) for m in sorted(mods)), key=len)
    return len(longest), list(longest)


if __name__ == "__main__":  # `python tests/test_imports.py`: the import graph's depth
    n, longest = import_depth()
    print(f"{n} modules deep: " + " -> ".join(longest))


# Where the config is resolved (docs/architecture.md, "Run plan"): the edges, each once. Everything
# else takes a resolved config or a job's run plan (adjcap.engine.run_plan.RunPlan). A config resolved in the
# expression that loads it (``load_config(...).resolved()``, ``rd.config().resolved()``) is an edge
# by construction and needs no entry here.
RESOLVING_EDGES = {
    "adjcap.cli": {"fit"},  # the command line: the config of `adjcap fit` (and its as-given copy)
    "adjcap.jobs.run": {"main"},  # run-job / adjcap.run: resolved, then the run plan built from it
    "adjcap.jobs.caption": {"main"},  # the caption job's folder config, its run plan built from it
    "adjcap.jobs.demo": {"prepare"},  # the demo world, built before any job plans its run
    "adjcap.jobs.encode_corpus": {"main"},  # adjcap encode-corpus
    "adjcap.api": {"caption"},  # adjcap.caption: where a list of images is staged
    "adjcap.engine.pipeline": {"load_models", "run_pipeline"},  # the in-process driver (tests, notebooks)
    "adjcap.reproduce.plan": {"plan_table"},  # each row of a reproduce table
}


def _resolved_calls(path: Path):
    """(enclosing function's qualified name, line, whether the receiver is a call) of every
    ``.resolved()`` call in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))

    def visit(node: ast.AST, scope: list[str]):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from visit(child, [*scope, child.name])
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr == "resolved" and not child.args):
                yield ".".join(scope) or "<module>", child.lineno, isinstance(child.func.value, ast.Call)
            yield from visit(child, scope)

    yield from visit(tree, [])


def test_the_config_is_resolved_only_at_the_edge_and_once_there():
    bad = []
    for m, path in _sources().items():
        per_function: dict[str, list[int]] = {}
        for fn, line, at_load in _resolved_calls(path):
            per_function.setdefault(fn, []).append(line)
            if not at_load and fn not in RESOLVING_EDGES.get(m, set()):
                bad.append(f"{path.relative_to(ROOT)}:{line}: .resolved() below the edge, in {fn} (take a resolved "
                           "config or the run plan, adjcap.engine.run_plan.RunPlan; or list a new edge in RESOLVING_EDGES)")
        for fn, lines in per_function.items():
            if len(lines) > 1:
                bad.append(f"{path.relative_to(ROOT)}:{lines[1]}: {fn} resolves the config {len(lines)} times "
                           f"(lines {', '.join(map(str, lines))}): once, at the edge")
    for m, fns in RESOLVING_EDGES.items():  # the list stays true: an edge that no longer resolves leaves it
        found = {fn for fn, _, _ in _resolved_calls(_sources()[m])}
        bad += [f"RESOLVING_EDGES names {m}.{fn}, which resolves nothing" for fn in sorted(fns - found)]
    assert not bad, "\n".join(bad)
