#!/usr/bin/env python3
"""The package root's modules moved into the subpackages named for what they hold (issue 45, item 4):
re-runnable and idempotent, standard library only.

Run from the repository's root (a git checkout; the moves are ``git mv``)::

    python tools/wing_move.py            # move, rewrite, print what it did
    python tools/wing_move.py --dry-run  # print what it would do, change nothing

It does, for each line of :data:`MAPPING` (old module -> new module):

1. creates each new package's ``__init__.py`` (a one-line docstring from :data:`PACKAGES`) if missing;
2. ``git mv``s the module's file when it is still at its old path (a module already moved, or one that
   does not exist on this branch, is skipped), and keeps every ``Path(__file__)...parents[N]`` /
   ``.parent`` chain in a moved file pointing at the same folder as before (N + the depth it moved);
3. rewrites every reference in the repository's tracked text files: ``from adjcap import a, x, b``
   (split into one statement per package, aliases kept), ``import adjcap.x`` / ``from adjcap.x import``
   / any dotted ``adjcap.x`` (code, strings such as monkeypatch targets and logger names, docs; an
   application module also as ``actors.x``; ``adjcap\\.x`` inside a regular expression), and the file
   paths ``adjcap/x.py`` (``actors/x.py`` for the application layer's modules); and
   ``Path(x.__file__)`` chains elsewhere that point at a moved module's folder (a parenthesized
   ``from adjcap import (...)`` that it splits loses the comments between its names);
4. prints every move and every file it rewrote, and the root modules that no line of the mapping
   names and :data:`KEEP_AT_ROOT` does not keep (add a line to the mapping for each; that is all it
   takes to move a new module).

Run twice, the second run changes nothing. Then regenerate the reference pages (``python
docs/gen_reference.py``: they quote moved docstrings). The layer table's reshuffle (tests/test_imports.py
LAYERS keeps each moved module's old layer, under its new name) and docs/architecture.md's module map
are hand edits on top of this script's output (the commit "wing move: manual").
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

# old module -> new module; the leaf name stays, so ``from adjcap import x`` becomes
# ``from adjcap.<package> import x`` and every ``x.foo`` in the importing code holds as it is
MAPPING: dict[str, str] = {
    # the engine: one image through the stages, the stages' registry, their identity and cache, the
    # pools they run in, the transport between pools and the sink at their end
    "adjcap.image_state": "adjcap.engine.image_state",
    "adjcap.stages": "adjcap.engine.stages",
    "adjcap.stage_registry": "adjcap.engine.stage_registry",
    "adjcap.stage_records": "adjcap.engine.stage_records",  # the registry's mechanism (records, lookups)
    "adjcap.verifier_families": "adjcap.engine.verifier_families",  # one record per verifier family
    "adjcap.captioners": "adjcap.engine.captioners",
    "adjcap.identity": "adjcap.engine.identity",
    "adjcap.stage_cache": "adjcap.engine.stage_cache",
    "adjcap.pixel_prep": "adjcap.engine.pixel_prep",
    "adjcap.features": "adjcap.engine.features",
    "adjcap.batch_sink": "adjcap.engine.batch_sink",
    "adjcap.gpu_errors": "adjcap.engine.gpu_errors",
    "adjcap.pools": "adjcap.engine.pools",
    "adjcap.cluster_plan": "adjcap.engine.cluster_plan",
    "adjcap.run_plan": "adjcap.engine.run_plan",
    "adjcap.pipeline": "adjcap.engine.pipeline",
    "adjcap.actors.transport": "adjcap.engine.transport",
    # storage: files written safely and what a run directory holds
    "adjcap.io": "adjcap.storage.io",
    "adjcap.file_lock": "adjcap.storage.file_lock",
    "adjcap.parts": "adjcap.storage.parts",
    "adjcap.content_ids": "adjcap.storage.content_ids",
    "adjcap.rundir": "adjcap.storage.rundir",
    "adjcap.samples": "adjcap.storage.samples",
    "adjcap.provenance": "adjcap.storage.provenance",
    # the machine: its accelerators, portable numerics, what a config needs on it, the doctor
    "adjcap.accelerators": "adjcap.machine.accelerators",
    "adjcap.numerics": "adjcap.machine.numerics",
    "adjcap.needs": "adjcap.machine.needs",
    "adjcap.doctor": "adjcap.machine.doctor",
    # the models' own code: IFCap's decoding and entities, the decode audit, the LAVIS environment
    "adjcap.decoding": "adjcap.models.decoding",
    "adjcap.entities": "adjcap.models.entities",
    "adjcap.dispatch_audit": "adjcap.models.dispatch_audit",
    "adjcap.lavis_env": "adjcap.models.lavis_env",
    # what a user reads of runs: experiment trackers beside the report
    "adjcap.tracking": "adjcap.report.tracking",
}

# the new packages: the one-line docstring of the __init__.py this script creates when missing
PACKAGES: dict[str, str] = {
    "adjcap.engine": "The engine: one image through the stages (its state, the stage functions, the stage registry "
                     "and families, identities, the stage cache, pixel preparation, the feature row, the transport "
                     "between pools, the batch sink), the pools and run plan they run from, and their drivers.",
    "adjcap.storage": "Storage: files written atomically, the one file lock, Parquet parts, content ids, and what a "
                      "run directory holds (its layout, provenance.json, samples.parquet).",
    "adjcap.machine": "The machine: its accelerators, portable numerics, what a config needs on it, and the doctor "
                      "that says so.",
}

# the modules a user imports, left in the package root (the links cli.py, jobs/, actors/ included)
KEEP_AT_ROOT = {"__init__", "__main__", "cli", "config", "registry", "nested", "picker_needs", "api"}

# the application layer's folders at the repository's root, reached through the links in adjcap/
APP = {"adjcap.jobs": "jobs", "adjcap.actors": "actors", "adjcap.cli": "cli"}

SELF = Path(__file__).resolve()


def real_path(module: str) -> str:
    """The file a module lives in, relative to the repository's root (the real file, not a link)."""
    for name, folder in APP.items():
        if module == name or module.startswith(name + "."):
            return folder + module[len(name):].replace(".", "/") + ".py"
    return module.replace(".", "/") + ".py"


def dotted_forms(module: str) -> list[str]:
    """How code names the module: ``adjcap.x``, and an application module also by its top-level folder
    (``actors.x``, importable from the repository's root)."""
    forms = [module]
    for name in APP:
        if module.startswith(name + "."):
            forms.append(module[len("adjcap."):])
    return forms


def path_forms(module: str) -> list[str]:
    """How a text names the module's file: its real path, and through the link adjcap/<app> too."""
    path = real_path(module)
    forms = [path]
    if not path.startswith("adjcap/"):
        forms.insert(0, "adjcap/" + path)
    return forms


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def parent_chain_re(head: str) -> re.Pattern[str]:
    """``Path(<head>)[.resolve()]`` followed by ``.parents[N]`` or a chain of ``.parent``."""
    return re.compile(rf"(Path\({head}\)(?:\.resolve\(\))?)(\.parents\[(\d+)\]|(?:\.parent(?![\w\[]))+)")


def deepen(text: str, pattern: re.Pattern[str], delta: int) -> tuple[str, int]:
    """Point each parent chain ``delta`` folders further up (the same folder, seen from a file moved
    ``delta`` folders down)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(3) is not None:
            return f"{m.group(1)}.parents[{int(m.group(3)) + delta}]"
        return m.group(1) + m.group(2) + ".parent" * delta

    return pattern.subn(sub, text)


def ensure_packages(root: Path, dry: bool) -> list[str]:
    done = []
    for pkg in sorted({new.rsplit(".", 1)[0] for new in MAPPING.values()}):
        init = root / real_path(pkg + ".__init__")
        if init.exists():
            continue
        if pkg not in PACKAGES:
            sys.exit(f"wing_move: {pkg} has no __init__.py and PACKAGES gives it no docstring: add one")
        if not dry:
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text(f'"""{PACKAGES[pkg]}"""\n')
            git(root, "add", str(init.relative_to(root)))
        done.append(f"created {init.relative_to(root)}")
    return done


def move_files(root: Path, dry: bool) -> tuple[dict[str, int], list[str]]:
    """git mv each module still at its old path; (moved module -> depth it moved down, report lines)."""
    moved: dict[str, int] = {}
    lines = []
    for old, new in MAPPING.items():
        src, dst = root / real_path(old), root / real_path(new)
        if not src.exists():
            continue
        if dst.exists():
            sys.exit(f"wing_move: both {src.relative_to(root)} and {dst.relative_to(root)} exist: merge them by hand")
        delta = len(Path(real_path(new)).parts) - len(Path(real_path(old)).parts)
        lines.append(f"git mv {src.relative_to(root)} {dst.relative_to(root)}")
        if not dry:
            dst.parent.mkdir(parents=True, exist_ok=True)
            git(root, "mv", str(src.relative_to(root)), str(dst.relative_to(root)))
            if delta:
                text, n = deepen(dst.read_text(), parent_chain_re("__file__"), delta)
                if n:
                    dst.write_text(text)
                    lines.append(f"  {dst.relative_to(root)}: {n} Path(__file__) parent chain(s) {delta} level(s) up")
        moved[old] = delta
    return moved, lines


IMPORT_RE = re.compile(
    r"(?<![\w.])from[ \t]+(?P<pkg>(?:adjcap|actors|jobs)(?:\.[A-Za-z_]\w*)*)[ \t]+import[ \t]+"
    r"(?P<names>\([^()]*\)|[A-Za-z_]\w*(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[A-Za-z_]\w*(?:[ \t]+as[ \t]+\w+)?)*)")


def split_from_imports(text: str) -> str:
    """``from adjcap import a, x, b`` with x moved -> ``from adjcap import a, b`` + ``from adjcap.p import x``
    (on the next line at the same indent, or after ``; `` inside a one-line string)."""
    parents = {old.rsplit(".", 1)[0] for old in MAPPING}

    def sub(m: re.Match[str]) -> str:
        pkg = m.group("pkg")
        full = pkg if pkg.startswith("adjcap") else "adjcap." + pkg  # ``from actors import x`` (from the root)
        if full not in parents:
            return m.group(0)
        raw = m.group("names").strip("()")
        raw = re.sub(r"#[^\n]*", "", raw)
        names = [" ".join(n.split()) for n in raw.split(",") if n.strip()]
        groups: dict[str, list[str]] = {pkg: []}
        for entry in names:
            name, _, alias = entry.partition(" as ")
            new = MAPPING.get(f"{full}.{name}")
            if new is None:
                groups[pkg].append(entry)
                continue
            parent, leaf = new.rsplit(".", 1)
            as_name = alias or (name if leaf != name else "")
            groups.setdefault(parent, []).append(leaf + (f" as {as_name}" if as_name else ""))
        if len(groups) == 1:
            return m.group(0)
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[line_start:m.start()]
        sep = "\n" + before if not before.strip() else "; "
        stmts = [f"from {p} import {', '.join(ns)}" for p, ns in groups.items() if ns]
        return sep.join(stmts)

    return IMPORT_RE.sub(sub, text)


def rewrite_text(text: str) -> str:
    text = split_from_imports(text)
    for old in sorted(MAPPING, key=len, reverse=True):
        new = MAPPING[old]
        for form in dotted_forms(old):
            text = re.sub(rf"(?<![\w.]){re.escape(form)}(?!\w)", new, text)
            # inside a regular expression (a class's qualified name in a traceback: adjcap\.x\.Class)
            escaped, new_escaped = form.replace(".", "\\."), new.replace(".", "\\.")
            text = re.sub(rf"(?<![\w.]){re.escape(escaped)}(?!\w)", lambda _: new_escaped, text)
        for form in path_forms(old):
            text = re.sub(rf"(?<![\w.-]){re.escape(form)}(?!\w)", real_path(new), text)
    return text


def fix_file_anchors(text: str, moved: dict[str, int]) -> tuple[str, int]:
    """``Path(x.__file__)...parents[N]`` in a file that imports a module moved this run: the same folder."""
    total = 0
    for old, delta in moved.items():
        new = MAPPING[old]
        parent, leaf = new.rsplit(".", 1)
        if not delta:
            continue
        heads = [re.escape(new)]
        if re.search(rf"\bfrom {re.escape(parent)} import [^\n]*\b{leaf}\b", text):
            heads.append(leaf)
        text, n = deepen(text, parent_chain_re(rf"(?:{'|'.join(heads)})\.__file__"), delta)
        total += n
    return text, total


def tracked_text_files(root: Path):
    for rel in git(root, "ls-files", "-z").split("\0"):
        path = root / rel
        if not rel or path.is_symlink() or not path.is_file() or path.resolve() == SELF:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if "adjcap" in text or "actors/" in text:
            yield path, text


def rewrite_files(root: Path, moved: dict[str, int], dry: bool) -> list[str]:
    lines = []
    for path, text in tracked_text_files(root):
        new = rewrite_text(text)
        new, anchors = fix_file_anchors(new, moved) if path.suffix == ".py" else (new, 0)
        if new == text:
            continue
        changed = sum(a != b for a, b in zip(text.splitlines(), new.splitlines())) + abs(
            len(text.splitlines()) - len(new.splitlines()))
        extra = f", {anchors} Path(x.__file__) chain(s)" if anchors else ""
        lines.append(f"rewrote {path.relative_to(root)} (~{changed} line(s){extra})")
        if not dry:
            path.write_text(new, encoding="utf-8")
    return lines


def unmapped(root: Path) -> list[str]:
    """Modules in the package root that the mapping does not move and the root does not keep."""
    mapped = {old.split(".", 1)[1] for old in MAPPING if old.count(".") == 1}
    return sorted(p.stem for p in (root / "adjcap").glob("*.py") if p.stem not in KEEP_AT_ROOT | mapped)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    args = ap.parse_args(argv)
    root = Path(git(Path.cwd(), "rev-parse", "--show-toplevel").strip())
    for pkg in PACKAGES:
        rel = real_path(pkg + ".__init__")
        if subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=root).returncode == 0:
            sys.exit(f"wing_move: {rel} would be ignored by .gitignore: choose another package name")
    report = ensure_packages(root, args.dry_run)
    moved, lines = move_files(root, args.dry_run)
    report += lines
    report += rewrite_files(root, moved, args.dry_run)
    for line in report:
        print(line)
    left = unmapped(root)
    if left:
        print("root modules the mapping does not name (add a line to MAPPING or KEEP_AT_ROOT): "
              + ", ".join(f"adjcap/{m}.py" for m in left))
    n_root = len(list((root / "adjcap").glob("*.py")))
    print(f"{'nothing to do' if not report else f'{len(report)} change(s)'}; "
          f"{n_root} module(s) in the package root")
    if report and not args.dry_run:
        print("then: python docs/gen_reference.py (the generated pages quote moved docstrings), and "
              "python -m pytest tests/test_imports.py tests/test_docs.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
