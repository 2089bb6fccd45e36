"""No product function longer than :data:`LIMIT` lines (issue 45: each module one job, each function
one step): the library (adjcap/ without the demo world and its training), the application layer
(jobs/, actors/) and cli.py. A long function is split into named functions that each do one thing.
Reads the source with ast only (no imports): cheap."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80


def _product_files() -> list[Path]:
    lib = [p for p in (ROOT / "adjcap").rglob("*.py")
           if not p.is_symlink() and p.relative_to(ROOT / "adjcap").parts[0] != "demo"]
    return sorted([*lib, *(ROOT / "jobs").rglob("*.py"), *(ROOT / "actors").rglob("*.py"), ROOT / "cli.py"])


def long_functions(files: list[Path], root: Path = ROOT, limit: int = LIMIT) -> list[str]:
    """``file:line qualified.name (N lines)`` of every function (methods and nested functions too)
    whose body, from ``def`` to its last line, is longer than ``limit`` lines (files named from ``root``)."""
    out = []

    def visit(node: ast.AST, scope: list[str], path: Path) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = [*scope, child.name]
                n = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and n > limit:
                    out.append(f"{path.relative_to(root)}:{child.lineno} {'.'.join(name)} ({n} lines)")
                visit(child, name, path)
            else:
                visit(child, scope, path)

    for path in files:
        visit(ast.parse(path.read_text(), filename=str(path)), [], path)
    return out


def test_no_product_function_is_longer_than_the_limit():
    files = _product_files()
    assert ROOT / "adjcap" / "report" / "report.py" in files and ROOT / "jobs" / "run.py" in files
    long = long_functions(files)
    assert not long, (f"functions over {LIMIT} lines (split each into named functions that each do one "
                      "thing):\n" + "\n".join(long))


def test_the_size_check_names_file_line_and_function(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"class K:\n    def short(self):\n        return 1\n\n    def long(self):\n{body}\n"
                                   "\n\ndef fine():\n    return 2\n")
    assert long_functions([tmp_path / "m.py"], tmp_path) == [f"m.py:5 K.long ({LIMIT + 1} lines)"]
