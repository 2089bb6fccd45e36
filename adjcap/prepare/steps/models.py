"""`models`: every frozen model a preset needs, into the caches its loaders read - open_clip tags into
the Hugging Face cache (or open_clip's URL cache), hub ids into the Hugging Face cache. Local paths
are only checked. Uses huggingface_hub, which honours HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Any

from adjcap.models.sources import Weights, hf_offline, weights_of
from adjcap.prepare.errors import NetworkError, PrepareError
from adjcap.prepare.steps.base import Context, Planned
from adjcap.prepare.verify import zip_problem

# what a role needs from a hub repo (patterns for snapshot_download)
_HF_FILES = {
    "verifier": ["*.json", "*.txt"],
    "tokenizer": ["*.json", "*.txt", "*.model"],  # *.model: SentencePiece (SigLIP's tokenizer)
    "vlm": ["*.json", "*.txt", "*.model", "*.jinja"],  # + the processor's chat template (chat_template.jinja)
}
_SHA_IN_URL = re.compile(r"/([0-9a-f]{64})/")


Need = Weights  # one model of a config (adjcap.models.sources owns what a config loads)


def configs(ctx: Context) -> list:
    """The resolved configs whose models the step fetches: ``--for``'s (Options.configs), else
    ``--preset`` with ``--set`` overrides."""
    from adjcap.config import ConfigError, load_config

    if ctx.opts.configs:
        return list(ctx.opts.configs)
    try:
        return [load_config(ctx.opts.preset, [f"paths.data_dir={ctx.data}", *ctx.opts.sets]).resolved()]
    except ConfigError as e:
        raise PrepareError(str(e)) from None


def needs(ctx: Context) -> list[Need]:
    """The models of the configs (without the IFCap checkpoint: `prepare ifcap`), deduplicated."""
    seen, out = set(), []
    for cfg in configs(ctx):
        for n in weights_of(cfg, checkpoint=False):
            if (n.kind, n.key) not in seen:
                seen.add((n.kind, n.key))
                out.append(n)
    return out


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


def present(ctx: Context, n: Need) -> str | None:
    """Where the model is found locally (a path), or None."""
    if n.kind == "open_clip":
        _open_clip_cfg(n)  # an unknown tag is an error, not a missing file
    return n.locate(ctx.opts.hf_cache_dir)


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
    if hf_offline():
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
        if n.tag in ("verifier", "vlm"):
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
        missing = [c.captioner.checkpoint for c in configs(ctx) if not Path(c.captioner.checkpoint).is_file()]
        return f"note: the IFCap checkpoint {missing[0]} comes from `adjcap prepare ifcap`" if missing else None

    def check(self, ctx: Context) -> list[str]:
        return [f"{n.role} {n.key}: not in the local caches (run `adjcap prepare models`)"
                for n in needs(ctx) if not present(ctx, n)]


STEP = ModelsStep()
