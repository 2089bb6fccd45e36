"""Image benchmarks whose image lists come from annotation files: COCO Karpathy test/val (from the
COCO image server, one by one, or the whole val2014 zip), Flickr30k Karpathy test/val (--from only) and
NoCaps val (from the URLs in its annotation file)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from adjcap.prepare.errors import PrepareError
from adjcap.prepare.extract import extract, single_root
from adjcap.prepare.steps.archives import archive_plan
from adjcap.prepare.steps.base import Context, Planned, check_images, image_present, lay_out_images
from adjcap.prepare.verify import annotation_images, image_problem, load_json, offenders, zip_problem

_DIGITS = re.compile(r"^\d+$")


def split_names(ctx: Context, step: str, src: dict[str, Any], coco: bool = False) -> list[str]:
    """Image file names of the Karpathy test + val splits, read from the IFCap annotations."""
    ann = ctx.data / src["annotations"]
    names: list[str] = []
    for split, n in src["expect"].items():
        p = ann / f"{split}_captions.json"
        if not p.is_file():
            raise PrepareError(
                f"{p}: not found; {step} takes its Karpathy {split} image list from the IFCap annotations - "
                f"run `adjcap prepare ifcap {step}`"
            )
        keys = [os.path.basename(k) for k in annotation_images(p)]
        if coco:
            keys = [f"COCO_val2014_{int(k):012d}.jpg" if _DIGITS.match(k) else k for k in keys]
        if n and len(keys) != int(n):
            ctx.say(f"{step}: note: {p} lists {len(keys)} images, the Karpathy {split} split has {n}")
        names += keys
    return sorted(set(names))


class CocoStep:
    name = "coco"
    summary = "COCO val2014 images of the Karpathy test + val splits (10,000; --coco-zip: all of val2014)"

    def _src(self, ctx: Context) -> dict[str, Any]:
        return ctx.sources["coco"]

    def _use_zip(self, ctx: Context, names: list[str]) -> bool:
        if ctx.opts.coco_zip:
            return True
        if ctx.opts.from_dir is not None:  # a local val2014.zip serves when the loose images are not there
            zname = self._src(ctx)["zip_url"].rsplit("/", 1)[-1]
            return ctx.local(names[0]) is None and ctx.local(zname) is not None
        return False

    def plan(self, ctx: Context) -> list[Planned]:
        src = self._src(ctx)
        final = ctx.data / src["dest"]
        try:
            names = split_names(ctx, self.name, src, coco=True)
        except PrepareError:
            n = sum(int(v) for v in src["expect"].values())
            if ctx.opts.coco_zip:
                return [archive_plan(ctx, "coco val2014.zip", src["zip_url"], final, src.get("zip_approx_bytes"))]
            return [Planned(f"coco: {n} Karpathy test/val images (names from the ifcap step)",
                            src["image_url"].format(file="<file>"), str(final), n * src["image_approx_bytes"])]
        todo = [n for n in names if not image_present(ctx, final / n)]
        if not todo:
            return [Planned("coco images", "(present)", str(final), 0, exact=True)]
        if self._use_zip(ctx, names):
            return [archive_plan(ctx, "coco val2014.zip", src["zip_url"], final, src.get("zip_approx_bytes"))]
        where = str(ctx.opts.from_dir) if ctx.opts.from_dir else ctx.url(src["image_url"].format(file="<file>"))
        return [Planned(f"coco: {len(todo)} of {len(names)} Karpathy test/val images", where, str(final),
                        len(todo) * src["image_approx_bytes"])]

    def run(self, ctx: Context) -> str:
        src = self._src(ctx)
        final = ctx.data / src["dest"]
        names = split_names(ctx, self.name, src, coco=True)
        if self._use_zip(ctx, names):
            return self._from_zip(ctx, src, names, final)
        wanted = {n: src["image_url"].format(file=n) for n in names}
        return lay_out_images(ctx, self.name, wanted, final, approx=src["image_approx_bytes"])

    def _from_zip(self, ctx: Context, src: dict[str, Any], names: list[str], final: Path) -> str:
        if all(image_present(ctx, final / n) for n in names):
            return f"all {len(names)} images present in {final}"
        url = src["zip_url"]
        archive = ctx.downloads / url.rsplit("/", 1)[-1]
        item = ctx.item(url, archive, size=src.get("zip_size"), sha256=src.get("zip_sha256"),
                        approx=src.get("zip_approx_bytes"))
        got = ctx.fetch_one(item, "coco val2014.zip")
        with ctx.validating(url, got, self.name):
            bad = zip_problem(archive)
            if bad:
                raise PrepareError(f"{ctx.source_of(item)}: {bad}; the archive was removed - run again")
            tmp, hashes = extract(archive, final.parent, limits=ctx.extract_limits)
            try:
                root = single_root(tmp, names[0], ctx.source_of(item))
                lost = [n for n in names if not (root / n).is_file()]
                broken = [n for n in names if n not in lost and image_problem(root / n) is not None]
                if lost or broken:
                    raise PrepareError(
                        f"{ctx.source_of(item)}: {len(lost)} Karpathy images missing, {len(broken)} do not decode "
                        f"({offenders(lost + broken)}); nothing was laid out"
                    )
                prefix = root.relative_to(tmp).as_posix()
                final.mkdir(parents=True, exist_ok=True)
                moved = 0
                for p in root.iterdir():
                    if p.is_file() and not (final / p.name).exists():
                        os.replace(p, final / p.name)
                        moved += 1
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        for rel, (sha, n) in hashes.items():
            base = rel[len(prefix) + 1:] if prefix != "." and rel.startswith(prefix + "/") else rel
            if "/" not in base:
                ctx.lock.record_file(f"{ctx.rel(final)}/{base}", sha, n, self.name, ctx.source_of(item))
        archive.unlink(missing_ok=True)
        return f"val2014.zip laid out in {final} ({moved} images added)"

    def check(self, ctx: Context) -> list[str]:
        src = self._src(ctx)
        try:
            names = split_names(ctx, self.name, src, coco=True)
        except PrepareError as e:
            return [str(e)]
        return check_images(ctx.data / src["dest"], names, self.name)


class Flickr30kStep:
    name = "flickr30k"
    summary = "Flickr30k images of the Karpathy test + val splits (2,014), from --from DIR only"

    def _need_from(self, ctx: Context) -> None:
        if ctx.opts.from_dir is None:
            raise PrepareError(
                "flickr30k images have no public download: "
                f"{ctx.sources['flickr30k']['where']}, then run `adjcap prepare flickr30k --from DIR`"
            )

    def plan(self, ctx: Context) -> list[Planned]:
        src = ctx.sources["flickr30k"]
        final = ctx.data / src["dest"]
        n = sum(int(v) for v in src["expect"].values())
        if ctx.opts.from_dir is None:
            return [Planned(f"flickr30k: {n} images", "(no public download: needs --from DIR)", str(final), None,
                            note="skipped")]
        return [Planned(f"flickr30k: {n} Karpathy test/val images", str(ctx.opts.from_dir), str(final),
                        n * src["image_approx_bytes"])]

    def run(self, ctx: Context) -> str:
        self._need_from(ctx)
        src = ctx.sources["flickr30k"]
        names = split_names(ctx, self.name, src)
        lost = [n for n in names if ctx.local(n) is None]
        if lost:
            raise PrepareError(
                f"{len(lost)} of {len(names)} Flickr30k test/val images are not under --from {ctx.opts.from_dir} "
                f"({offenders(lost)}); point --from at the flickr30k-images folder"
            )
        wanted = {n: f"file://{ctx.local(n)}" for n in names}
        return lay_out_images(ctx, self.name, wanted, ctx.data / src["dest"], approx=src["image_approx_bytes"])

    def check(self, ctx: Context) -> list[str]:
        src = ctx.sources["flickr30k"]
        try:
            names = split_names(ctx, self.name, src)
        except PrepareError as e:
            return [str(e)]
        return check_images(ctx.data / src["dest"], names, self.name)


class NocapsStep:
    name = "nocaps"
    summary = "NoCaps val: nocaps_val_4500_captions.json and its 4,500 images (saved as {id}.jpg)"

    def _annotations(self, ctx: Context) -> tuple[Path, str]:
        src = ctx.sources["nocaps"]
        return ctx.data / src["annotations_dest"], src["annotations_url"]

    def _wanted(self, ctx: Context, ann: Path) -> tuple[dict[str, str], dict[str, str]]:
        """{id}.jpg -> image URL, and {id}.jpg -> the Open Images file name (for --from copies)."""
        obj = load_json(ann)
        images = obj.get("images") if isinstance(obj, dict) else None
        if not isinstance(images, list):
            raise PrepareError(f"{ann}: no 'images' list; not the nocaps captions file - delete it and run again")
        wanted, orig = {}, {}
        for im in images:
            if not isinstance(im, dict) or "id" not in im or "coco_url" not in im:
                raise PrepareError(f"{ann}: an image without 'id'/'coco_url' ({str(im)[:80]}); delete it and run again")
            key = f"{im['id']}.jpg"
            wanted[key] = im["coco_url"]
            orig[key] = str(im.get("file_name") or key)
        return wanted, orig

    def _counted(self, ctx: Context, src: dict[str, Any], ann: Path, what: str,
                 fix: str) -> tuple[dict[str, str], dict[str, str]]:
        """The images of the annotation file, refused (PrepareError) unless there are as many as expected."""
        wanted, orig = self._wanted(ctx, ann)
        if len(wanted) != int(src["expect"]):
            raise PrepareError(f"{what}{len(wanted)} images, expected {src['expect']}; {fix}")
        return wanted, orig

    def plan(self, ctx: Context) -> list[Planned]:
        src = ctx.sources["nocaps"]
        ann, url = self._annotations(ctx)
        final = ctx.data / src["dest"]
        out = []
        if not ann.is_file():
            out.append(archive_plan(ctx, "nocaps annotations", url, ann, src.get("annotations_approx_bytes")))
            n = int(src["expect"])
        else:
            n = sum(1 for k in self._wanted(ctx, ann)[0] if not image_present(ctx, final / k))
        where = str(ctx.opts.from_dir) if ctx.opts.from_dir else "the image URLs in the annotation file"
        out.append(Planned(f"nocaps: {n} val images", where, str(final), n * src["image_approx_bytes"]))
        return out

    def run(self, ctx: Context) -> str:
        src = ctx.sources["nocaps"]
        ann, url = self._annotations(ctx)
        if not ann.is_file():
            item = ctx.item(url, ann, size=src.get("annotations_size"), sha256=src.get("annotations_sha256"),
                            approx=src.get("annotations_approx_bytes"))
            got = ctx.fetch_one(item, "nocaps annotations")
            with ctx.validating(url, got, self.name):
                self._counted(ctx, src, ann, f"{ctx.source_of(item)}: ", "the file was removed - run again")
            ctx.lock.record_file(ctx.rel(ann), got.sha256, got.size, self.name, ctx.source_of(item))
        wanted, orig = self._counted(ctx, src, ann, f"{ann}: ", "delete it and run again")
        corpus = ctx.data / "ifcap/annotations/nocaps/nocaps_corpus.json"
        if corpus.is_file():
            lost = [k for k in annotation_images(corpus) if k not in wanted]
            if lost:
                ctx.say(f"nocaps: note: {len(lost)} image ids of {corpus} are not in {ann} ({offenders(lost)})")
        return lay_out_images(ctx, self.name, wanted, ctx.data / src["dest"], approx=src["image_approx_bytes"],
                              local_names=lambda k: (k, orig[k]))

    def check(self, ctx: Context) -> list[str]:
        ann, _ = self._annotations(ctx)
        if not ann.is_file():
            return [f"{ann}: missing (run `adjcap prepare nocaps`)"]
        wanted, _ = self._wanted(ctx, ann)
        return check_images(ctx.data / ctx.sources["nocaps"]["dest"], sorted(wanted), self.name)


COCO = CocoStep()
FLICKR30K = Flickr30kStep()
NOCAPS = NocapsStep()
