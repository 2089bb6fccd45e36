"""Documentation that cannot drift (docs/index.md, "About these pages"): README.md and the MkDocs site
under docs/ are checked against the code they describe.

* the generated references (docs/reference/config.md, docs/reference/cli.md) equal a fresh generation
  from the config models and the Typer app (docs/gen_reference.py);
* ``mkdocs build --strict`` builds the site: no broken link or anchor, no page left out of the navigation;
* every relative link of README.md points at a file (and heading) that exists, and the README stays
  a page or two; every repository path and every ``adjcap.module.Name`` a page names exists, and the
  watching page's metrics table lists exactly the exported metrics, the presets page every preset;
* every ``adjcap`` command in a ``bash`` block of README.md or docs/ names a real command, real options
  and known names (presets, reproduce tables, benchmarks, ``--set`` keys; ``make`` targets and
  ``python script.py`` files too), and every ``adjcap`` name a ``python`` block imports exists;
* the blocks marked ``<!-- test: run -->`` run, command by command, offline on the demo world, and exit 0
  (``<!-- test: run, exit N -->``: exit N, for the pages' examples of refusals).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# docs/benchmarks/ holds dated notes (BENCHMARKS.md's investigations, each describing the code of its
# date): built into the site, but not checked against the current code like the other pages
NOTES = ROOT / "docs" / "benchmarks"
DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md") if NOTES not in p.parents)
BENCHMARKS = ROOT / "BENCHMARKS.md"
GENERATED = {ROOT / "docs" / "reference" / "config.md", ROOT / "docs" / "reference" / "cli.md"}
PAGES = [README, *DOCS]
RUN_MARK = "<!-- test: run -->"
RUN_MARK_RE = re.compile(r"^<!-- test: run(?:, exit (\d+))? -->$")
README_MAX_LINES = 250


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---- reading Markdown ------------------------------------------------------------------------------


def fenced_blocks(path: Path):
    """(language, first line number, body lines, expected exit status) of each fenced code block; the
    status is None unless the block is marked runnable."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        prev = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{fence}\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        mark = RUN_MARK_RE.match(prev)
        yield lang, start, body, (int(mark.group(1) or 0) if mark else None)


def prose(path: Path) -> str:
    """A page without its fenced blocks and code spans (where links and headings live)."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^\s*(`{3,}).*?^\s*\1\s*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def github_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces -> '-')."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^\s*(`{3,}).*?^\s*\1\s*$", "", text, flags=re.S | re.M)
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
        out.add(re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-"))
    return out


def shell_commands(path: Path):
    """(line number, tokens, expected exit status or None) of each simple command in the page's bash blocks;
    continuation lines are joined, comments dropped, pipelines and lists split."""
    for lang, start, body, status in fenced_blocks(path):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        joined: list[tuple[int, str]] = []
        for n, line in enumerate(body, start + 1):
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line)
            else:
                joined.append((n, line))
        for n, line in joined:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens, current = list(lexer), []
            for tok in tokens + [";"]:
                if tok and set(tok) <= set("|&;<>()"):
                    if current:
                        yield n, current, status
                    current = []
                else:
                    current.append(tok)


# ---- the generated references ------------------------------------------------------------------------


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_references_are_current():
    gen = _generator()
    stale = gen.stale()
    assert not stale, "; ".join(f"{page} is out of date: run {gen.REGENERATE}" for page in stale)
    for page in GENERATED:
        assert "do not edit by hand" in page.read_text(encoding="utf-8").splitlines()[0]


def test_config_reference_describes_every_key():
    """Every key the configuration accepts (the list "did you mean" searches) has its row, with a
    description: a new key gets ``Field(..., description=...)`` in adjcap/config/schema.py."""
    from adjcap.config import config_keys

    text = (ROOT / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([^`]+)` \|.*\|(.*)\|$", text, flags=re.M))
    sections = set(re.findall(r"^## `([^`]+)`", text, flags=re.M))
    missing = [k for k in config_keys() if k not in rows and k not in sections and k != "benchmarks"]
    assert not missing, f"keys without a row in docs/reference/config.md: {missing}"
    undescribed = [k for k, desc in rows.items() if not desc.strip()]
    assert not undescribed, f"keys without a description (Field(description=...) in adjcap/config/schema.py): {undescribed}"


def test_metrics_table_is_the_exported_metrics():
    """The metrics table of the watching page lists exactly the metrics the job exports, each with its kind
    (adjcap.actors.metrics owns the names)."""
    from adjcap.actors import metrics

    text = (ROOT / "docs" / "guide" / "watching.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(adjcap_\w+)` \| (\w+)", text, flags=re.M))
    assert rows == metrics.KINDS, (f"docs/guide/watching.md's metrics table {rows} is not "
                                   f"adjcap.actors.metrics.KINDS {metrics.KINDS}")


def test_presets_page_places_every_preset():
    """The presets guide's table says which row of the paper each preset is: every preset has its row, and
    every name in the table is a preset (``a-1`` ... ``a-8`` names the range)."""
    from adjcap.config import list_presets

    text = (ROOT / "docs" / "guide" / "presets.md").read_text(encoding="utf-8")
    named: set[str] = set()
    for cell in re.findall(r"^\| ([^|]*`[^|]*) \|", text, flags=re.M):
        names = re.findall(r"`([\w.-]+)`", cell)
        named.update(names)
        span = re.fullmatch(r"`([\w-]+?)(\d+)` \.\.\. `\1(\d+)`", cell.strip())
        if span:
            named.update(f"{span.group(1)}{i}" for i in range(int(span.group(2)), int(span.group(3)) + 1))
    presets = set(list_presets())
    assert named - presets == set(), f"docs/guide/presets.md names presets that do not exist: {sorted(named - presets)}"
    assert presets - named == set(), f"presets missing from docs/guide/presets.md's table: {sorted(presets - named)}"


# ---- the site ---------------------------------------------------------------------------------------


def test_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.fail("mkdocs-material is not installed: pip install -e '.[docs]' (make installs it with the tests)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in (ROOT / "docs").rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").with_suffix("")
        want = "index.html" if rel.name == "index" else f"{rel.as_posix()}/index.html"
        assert want in built, f"{_rel(page)} was not built"
    _search_finds_every_leaf_key(tmp_path / "site" / "search" / "search_index.json")


def _search_finds_every_leaf_key(index_file: Path) -> None:
    """The site's search index, split into words as the search splits them (its ``separator``), holds every
    configuration key's last part (``gpu_share``, ``decode_tasks``, ``actors``) in the configuration reference."""
    import json

    from adjcap.config import config_keys

    index = json.loads(index_file.read_text(encoding="utf-8"))
    sep = re.compile(index["config"]["separator"])
    words = {w for doc in index["docs"] if doc["location"].startswith("reference/config/")
             for w in sep.split(re.sub(r"<[^>]+>", " ", doc["title"] + " " + doc["text"]).lower()) if w}
    leaves = {k.rpartition(".")[2].lower() for k in config_keys() if not k.endswith(">")}
    missing = sorted(leaves - words)
    assert "gpu_share" in leaves and "decode_tasks" in leaves
    assert not missing, f"the site's search does not find these configuration keys: {missing}"


def test_nested_blocks_are_indented_four_spaces():
    """A code block inside a list item needs four spaces (Python-Markdown, what MkDocs uses; GitHub agrees):
    with fewer it falls out of the list and the rest of the list renders as plain text."""
    problems = []
    for page in DOCS:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if re.match(r"^ {1,3}`{3}", line):
                problems.append(f"{_rel(page)}:{n}")
    assert not problems, "fenced blocks indented by 1-3 spaces (use 4 inside a list item): " + ", ".join(problems)


CODE_WIDTH = 100
SCREEN_PAGES = [README, ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]


def test_code_blocks_fit_the_screen():
    """No line of a code block in README.md, the home page or a guide page is wider than the screen
    (CODE_WIDTH characters): a comment that runs past it scrolls sideways; put it on its own line."""
    wide = [f"{_rel(page)}:{start + i} ({len(line)} chars)" for page in SCREEN_PAGES
            for _, start, body, _ in fenced_blocks(page) for i, line in enumerate(body, 1) if len(line) > CODE_WIDTH]
    assert not wide, f"code block lines wider than {CODE_WIDTH} characters: " + ", ".join(wide)


# ---- the README --------------------------------------------------------------------------------------


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n < README_MAX_LINES, (f"README.md has {n} lines: keep it to what a newcomer needs (under "
                                  f"{README_MAX_LINES}); move the rest into a page under docs/guide/")


def test_readme_links_resolve():
    problems = []
    links = re.findall(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose(README))
    assert links, "README.md links into the docs"
    for target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (README.parent / path).resolve() if path else README
        if not file.exists():
            problems.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file):
            problems.append(f"{target}: {path or 'README.md'} has no heading #{anchor}")
    assert not problems, "README.md links that do not resolve: " + "; ".join(problems)


REPO_PATH = re.compile(r"(?<![\w/.{}~$-])((?:adjcap|tests|benchmarks|deploy|docs|jobs|actors)/[\w./-]*\w)")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_files_the_pages_name_exist(page):
    """Every repository path a page names (``adjcap/engine/identity.py``, ``deploy/Dockerfile``, ...) exists;
    a path with a placeholder part in capitals (``adjcap/presets/NAME.toml``) is a pattern, not a file."""
    text = page.read_text(encoding="utf-8")
    missing = sorted({p for p in REPO_PATH.findall(text)
                      if not any(part.isupper() for part in re.split(r"[/.]", p)) and not (ROOT / p).exists()})
    assert not missing, f"{_rel(page)} names files that do not exist: {missing}"


def _resolves(dotted: str) -> bool:
    """``adjcap.a.b.C`` names a module, or an attribute of the longest importable module prefix."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


# docs/architecture.md also names the alternatives the design rejected (``adjcap._jobs``)
DOTTED_PAGES = [p for p in PAGES if p != ROOT / "docs" / "architecture.md"]


@pytest.mark.parametrize("page", DOTTED_PAGES, ids=_rel)
def test_code_the_pages_name_exists(page):
    """Every ``adjcap.module.Name`` in a page's code spans is importable (a renamed module or class fails)."""
    spans = re.findall(r"`([^`\n]+)`", page.read_text(encoding="utf-8"))
    names = sorted({n for span in spans for n in re.findall(r"(?<![\w/.-])(adjcap(?:\.\w+)+)", span)})
    missing = [n for n in names if not _resolves(n)]
    assert not missing, f"{_rel(page)} names code that does not exist: {missing}"


# ---- commands in the pages ----------------------------------------------------------------------------


def _adjcap_args(tokens: list[str]) -> list[str] | None:
    """The arguments of an adjcap command line (``adjcap``, ``python -m adjcap``, ``python cli.py``)."""
    if tokens[0] == "adjcap":
        return tokens[1:]
    if tokens[0] in ("python", "python3"):
        if tokens[1:3] == ["-m", "adjcap"]:
            return tokens[3:]
        if len(tokens) > 1 and tokens[1] == "cli.py":
            return tokens[2:]
    return None


def _option_names(command) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names.update(getattr(param, "opts", []))
        names.update(getattr(param, "secondary_opts", []))
    return names


def _check_command(tokens: list[str], group, make_targets: set[str], values: bool = True) -> str | None:
    """None when the command line matches the code, else what does not."""
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):  # VAR=value before the command
        tokens = tokens[1:]
    if not tokens:
        return None
    if tokens[0] == "ray" and "--" in tokens:  # ray job submit ... -- COMMAND
        return _check_command(tokens[tokens.index("--") + 1:], group, make_targets, values)
    if tokens[0] == "make":
        unknown = [t for t in tokens[1:] if not t.startswith("-") and "=" not in t and t not in make_targets]
        return f"make has no target {unknown}" if unknown else None
    args = _adjcap_args(tokens)
    if args is None:
        if tokens[0] in ("python", "python3") and len(tokens) > 1 and tokens[1].endswith(".py"):
            return None if (ROOT / tokens[1]).exists() else f"no script {tokens[1]}"
        return None  # ray, curl, pip, ...: not ours to check
    args = [a.strip("[]") for a in args]
    args = [a for a in args if a]
    global_opts = _option_names(group)
    while args and args[0].startswith("-"):
        if args[0].split("=")[0] not in global_opts:
            return f"adjcap has no option {args[0]}"
        args = args[1:]
    if not args:
        return None
    name, rest = args[0], args[1:]
    if name not in group.commands:
        return f"adjcap has no command {name!r} (known: {', '.join(sorted(group.commands))})"
    command = group.commands[name]
    known = _option_names(command)
    bad = [a for a in rest if a.startswith("-") and a != "-" and a.split("=")[0] not in known]
    if bad:
        return f"adjcap {name} has no option {', '.join(bad)}"
    return _check_values(name, command, rest) if values else None


def _placeholder(value: str) -> bool:
    """DIR, P, N, HEAD:6379, RUN/heads, ...: a name the reader fills in."""
    return bool(re.match(r"^[A-Z][A-Z0-9_]*\b", value)) or value in ("...", "k=v")


def _check_values(name: str, command, args: list[str]) -> str | None:
    """The names a command line gives (a preset, a reproduce table, a benchmark, a prepare step, a --set
    key) are names the code knows."""
    from adjcap.config import config_keys, default_benchmarks, list_presets
    from adjcap.reproduce.tables import load_tables

    takes_value = {o for p in command.params if getattr(p, "opts", None) and not getattr(p, "is_flag", True)
                   for o in p.opts}
    given: list[tuple[str, str]] = []  # (option or "" for a positional argument, value)
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and "=" in a:
            given.append(tuple(a.split("=", 1)))
        elif a in takes_value and i + 1 < len(args):
            given.append((a, args[i + 1]))
            i += 1
        elif not a.startswith("-"):
            given.append(("", a))
        i += 1
    from adjcap.models.budget import VLM_PARAMS

    presets, tables = set(list_presets()), set(load_tables())
    first = next((v for o, v in given if not o), None)
    problems = []
    for option, value in given:
        if _placeholder(value):
            continue
        if option in ("--preset", "-p") and value not in presets:
            problems.append(f"no preset {value!r}")
        elif option == "--for" and value not in presets | tables | set(VLM_PARAMS):
            problems.append(f"--for {value!r} is neither a preset, a reproduce table nor a known VLM checkpoint")
        elif option in ("--set", "-s"):
            key = value.split("=", 1)[0]
            if key not in config_keys(key):
                problems.append(f"no config key {key!r}")
        elif not option and value is first and name == "reproduce" and value not in tables:
            problems.append(f"no reproduce table {value!r}")
        elif not option and value is first and name == "run-job" and value not in default_benchmarks():
            problems.append(f"no built-in benchmark {value!r}")
    return f"adjcap {name}: {'; '.join(problems)}" if problems else None


def _click_group():
    from typer.main import get_command

    from adjcap.cli import app

    return get_command(app)


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([\w.-]+):", text, flags=re.M))


@pytest.mark.parametrize("page", [p for p in PAGES if p not in GENERATED], ids=_rel)
def test_shell_commands_match_the_code(page):
    group, targets = _click_group(), _make_targets()
    problems = []
    for line, tokens, status in shell_commands(page):
        # an example of a refusal (marked to exit non-zero) names unknown things on purpose
        problem = _check_command(tokens, group, targets, values=status in (None, 0))
        if problem:
            problems.append(f"{_rel(page)}:{line}: {' '.join(tokens)}: {problem}")
    assert not problems, "\n".join(problems)


def _python_imports(page: Path):
    """(line, module, names) of every ``import adjcap...`` / ``from adjcap... import`` in python blocks."""
    for lang, start, body, _ in fenced_blocks(page):
        if lang != "python":
            continue
        tree = ast.parse("\n".join(body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "adjcap":
                yield start + node.lineno, node.module, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "adjcap":
                        yield start + node.lineno, a.name, []
        for node in ast.walk(tree):  # adjcap.NAME used on the top-level package
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "adjcap":
                yield start + node.lineno, "adjcap", [node.attr]


@pytest.mark.parametrize("page", [p for p in PAGES if any(True for _ in _python_imports(p))], ids=_rel)
def test_python_examples_name_real_code(page):
    problems = []
    for line, module, names in _python_imports(page):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            problems.append(f"{_rel(page)}:{line}: import {module}: {e}")
            continue
        problems += [f"{_rel(page)}:{line}: {module} has no {n}" for n in names
                     if not hasattr(mod, n) and importlib.util.find_spec(f"{module}.{n}") is None]
    assert not problems, "\n".join(problems)


RUNNABLE = [(page, line, tokens, status) for page in PAGES for line, tokens, status in shell_commands(page)
            if status is not None]


def test_pages_mark_runnable_commands():
    assert len(RUNNABLE) >= 4, f"only {len(RUNNABLE)} commands are marked {RUN_MARK}"


@pytest.mark.parametrize("page,line,tokens,status", RUNNABLE, ids=[f"{_rel(p)}:{n}" for p, n, _, _ in RUNNABLE])
def test_runnable_commands_run(page, line, tokens, status, demo_cfg, monkeypatch, tmp_path):
    """A marked command runs in this process (the adjcap program's own parsing and command) with the demo
    world in the cache and an empty data folder: what a fresh checkout prints offline."""
    from typer.testing import CliRunner

    from adjcap.cli import app

    args = _adjcap_args(tokens)
    assert args is not None, f"{_rel(page)}:{line}: only adjcap commands can be marked {RUN_MARK}: {tokens}"
    monkeypatch.setenv("ADJCAP_CACHE", str(demo_cfg.paths.cache_dir))
    monkeypatch.setenv("ADJCAP_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == status, (f"{_rel(page)}:{line}: {' '.join(tokens)} exited {result.exit_code}, "
                                        f"the page says {status}:\n"
                                   f"{result.output[-3000:]}{result.exception!r}")
    assert result.output.strip(), f"{_rel(page)}:{line}: {' '.join(tokens)} printed nothing"


# ---- BENCHMARKS.md ----------------------------------------------------------------------------------------

BENCHMARKS_MAX_LINES = 300


def _tables(text: str):
    """(header cells, [(line number, row cells), ...]) of each Markdown table of ``text``."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append((j + 1, [c.strip() for c in lines[j].strip("|").split("|")]))
                j += 1
            yield header, rows
            i = j
        else:
            i += 1


def test_benchmarks_is_one_page_of_rows_with_their_command_and_json():
    """BENCHMARKS.md: at most BENCHMARKS_MAX_LINES lines; in every table with a JSON column, each row names
    its command and a JSON that exists (the results of the run); every JSON the page names exists; the site
    includes the page (docs/benchmarks.md)."""
    text = BENCHMARKS.read_text(encoding="utf-8")
    n = len(text.splitlines())
    assert n <= BENCHMARKS_MAX_LINES, f"BENCHMARKS.md has {n} lines: dated investigations go to docs/benchmarks/"
    problems, rows_seen = [], 0
    for header, rows in _tables(text):
        if "JSON" not in header:
            continue
        assert "command" in header, f"BENCHMARKS.md: a table with a JSON column needs a command column: {header}"
        ci, ji = header.index("command"), header.index("JSON")
        for line, cells in rows:
            rows_seen += 1
            command, result = cells[ci], cells[ji]
            if not re.search(r"`[^`]+`", command) and command != "as above":
                problems.append(f"BENCHMARKS.md:{line}: no command")
            named = re.findall(r"`([^`]+\.json)`", result)
            if not named:
                problems.append(f"BENCHMARKS.md:{line}: no JSON")
            problems += [f"BENCHMARKS.md:{line}: {p} is missing" for p in named if not (ROOT / p).is_file()]
    assert rows_seen >= 10, f"only {rows_seen} rows with a JSON column in BENCHMARKS.md"
    problems += [f"BENCHMARKS.md names {p}, which is missing" for p in
                 sorted(set(re.findall(r"(?<![\w/.-])((?:benchmarks|adjcap)/[\w./-]+\.json)", text))) if not (ROOT / p).is_file()]
    assert not problems, "\n".join(problems)
    assert '--8<-- "BENCHMARKS.md"' in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")


# ---- citations in the code -----------------------------------------------------------------------------


def _headings(path: Path) -> set[str]:
    text = re.sub(r"^\s*(`{3,}).*?^\s*\1\s*$", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    titles = re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)
    titles += re.findall(r"^\*\*([^*]+)\*\*", text, flags=re.M)  # a paragraph's bold lead-in titles it too
    return {re.sub(r"[`*]", "", m).strip() for m in titles}


CITATION = re.compile(r"((?:BENCHMARKS|docs/[\w/.-]+)\.md)[,:]?\s+(?:\(|the\s+)?[\"'\u201c]([^\"'\u201d]+)[\"'\u201d]")


def test_code_cites_only_what_is_in_the_repository():
    """No tracked source file cites a file outside the repository (the old ``spec/`` documents), and a
    citation of a page's section (``BENCHMARKS.md, "Section"``, ``docs/architecture.md, "Layers"``) names
    a heading the page has (a heading's start is enough: the sections have long titles)."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.toml", "Makefile"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split() + [_rel(p) for p in PAGES]
    problems = []
    for rel in files:
        path = ROOT / rel
        if not path.is_file() or rel == "tests/test_docs.py":
            continue
        text = path.read_text(encoding="utf-8")
        problems += [f"{rel}: cites {m}, not in the repository" for m in re.findall(r"(?<![\w/.-])spec/[\w.-]+", text)]
        for page, section in CITATION.findall(" ".join(text.split())):
            target = ROOT / page
            if not target.is_file():
                problems.append(f"{rel}: cites {page}, which does not exist")
            elif not any(h.startswith(section.strip().rstrip(".")) for h in _headings(target)):
                problems.append(f'{rel}: cites {page}, "{section}": no such section')
    assert not problems, "\n".join(problems)


def test_every_repository_path_the_architecture_names_exists():
    """docs/architecture.md, the house's truth: every path under a top-level folder of the repository it
    names (``adjcap/engine/pools.py``, ``tests/test_imports.py``, ``adjcap/presets/*.toml``) exists."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    named = set(re.findall(r"(?<![\w/.{}~$<-])((?:[\w.-]+/)+[\w.*-]*[\w*])(?![\w/])", text))
    checked = [p for p in named if p.split("/")[0] in tops]
    assert len(checked) > 40, sorted(checked)
    missing = sorted(p for p in checked if not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists()))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_exit_code_table_lists_every_code():
    """docs/guide/guarantees.md's exit-code table has a row for every code the command line produces:
    each ``typer.Exit(N)`` of cli.py, the stops by signal (128 + SIGINT / SIGTERM / SIGKILL) and the
    jobs' own codes (``EXIT_*`` in jobs/)."""
    import signal

    table = (ROOT / "docs" / "guide" / "guarantees.md").read_text(encoding="utf-8")
    listed = {int(c) for row in re.findall(r"^\|[^|]+\| ([^|]+) \|", table, flags=re.M)
              for c in re.findall(r"^(\d+)", row.strip())}
    cli = (ROOT / "cli.py").read_text(encoding="utf-8")
    produced = {int(n or 0) for n in re.findall(r"typer\.Exit\((\d*)\)", cli)}
    produced |= {128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGKILL}
    for path in sorted((ROOT / "jobs").glob("*.py")):
        produced |= {int(n) for n in re.findall(r"^EXIT_\w+ = (\d+)", path.read_text(encoding="utf-8"), flags=re.M)}
    assert {0, 1, 2, 69, 130, 143} <= produced
    assert not produced - listed, f"exit codes without a row in docs/guide/guarantees.md: {sorted(produced - listed)}"
