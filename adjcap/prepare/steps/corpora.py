"""``corpus-cc3m`` and ``corpus-laion-coco``: another caption corpus for retrieval (``retrieval.corpus``),
caption text only, from its published files (``sources.toml``: ``corpus_cc3m``, ``corpus_laion_coco``).

The files come through the same downloader as every step (resumable ``.partial``, size and sha256
checked, the first download's sha256 pinned in the lock); they are read with the corpus's reader
(:data:`adjcap.data.corpora.READERS`), sampled (``--max-captions N``: N captions drawn with the fixed
seed :data:`adjcap.data.corpora.SAMPLE_SEED`, kept in file order), and written as the registry's prepared
file, one caption a line, with its manifest (sources, sha256s, rows, the sample) beside it. Only then
are the downloads' sha256s trusted; the downloads are removed."""

from __future__ import annotations

import hashlib
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from adjcap.data.corpora import (SAMPLE_SEED, CorpusEntry, corpus_of_step, manifest_path, read_manifest, read_published,
                                 sample)
from adjcap.data.records import DataError
from adjcap.storage.io import atomic_write_bytes, atomic_write_json
from adjcap.prepare.errors import PrepareError
from adjcap.prepare.steps.base import Context, Planned


class CorpusStep:
    def __init__(self, name: str, source_key: str):
        self.name = name
        self.source_key = source_key
        entry = corpus_of_step(name)
        assert entry is not None, f"adjcap/data/corpora.toml names no corpus with source = {name!r}"
        self.entry: CorpusEntry = entry
        self.summary = f"{entry.title}: caption text only"

    def _src(self, ctx: Context) -> dict[str, Any]:
        return ctx.sources[self.source_key]

    def _urls(self, ctx: Context) -> list[str]:
        src = self._src(ctx)
        return [src["url"].format(shard=int(s)) for s in src["shards"]] if "shards" in src else [src["url"]]

    def _final(self, ctx: Context) -> Path:
        return self.entry.path(ctx.data, ctx.data)

    def _wanted(self, ctx: Context) -> dict[str, Any]:
        return {"max_captions": ctx.opts.max_captions, "seed": SAMPLE_SEED}

    def _present(self, ctx: Context) -> bool:
        final = self._final(ctx)
        man = read_manifest(final)
        return (final.is_file() and man is not None and man.get("sample") == self._wanted(ctx)
                and man.get("urls") == self._urls(ctx) and not self._problems(final, man))

    @staticmethod
    def _problems(final: Path, man: dict[str, Any]) -> list[str]:
        if not final.is_file():
            return [f"{final}: missing"]
        if hashlib.sha256(final.read_bytes()).hexdigest() != man.get("captions_sha256"):
            return [f"{final}: its content is not the one {manifest_path(final).name} records; prepare it again"]
        return []

    def _item(self, ctx: Context, url: str):
        src = self._src(ctx)
        name = url.rsplit("/", 1)[-1]
        names = tuple(src.get("local_names", ())) if len(self._urls(ctx)) == 1 else ()
        return ctx.item(url, ctx.downloads / name, size=src.get("size"), sha256=src.get("sha256"),
                        approx=src.get("approx_bytes"), local_names=names or (name,))

    def plan(self, ctx: Context) -> list[Planned]:
        final = self._final(ctx)
        if self._present(ctx):
            return [Planned(self.name, "(present)", str(final), 0, exact=True)]
        out = []
        for url in self._urls(ctx):
            item = self._item(ctx, url)
            exact = item.size or (item.local.stat().st_size if item.local else ctx.downloader.head_size(item.url))
            n = ctx.opts.max_captions
            out.append(Planned(self.name, ctx.source_of(item), str(final), exact or item.approx, exact=bool(exact),
                               note=f"{n} captions sampled" if n else ""))
        return out

    def run(self, ctx: Context) -> str:
        final = self._final(ctx)
        if self._present(ctx):
            return f"present in {final}"
        urls = self._urls(ctx)
        items = [self._item(ctx, u) for u in urls]
        got = ctx.downloader.fetch_all(items, f"{self.name} files")
        src = self._src(ctx)
        with ExitStack() as stack:
            for u, g in zip(urls, got):
                stack.enter_context(ctx.validating(u, g, self.name))
            try:
                caps = read_published(self.entry, [it.dest for it in items])
            except (DataError, UnicodeDecodeError, OSError) as e:
                raise PrepareError(f"{self.name}: {str(e).splitlines()[0]}; the download was removed - run again") from None
            want = src.get("expect_rows")
            if want is not None and len(caps) != int(want):
                raise PrepareError(f"{self.name}: {len(caps)} captions in {', '.join(ctx.source_of(i) for i in items)}, "
                                   f"the published file has {want}; the download was removed - run again")
            if not caps:
                raise PrepareError(f"{self.name}: no captions in {ctx.source_of(items[0])}; the download was removed")
            chosen = sample(caps, ctx.opts.max_captions)
            body = ("\n".join(chosen) + "\n").encode("utf-8")
            atomic_write_bytes(final, body)
            sha = hashlib.sha256(body).hexdigest()
            atomic_write_json(manifest_path(final), {
                "corpus": self.entry.name, "title": self.entry.title, "licence": self.entry.licence,
                "urls": urls, "sources": [{"url": u, "sha256": g.sha256, "bytes": g.size} for u, g in zip(urls, got)],
                "source_captions": len(caps), "captions": len(chosen), "sample": self._wanted(ctx),
                "captions_sha256": sha})
        ctx.lock.record_file(ctx.rel(final), sha, len(body), self.name, ", ".join(ctx.source_of(i) for i in items))
        for it in items:
            Path(it.dest).unlink(missing_ok=True)  # their sha256s stay in the lock
        n = ctx.opts.max_captions
        return (f"{len(chosen):,} captions" + (f" sampled of {len(caps):,} (seed {SAMPLE_SEED})" if n and n < len(caps)
                                                else "") + f" in {final}; licence: {self.entry.licence}")

    def check(self, ctx: Context) -> list[str]:
        final = self._final(ctx)
        man = read_manifest(final)
        if not final.is_file() or man is None:
            return [f"{final}: missing (run `adjcap prepare {self.name}`)"]
        return self._problems(final, man)


CC3M = CorpusStep("corpus-cc3m", "corpus_cc3m")
LAION_COCO = CorpusStep("corpus-laion-coco", "corpus_laion_coco")
