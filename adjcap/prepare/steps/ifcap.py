"""`ifcap`: the IFCap v1.0 release's annotations (Karpathy splits, corpora, NoCaps) and checkpoints."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Callable

from adjcap.prepare.errors import PrepareError
from adjcap.prepare.steps.archives import archive_plan, expected_files, install_archive
from adjcap.prepare.steps.base import Context, Planned
from adjcap.prepare.verify import count_problem, zip_problem

Problems = Callable[[Path], list[str]]


def annotation_problems(src: dict[str, Any]) -> Problems:
    """Every expected annotation file present with its published image count."""
    def count(p: Path, n: int) -> str | None:
        try:
            return count_problem(p, n)
        except PrepareError as e:
            return str(e)
    return expected_files(src, count)


def checkpoint_problems(src: dict[str, Any]) -> Problems:
    """The required checkpoints present; torch's zip format passes its CRC check."""
    def problems(root: Path) -> list[str]:
        out = []
        for rel in src.get("required", []):
            p = root / rel
            if not p.is_file():
                out.append(f"{rel} missing")
            elif zipfile.is_zipfile(p) and (bad := zip_problem(p)):
                out.append(f"{rel}: {bad}")
        return out
    return problems


class IFCapStep:
    name = "ifcap"
    summary = "IFCap v1.0 release: annotations.zip (Karpathy splits, corpora, NoCaps) and checkpoints.zip"

    def _parts(self, ctx: Context) -> list[tuple[str, dict[str, Any], Problems, str]]:
        a, c = ctx.sources["ifcap"]["annotations"], ctx.sources["ifcap"]["checkpoints"]
        return [("annotations", a, annotation_problems(a), next(iter(a["expect"]))),
                ("checkpoints", c, checkpoint_problems(c), c["required"][0])]

    def plan(self, ctx: Context) -> list[Planned]:
        out = []
        for part, src, problems, _ in self._parts(ctx):
            final = ctx.data / src["dest"]
            if final.is_dir() and not problems(final):
                out.append(Planned(f"ifcap {part}", "(present)", str(final), 0, exact=True))
            else:
                out.append(archive_plan(ctx, f"ifcap {part}", src["url"], final, src.get("approx_bytes"), src.get("size")))
        return out

    def run(self, ctx: Context) -> str:
        done = []
        for part, src, problems, anchor in self._parts(ctx):
            final = ctx.data / src["dest"]
            if final.is_dir() and not problems(final):
                done.append(f"{part} present")
                continue
            install_archive(ctx, self.name, src["url"], final, anchor=anchor, problems=problems,
                            approx=src.get("approx_bytes"), size=src.get("size"), sha256=src.get("sha256"))
            done.append(f"{part} laid out in {final}")
            missing = [r for r in src.get("optional", []) if not (final / r).is_file()]
            if missing:
                ctx.say(f"ifcap: note: {', '.join(missing)} not in the release (presets that use them will say so)")
        return "; ".join(done)

    def check(self, ctx: Context) -> list[str]:
        out = []
        for _, src, problems, _ in self._parts(ctx):
            final = ctx.data / src["dest"]
            if not final.is_dir():
                out.append(f"{final}: missing (run `adjcap prepare ifcap`)")
            else:
                out += [f"{final}: {p}" for p in problems(final)]
        return out


STEP = IFCapStep()
