"""Small tool data: NLTK's tagger/tokeniser/WordNet data into ``{data}/nltk_data`` and the Stanford
CoreNLP 3.6.0 jars SPICE needs into ``{data}/spice/lib``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from adjcap.storage.io import file_checksum
from adjcap.java.trust import private_dir, write_manifest
from adjcap.prepare.errors import PrepareError
from adjcap.prepare.extract import extract
from adjcap.prepare.steps.archives import archive_plan, install_archive
from adjcap.prepare.steps.base import Context, Planned
from adjcap.prepare.verify import zip_problem


class NltkStep:
    name = "nltk"
    summary = "NLTK data of the entity filter (punkt_tab, averaged_perceptron_tagger_eng, wordnet) into {data}/nltk_data"

    def _packages(self, ctx: Context) -> list[tuple[str, str, Path, int | None]]:
        src = ctx.sources["nltk"]
        root = ctx.data / src["dest"]
        out = []
        for name, spec in src["packages"].items():
            category = spec["path"].split("/")[0]
            out.append((name, src["base_url"] + spec["path"], root / category / name, spec.get("approx_bytes")))
        return out

    @staticmethod
    def _ok(final: Path) -> list[str]:
        return [] if final.is_dir() and any(final.iterdir()) else [f"{final} missing or empty"]

    def plan(self, ctx: Context) -> list[Planned]:
        return [Planned(f"nltk {name}", "(present)", str(final), 0, exact=True) if not self._ok(final)
                else archive_plan(ctx, f"nltk {name}", url, final, approx)
                for name, url, final, approx in self._packages(ctx)]

    def run(self, ctx: Context) -> str:
        done = []
        for name, url, final, approx in self._packages(ctx):
            if not self._ok(final):
                done.append(f"{name} present")
                continue
            spec = ctx.sources["nltk"]["packages"][name]
            install_archive(ctx, self.name, url, final, anchor=name, take=name, approx=approx,
                            size=spec.get("size"), sha256=spec.get("sha256"),
                            problems=lambda root: [] if any(root.iterdir()) else [f"{name}/ is empty"])
            done.append(f"{name} laid out")
        return "; ".join(done) + f" (in {ctx.data / ctx.sources['nltk']['dest']})"

    def check(self, ctx: Context) -> list[str]:
        out = []
        for _, _, final, _ in self._packages(ctx):
            out += self._ok(final)
        return out


class SpiceStep:
    name = "spice"
    summary = "Stanford CoreNLP 3.6.0 jars for SPICE (from the 2015-12-09 CoreNLP zip) into {data}/spice/lib"

    def _jars(self, ctx: Context) -> tuple[Path, list[str]]:
        src = ctx.sources["spice"]
        return ctx.data / src["dest"], list(src["members"])

    def _missing(self, ctx: Context) -> list[str]:
        final, members = self._jars(ctx)
        return [m for m in members if not (final / os.path.basename(m)).is_file()]

    def plan(self, ctx: Context) -> list[Planned]:
        final, _ = self._jars(ctx)
        if not self._missing(ctx):
            return [Planned("spice CoreNLP jars", "(present)", str(final), 0, exact=True)]
        src = ctx.sources["spice"]
        return [archive_plan(ctx, "spice CoreNLP 3.6.0 (2 jars kept)", src["url"], final, src.get("approx_bytes"))]

    def run(self, ctx: Context) -> str:
        final, members = self._jars(ctx)
        if not self._missing(ctx):
            return f"CoreNLP jars present in {final}"
        src = ctx.sources["spice"]
        url = src["url"]
        archive = ctx.downloads / url.rsplit("/", 1)[-1]
        item = ctx.item(url, archive, size=src.get("size"), sha256=src.get("sha256"), approx=src.get("approx_bytes"))
        got = ctx.fetch_one(item, "spice CoreNLP zip")
        with ctx.validating(url, got, self.name):
            bad = zip_problem(archive)
            want_sha1 = src.get("sha1")
            if not bad and want_sha1 and file_checksum(archive, "sha1") != want_sha1:
                bad = f"sha1 differs from the published {want_sha1}"
            if bad:
                raise PrepareError(f"{ctx.source_of(item)}: {bad}; the archive was removed - run again")
            tmp, hashes = extract(archive, final.parent, members=members, limits=ctx.extract_limits)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            private_dir(final.parent)
            final.mkdir(mode=0o700, parents=True, exist_ok=True)
            private_dir(final)
            for m in members:
                os.replace(tmp / m, final / os.path.basename(m))
                sha, n = hashes[m]
                ctx.lock.record_file(ctx.rel(final / os.path.basename(m)), sha, n, self.name, ctx.source_of(item))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        # SPICE runs only jars it can trust: record what was extracted from the verified zip
        write_manifest(final, [os.path.basename(m) for m in members])
        archive.unlink(missing_ok=True)
        return f"CoreNLP jars laid out in {final}"

    def check(self, ctx: Context) -> list[str]:
        final, _ = self._jars(ctx)
        return [f"{final}: {m.rsplit('/', 1)[-1]} missing (run `adjcap prepare spice`)" for m in self._missing(ctx)]


NLTK = NltkStep()
SPICE = SpiceStep()
