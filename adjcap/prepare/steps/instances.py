"""`coco-instances`: COCO 2014's instance annotations (``annotations_trainval2014.zip``), the ground-truth
objects of the original CHAIR (``eval.chair = instances | both``, :mod:`adjcap.metrics.chair`). The
Karpathy test and val images are all COCO val2014 images, so ``instances_val2014.json`` is what a
Karpathy run reads; the archive's other files (train2014's instances, captions, keypoints) are laid
out beside it as they come."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adjcap.prepare.steps.archives import archive_plan, expected_files, install_archive
from adjcap.prepare.steps.base import Context, Planned


def instance_problems(src: dict[str, Any]):
    """Every expected instances file present, and a COCO instances file: its images count as published
    (the file is parsed: ~160 MB for val2014, a few seconds)."""
    def check(p: Path, n: int) -> str | None:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            images, ok = len(data["images"]), isinstance(data["annotations"], list) and bool(data["categories"])
        except (ValueError, KeyError, TypeError) as e:
            return f"{p.name}: not a COCO instances file ({type(e).__name__})"
        return None if ok and (not n or images == n) else f"{p.name}: {images} images, expected {n}"
    return expected_files(src, check)


class CocoInstancesStep:
    name = "coco-instances"
    summary = "COCO 2014 instance annotations (annotations_trainval2014.zip): the original CHAIR's objects"

    def _src(self, ctx: Context) -> dict[str, Any]:
        return ctx.sources["coco_instances"]

    def plan(self, ctx: Context) -> list[Planned]:
        src = self._src(ctx)
        final = ctx.data / src["dest"]
        if final.is_dir() and not instance_problems(src)(final):
            return [Planned("coco-instances", "(present)", str(final), 0, exact=True)]
        return [archive_plan(ctx, "coco-instances", src["url"], final, src.get("approx_bytes"), src.get("size"))]

    def run(self, ctx: Context) -> str:
        src = self._src(ctx)
        final = ctx.data / src["dest"]
        problems = instance_problems(src)
        if final.is_dir() and not problems(final):
            return f"present in {final}"
        return install_archive(ctx, self.name, src["url"], final, anchor=next(iter(src["expect"])),
                               problems=problems, approx=src.get("approx_bytes"), size=src.get("size"),
                               sha256=src.get("sha256"))

    def check(self, ctx: Context) -> list[str]:
        src = self._src(ctx)
        final = ctx.data / src["dest"]
        if not final.is_dir():
            return [f"{final}: missing (run `adjcap prepare coco-instances`)"]
        return [f"{final}: {p}" for p in instance_problems(src)(final)]


STEP = CocoInstancesStep()
