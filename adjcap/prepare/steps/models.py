"""`models`: every frozen model a preset needs, into the caches its loaders read - open_clip tags into
the Hugging Face cache (or open_clip's URL cache), hub ids into the Hugging Face cache. Local paths
are only checked. Uses huggingface_hub, which honours HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE."""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adjcap.prepare.errors import NetworkError, PrepareError
from adjcap.prepare.steps.base import Context, Planned
from adjcap.prepare.verify import zip_problem

# what a role needs from a hub repo (patterns for snapshot_download)
_HF_FILES = {
    "verifier": ["*.json", "*.txt"],
    "tokenizer": ["*.json", "*.txt"],
}
_SHA_IN_URL = re.compile(r"/([0-9a-f]{64})/")


@dataclass(frozen=True)
class Need:
    role: str
    kind: str  # "open_clip" | "hf" | "file"
    name: str  # hub id, open_clip model name or path
    tag: str | None = None  # open_clip: the pretrained tag; hf: which files ("verifier" | "tokenizer")

    @property
    def key(self) -> str:
        return f"{self.name}/{self.tag}" if self.kind == "open_clip" else self.name


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _is_path(text: str) -> bool:
    return text.startswith(("/", ".", "~")) or Path(os.path.expanduser(text)).exists() or text.endswith(
        (".pt", ".pth", ".bin", ".safetensors"))


def needs(ctx: Context) -> list[Need]:
    """The models of ``--preset`` (with ``--set`` overrides), deduplicated, in pipeline order."""
    from adjcap.config import ConfigError, load_config

    try:
        cfg = load_config(ctx.opts.preset, [f"paths.data_dir={ctx.data}", *ctx.opts.sets]).resolved()
    except ConfigError as e:
        raise PrepareError(str(e)) from None
    out: list[Need] = []

    def clip(role: str, model: str, tag: str | None) -> None:
        if tag is None:
            return
        out.append(Need(role, "file" if _is_path(tag) else "open_clip", tag if _is_path(tag) else model,
                        None if _is_path(tag) else tag))

    def hub(role: str, value: str, files: str) -> None:
        out.append(Need(role, "file" if _is_path(value) else "hf", value, files))

    clip("retrieval encoder", cfg.retrieval.encoder.model, cfg.retrieval.encoder.pretrained)
    if cfg.verifier.enabled:
        hub("verifier", cfg.verifier.model, "verifier")
    clip("IFCap CLIP", cfg.captioner.clip.model, cfg.captioner.clip.pretrained)
    clip("output scorer", cfg.scorer_encoder().model, cfg.scorer_encoder().pretrained)
    clip("CLIPScore encoder", cfg.eval.clipscore.model, cfg.eval.clipscore.pretrained)
    hub("GPT-2 tokenizer", cfg.captioner.tokenizer, "tokenizer")
    if cfg.captioner.lm_config != "gpt2":
        out.append(Need("GPT-2 config", "file", cfg.captioner.lm_config))
    seen, uniq = set(), []
    for n in out:
        if (n.kind, n.key) not in seen:
            seen.add((n.kind, n.key))
            uniq.append(n)
    return uniq


# ---- presence ------------------------------------------------------------------------------


def _open_clip_cfg(n: Need) -> dict[str, Any]:
    import open_clip

    pcfg = open_clip.get_pretrained_cfg(n.name, n.tag or "")
    if not pcfg:
        raise PrepareError(
            f"{n.role}: open_clip has no pretrained tag '{n.tag}' for model '{n.name}' "
            f"(open_clip.list_pretrained() lists them); pass a checkpoint file instead"
        )
    return pcfg


def _hf_cached(repo: str, filename: str, cache_dir: str | None) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    got = try_to_load_from_cache(repo, filename, cache_dir=cache_dir)
    return got if isinstance(got, str) and os.path.isfile(got) else None


def present(ctx: Context, n: Need) -> str | None:
    """Where the model is found locally (a path), or None."""
    cache = ctx.opts.hf_cache_dir
    if n.kind == "file":
        p = Path(os.path.expanduser(n.name))
        return str(p) if p.exists() else None
    if n.kind == "open_clip":
        from adjcap.models.sources import tag_cached, tag_files

        pcfg = _open_clip_cfg(n)
        if not tag_cached(pcfg, cache):
            return None
        repo, files, url = tag_files(pcfg)
        for f in files if repo else []:
            hit = _hf_cached(repo, f, cache)
            if hit:
                return hit
        return str(Path(cache or os.path.expanduser("~/.cache/clip")) / os.path.basename(url or ""))
    cfg_file = _hf_cached(n.name, "config.json", cache)
    if cfg_file is None:
        return None
    if n.tag == "verifier" and not any(_hf_cached(n.name, w, cache) for w in ("model.safetensors", "pytorch_model.bin")):
        return None
    if n.tag == "tokenizer" and not any(_hf_cached(n.name, w, cache) for w in ("tokenizer.json", "vocab.json")):
        return None
    return str(Path(cfg_file).parent)


def _revision(path: str) -> str | None:
    parts = Path(path).parts
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts else None


# ---- fetching ------------------------------------------------------------------------------


def _hub_error(n: Need, e: BaseException) -> PrepareError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return NetworkError(
        f"{n.role} {n.key}: download failed ({type(e).__name__}: {first}); check the network, HF_ENDPOINT "
        "and HF_TOKEN, or copy a Hugging Face cache from a machine with internet (HF_HOME)"
    )


def fetch(ctx: Context, n: Need) -> str:
    if n.kind == "file":
        raise PrepareError(f"{n.role}: {n.name} not found; it is a local path, so provide the file or "
                           "point the config at a hub id / open_clip tag")
    if _offline():
        raise PrepareError(
            f"{n.role} {n.key}: not in the local cache and HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE forbid "
            "downloading it; unset them (or copy a Hugging Face cache that holds it via HF_HOME)"
        )
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    cache = ctx.opts.hf_cache_dir
    try:
        if n.kind == "open_clip":
            from adjcap.models.sources import tag_files

            repo, files, url = tag_files(_open_clip_cfg(n))
            if repo:
                from huggingface_hub.utils import EntryNotFoundError

                for f in files:
                    try:
                        return hf_hub_download(repo, f, cache_dir=cache)
                    except EntryNotFoundError:
                        continue
                raise PrepareError(f"{n.role} {n.key}: none of {', '.join(files)} is in the hub repo {repo}")
            assert url
            dest = Path(cache or os.path.expanduser("~/.cache/clip")) / os.path.basename(url)
            m = _SHA_IN_URL.search(url)
            item = ctx.item(url, dest, sha256=m.group(1) if m else None)
            got = ctx.fetch_one(item, f"models {n.key}")
            with ctx.validating(url, got, "models"):
                if zipfile.is_zipfile(dest) and (bad := zip_problem(dest)):
                    raise PrepareError(f"{ctx.source_of(item)}: {bad}; the file was removed - run again")
            return str(got.item.dest)
        patterns = list(_HF_FILES[n.tag or "verifier"])
        if n.tag == "verifier":
            files = HfApi().list_repo_files(n.name)
            patterns.append("*.safetensors" if any(f.endswith(".safetensors") for f in files) else "*.bin")
        return snapshot_download(n.name, allow_patterns=patterns, cache_dir=cache, max_workers=ctx.opts.workers)
    except PrepareError:
        raise
    except Exception as e:  # noqa: BLE001 - hub/network errors of many types become one line
        raise _hub_error(n, e) from None


class ModelsStep:
    name = "models"
    summary = "frozen model weights of --preset (open_clip tags and hub ids) into the loaders' caches"

    def plan(self, ctx: Context) -> list[Planned]:
        approx = ctx.sources.get("models", {}).get("approx_bytes", {})
        out = []
        for n in needs(ctx):
            where = present(ctx, n)
            if where:
                out.append(Planned(f"{n.role} {n.key}", "(present)", where, 0, exact=True))
            elif n.kind == "file":
                out.append(Planned(f"{n.role} {n.key}", "(local path, missing)", n.name, None, note="missing"))
            else:
                src = "Hugging Face hub" if n.kind == "hf" else "open_clip pretrained tag"
                out.append(Planned(f"{n.role} {n.key}", src, "HF cache", approx.get(n.key)))
        return out

    def run(self, ctx: Context) -> str:
        done = []
        for n in needs(ctx):
            where = present(ctx, n)
            if where:
                ctx.say(f"models: {n.role} {n.key}: present ({where})")
                done.append(f"{n.key} present")
            else:
                ctx.say(f"models: {n.role} {n.key}: fetching")
                where = fetch(ctx, n)
                done.append(f"{n.key} fetched")
            if n.kind != "file":
                ctx.lock.record_model(f"{n.kind}:{n.key}", {"role": n.role, "revision": _revision(where), "path": where})
        ckpt = self._checkpoint(ctx)
        if ckpt:
            ctx.say(f"models: {ckpt}")
        return "; ".join(done)

    def _checkpoint(self, ctx: Context) -> str | None:
        from adjcap.config import load_config

        cfg = load_config(ctx.opts.preset, [f"paths.data_dir={ctx.data}", *ctx.opts.sets]).resolved()
        p = Path(cfg.captioner.checkpoint)
        return None if p.is_file() else f"note: the IFCap checkpoint {p} comes from `adjcap prepare ifcap`"

    def check(self, ctx: Context) -> list[str]:
        return [f"{n.role} {n.key}: not in the local caches (run `adjcap prepare models`)"
                for n in needs(ctx) if not present(ctx, n)]


STEP = ModelsStep()
