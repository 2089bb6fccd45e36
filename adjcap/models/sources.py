"""Where a frozen model's files come from: a Hugging Face hub id, an open_clip pretrained tag, or a
local path. Every loader resolves its source here once, before it loads anything, and fails with one
line that names the missing file or model and how to get it (honouring ``HF_HUB_OFFLINE``).

* :func:`hub_or_dir` (transformers models and tokenizers: the BLIP verifier, the GPT-2 tokenizer): a
  ``save_pretrained`` directory, or a hub id that must be in the local cache when offline;
* :func:`clip_source` (open_clip): a pretrained tag (``laion2b_s39b_b160k``), ``hf-hub:org/repo``, a
  directory with an ``open_clip_config.json`` (a hub snapshot or a saved model: open_clip's own
  ``local-dir:`` loading reads the architecture and preprocessing from it), a bare checkpoint file
  (preprocessing and the QuickGELU switch pinned from what the architecture's known tags agree on),
  or ``None`` for random weights;
* :func:`existing_file` for single-file checkpoints (IFCap).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adjcap.registry import did_you_mean

OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_SUFFIXES = (".safetensors", ".bin", ".pth")  # what open_clip's local-dir loading looks for
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
PREFERRED_CHECKPOINTS = (
    "open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
    "open_clip_pytorch_model.pth", "model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth",
)
PREPROCESS_KEYS = ("size", "mode", "mean", "std", "interpolation", "resize_mode", "fill_color")


class ModelUnavailableError(FileNotFoundError):
    """Weights or tokenizer files that are neither on disk nor downloadable here; the message names
    the model, where the files come from and how to provide them."""


def hf_offline() -> bool:
    """True when HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE ask for no network access."""
    return any(os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def looks_like_path(text: str) -> bool:
    """A spec meant as a path (not a hub id ``org/name`` nor a tag)."""
    return (text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep != "/" and os.sep in text
            or text.endswith(CHECKPOINT_SUFFIXES))


def expand(spec: str | os.PathLike) -> Path:
    return Path(os.path.expanduser(str(spec)))


# --------------------------------------------------------------------------------------------
# Identity of local files
# --------------------------------------------------------------------------------------------


def file_fingerprint(path: Path) -> str:
    """sha256 of the file (files over 1 GiB: of its size, first and last 64 MiB: ``sha256s``)."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= (1 << 30):
            for buf in iter(lambda: f.read(1 << 24), b""):
                h.update(buf)
            return "sha256:" + h.hexdigest()[:16]
        h.update(str(size).encode())
        h.update(f.read(64 << 20))
        f.seek(size - (64 << 20))
        h.update(f.read(64 << 20))
    return "sha256s:" + h.hexdigest()[:16]


def dir_fingerprint(path: Path) -> str:
    """Names, sizes, first (and last) 64 MiB of the weight files of a ``save_pretrained`` directory."""
    weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    h = hashlib.sha256()
    for w in weights:
        size = w.stat().st_size
        h.update(w.name.encode() + str(size).encode())
        with open(w, "rb") as f:
            h.update(f.read(64 << 20))
            if size > (128 << 20):
                f.seek(size - (64 << 20))
                h.update(f.read(64 << 20))
    return "sha256s:" + h.hexdigest()[:16]


def find_checkpoint(folder: Path, suffixes: tuple[str, ...] = CHECKPOINT_SUFFIXES) -> Path | None:
    """The checkpoint open_clip would pick in ``folder``: a preferred name, else the first file by
    name, safetensors first."""
    for name in PREFERRED_CHECKPOINTS:
        if (folder / name).is_file() and (folder / name).suffix in suffixes:
            return folder / name
    found = sorted(p for p in folder.iterdir() if p.suffix in suffixes and p.is_file())
    found.sort(key=lambda p: p.suffix != ".safetensors")
    return found[0] if found else None


def existing_file(spec: str | os.PathLike, what: str, hint: str) -> Path:
    """``spec`` expanded, or FileNotFoundError naming it and ``hint`` (how to get it)."""
    path = expand(spec)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist. {hint}")
    return path


# --------------------------------------------------------------------------------------------
# Hugging Face: hub id or save_pretrained directory
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubSource:
    """What to hand ``from_pretrained``: a local directory or a hub id, and the identity to record."""

    source: str
    model_id: str
    local_only: bool
    is_dir: bool


def hub_or_dir(
    spec: str | os.PathLike, *, what: str, config_key: str,
    needs: tuple[tuple[str, ...], ...] = (("config.json",),), cache_dir: str | None = None,
    error: type[OSError] = ModelUnavailableError,
) -> HubSource:
    """Resolve a hub id or a local directory. A directory must hold one of the file groups in
    ``needs``; a hub id must be cached when offline (the first file of ``needs`` is probed)."""
    text = str(spec)
    path = expand(text)
    files = " or ".join(" + ".join(group) for group in needs)
    if path.is_dir():
        if not any(all((path / f).is_file() for f in group) for group in needs):
            raise error(f"{path}: no {files} in this directory; {what} ({config_key}) must be a directory "
                        f"with those files or a Hugging Face id")
        return HubSource(str(path), f"{path.name}/{dir_fingerprint(path)}", True, True)
    download = f"`huggingface-cli download {text} --local-dir DIR` on a machine with internet access"
    if path.exists() or looks_like_path(text):
        state = "is a file, not a directory" if path.exists() else "does not exist"
        raise error(f"{what} directory {path} {state}; set {config_key} to a directory with {files} "
                    f"or to a Hugging Face id")
    if hf_offline() and not hub_cached(text, needs[0][0], cache_dir):
        raise error(f"{what} '{text}' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: run "
                    f"{download} and set {config_key}=DIR, or copy the Hugging Face cache here")
    return HubSource(text, text, hf_offline(), False)


def hub_cached(repo: str, filename: str, cache_dir: str | None = None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    got = try_to_load_from_cache(repo, filename, cache_dir=cache_dir)
    return isinstance(got, str) and os.path.isfile(got)


# --------------------------------------------------------------------------------------------
# open_clip
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClipSource:
    """What ``open_clip.create_model`` is told: ``model`` (an architecture name, ``local-dir:DIR`` or
    ``hf-hub:REPO``), ``pretrained`` (a tag or a checkpoint file, only without a schema), and the
    preprocessing / activation it must be forced to use."""

    model: str
    pretrained: str | None
    model_cfg: dict[str, Any]
    model_id: str
    force_preprocess: dict[str, Any] = field(default_factory=dict)
    force_quick_gelu: bool = False
    quick_gelu_off: bool = False
    checkpoint: Path | None = None  # the local file that will be loaded


def unknown_model_error(model: str) -> ValueError:
    import open_clip

    return ValueError(f"unknown open_clip model '{model}'{did_you_mean(model, open_clip.list_models(), n=5)}"
                      " (open_clip.list_models() lists them all)")


def tag_files(pcfg: dict[str, Any]) -> tuple[str | None, list[str], str | None]:
    """(hub repo, candidate filenames, url) of a pretrained tag, as open_clip resolves them."""
    repo, files = None, []
    hub = pcfg.get("hf_hub") or ""
    if hub:
        repo, filename = os.path.split(hub)
        if filename:
            files = [filename]
            if filename.endswith((".bin", ".pth")) and filename != "pytorch_model.bin":
                files.insert(0, filename[:-4] + ".safetensors")
        else:
            files = ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
    return repo, files, pcfg.get("url") or None


def cached_tag_file(pcfg: dict[str, Any], cache_dir: str | None) -> Path | None:
    """The tag's weights file in the local Hugging Face cache (the file open_clip would read), or None."""
    from huggingface_hub import try_to_load_from_cache

    repo, files, _ = tag_files(pcfg)
    for fn in files if repo else ():
        got = try_to_load_from_cache(repo, fn, cache_dir=cache_dir)
        if isinstance(got, str) and os.path.isfile(got):
            return Path(got)
    return None


def tag_preprocess(pcfg: dict[str, Any]) -> dict[str, Any]:
    """The preprocessing a pretrained tag sets (what open_clip applies when it loads the tag)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k in ("mean", "std", "interpolation", "resize_mode")
            if (v := pcfg.get(k)) is not None}


def tag_cached(pcfg: dict[str, Any], cache_dir: str | None) -> bool:
    if cached_tag_file(pcfg, cache_dir) is not None:
        return True
    url = tag_files(pcfg)[2]
    return bool(url) and (Path(cache_dir or expand("~/.cache/clip")) / os.path.basename(url)).is_file()


def tag_unavailable(model: str, tag: str, pcfg: dict[str, Any], cause: str) -> ModelUnavailableError:
    repo, files, url = tag_files(pcfg)
    where = ([f"Hugging Face repo '{repo}' (file {' or '.join(files)})"] if repo else []) + ([f"URL {url}"] if url else [])
    return ModelUnavailableError(
        f"open_clip weights for model '{model}' with pretrained tag '{tag}' are not available: {cause}. "
        f"They come from {'; '.join(where) or 'the open_clip registry'}. Either download them on a machine "
        f"with internet access (e.g. `huggingface-cli download {repo or '<repo>'}`) and copy the Hugging Face "
        f"cache here, or pass the downloaded checkpoint file (or the snapshot directory) as `pretrained` "
        f"(config key retrieval.encoder.pretrained / captioner.clip.pretrained)."
    )


def pinned_from_tags(model: str) -> tuple[dict[str, Any], bool | None]:
    """Preprocessing and QuickGELU shared by every known tag of ``model`` (empty/None if they differ)."""
    import open_clip

    cfgs = [c for t in open_clip.list_pretrained_tags_by_model(model) if (c := open_clip.get_pretrained_cfg(model, t))]
    if not cfgs:
        return {}, None
    pp: dict[str, Any] = {}
    for key in ("mean", "std", "interpolation", "resize_mode"):
        values = {json.dumps(list(c[key]) if isinstance(c.get(key), tuple) else c.get(key)) for c in cfgs}
        if len(values) == 1 and cfgs[0].get(key) is not None:
            pp[key] = cfgs[0][key]
    qg = {bool(c.get("quick_gelu", False)) for c in cfgs}
    return pp, (qg.pop() if len(qg) == 1 else None)


def read_open_clip_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); fix or remove it") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with 'model_cfg' / 'preprocess_cfg'")
    return data


def clip_source(model: str, pretrained: str | os.PathLike | None, *, quick_gelu: bool | None = None,
                cache_dir: str | None = None, seed: int = 0) -> ClipSource:
    """Resolve an open_clip model and its weights without loading any (see the module docstring)."""
    import open_clip

    spec = None if pretrained is None or str(pretrained) == "" else str(pretrained)
    if spec is None and model.startswith(("hf-hub:", "local-dir:")):
        spec = model
    if spec is not None and spec.startswith("local-dir:"):
        spec = spec[len("local-dir:"):]
    if spec is not None and spec.startswith("hf-hub:"):
        src = _hub_snapshot(spec[len("hf-hub:"):], cache_dir)
    elif spec is not None and expand(spec).exists():
        src = _local(model, expand(spec), quick_gelu)
    else:
        model_cfg = open_clip.get_model_config(model)
        if model_cfg is None:
            raise unknown_model_error(model)
        if spec is None:
            src = ClipSource(model, None, model_cfg, f"{model}/random-seed{seed}")
        elif pcfg := open_clip.get_pretrained_cfg(model, spec) if not looks_like_path(spec) else {}:
            if hf_offline() and not tag_cached(pcfg, cache_dir):
                raise tag_unavailable(model, spec, pcfg, "HF_HUB_OFFLINE is set and they are not cached")
            qg = bool(pcfg.get("quick_gelu")) and not model_cfg.get("quick_gelu", False)
            # a tag already in the local cache is read from its file like a bare checkpoint (only the kept
            # towers, in the target dtype), with the tag's own preprocessing and activation; its identity
            # stays the tag. Files open_clip must convert still go through open_clip.
            cached = cached_tag_file(pcfg, cache_dir)
            src = ClipSource(model, spec, model_cfg, f"{model}/{spec}", force_quick_gelu=qg,
                             force_preprocess=tag_preprocess(pcfg) if cached else {}, checkpoint=cached)
        else:
            tags = ", ".join(open_clip.list_pretrained_tags_by_model(model)) or "(none registered)"
            if looks_like_path(spec):
                raise FileNotFoundError(
                    f"checkpoint '{spec}' for open_clip model '{model}' does not exist. Give the path of a downloaded "
                    f"checkpoint (.safetensors/.pt/.bin), its directory, or one of the pretrained tags: {tags}")
            raise ValueError(f"'{spec}' is neither a pretrained tag of open_clip model '{model}' nor an existing "
                             f"file. Known tags: {tags}")
    if quick_gelu is True and not src.model_cfg.get("quick_gelu", False):
        src = _replace(src, force_quick_gelu=True)  # open_clip's own switch
    elif quick_gelu is False:
        src = _replace(src, force_quick_gelu=False, quick_gelu_off=True)
    return src


def _replace(src: ClipSource, **changes: Any) -> ClipSource:
    from dataclasses import replace

    return replace(src, **changes)


def _hub_snapshot(repo: str, cache_dir: str | None) -> ClipSource:
    """``hf-hub:REPO``: open_clip reads ``open_clip_config.json`` and the weights from the hub."""
    if hf_offline() and not hub_cached(repo, OPEN_CLIP_CONFIG, cache_dir):
        raise ModelUnavailableError(
            f"open_clip model 'hf-hub:{repo}' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: "
            f"run `huggingface-cli download {repo} --local-dir DIR` on a machine with internet access and pass "
            f"DIR as `pretrained`, or copy the Hugging Face cache here")
    from huggingface_hub import hf_hub_download

    try:
        cfg = read_open_clip_config(Path(hf_hub_download(repo, OPEN_CLIP_CONFIG, cache_dir=cache_dir)))
    except OSError as e:
        raise ModelUnavailableError(f"open_clip model 'hf-hub:{repo}': {OPEN_CLIP_CONFIG} could not be "
                                    f"fetched ({e}); download the repo and pass its directory") from e
    return ClipSource(f"hf-hub:{repo}", None, cfg.get("model_cfg") or {}, f"hf-hub:{repo}")


def _local(model: str, path: Path, quick_gelu: bool | None) -> ClipSource:
    """A directory or a checkpoint file. Beside an ``open_clip_config.json`` with a ``model_cfg``,
    open_clip's ``local-dir:`` loading takes over; a bare file is loaded into the named architecture
    with the preprocessing (and activation) every known tag of that architecture agrees on."""
    import open_clip

    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        ckpt = find_checkpoint(path)
        if ckpt is None:
            raise FileNotFoundError(f"{path}: no checkpoint (*.safetensors, *.bin, *.pt, *.pth) in this "
                                    f"directory; point `pretrained` at the checkpoint file")
    elif path.suffix not in CHECKPOINT_SUFFIXES:
        raise ValueError(f"{path}: not a checkpoint file (expected {', '.join(CHECKPOINT_SUFFIXES)})")
    else:
        ckpt = path
    side_path = folder / OPEN_CLIP_CONFIG
    side = read_open_clip_config(side_path) if side_path.is_file() else {}
    model_id_tail = file_fingerprint(ckpt)
    if side.get("model_cfg"):
        chosen = find_checkpoint(folder, OPEN_CLIP_SUFFIXES)
        if chosen != ckpt:
            raise ValueError(
                f"{ckpt}: open_clip loads {chosen.name if chosen else 'no checkpoint'} from {folder} with its "
                f"{OPEN_CLIP_CONFIG}; point `pretrained` at the directory holding one *.safetensors/*.bin/*.pth")
        if not {"vision_cfg", "text_cfg"} <= set(side["model_cfg"]):
            raise ValueError(f"{side_path}: model_cfg lacks vision_cfg / text_cfg; open_clip reads the whole "
                             f"architecture from it (as from a hub snapshot's {OPEN_CLIP_CONFIG})")
        return ClipSource(f"local-dir:{folder}", None, side["model_cfg"], f"{model}/{model_id_tail}", checkpoint=ckpt)
    model_cfg = open_clip.get_model_config(model)
    if model_cfg is None:
        raise unknown_model_error(model)
    pp_tags, qg_tags = pinned_from_tags(model)
    pp = {k: v for k, v in (side.get("preprocess_cfg") or {}).items() if k in PREPROCESS_KEYS} or pp_tags
    qg = False
    if "quick_gelu" not in model_cfg and quick_gelu is None:
        if qg_tags is None and open_clip.list_pretrained_tags_by_model(model):
            warnings.warn(
                f"{ckpt}: the known '{model}' checkpoints differ in activation (QuickGELU or GELU) and this file "
                f"does not say which it is; assuming GELU. For OpenAI-trained weights use model='{model}-quickgelu' "
                f"or pass quick_gelu=True (or put {OPEN_CLIP_CONFIG} beside the file)", stacklevel=4)
        qg = bool(qg_tags)
    return ClipSource(model, str(ckpt), model_cfg, f"{model}/{model_id_tail}", force_preprocess=pp,
                      force_quick_gelu=qg, checkpoint=ckpt)


# --------------------------------------------------------------------------------------------
# What a config needs: every weights file / tag / hub id, and where it is found locally
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Weights:
    """One frozen model (or tokenizer) a config loads: ``kind`` "open_clip" (``name`` the model,
    ``tag`` the pretrained tag), "hf" (``name`` the hub id; ``tag`` which files: "verifier" or
    "tokenizer") or "file" (``name`` a local path)."""

    role: str
    kind: str
    name: str
    tag: str | None = None

    @property
    def key(self) -> str:
        return f"{self.name}/{self.tag}" if self.kind == "open_clip" else self.name

    def locate(self, cache_dir: str | None = None) -> str | None:
        """Where the files are on this machine (a path), without any network access; None if missing."""
        return LOCATORS[self.kind](self, cache_dir)


def _is_local(text: str) -> bool:
    return looks_like_path(text) or expand(text).exists()


def weights_of(cfg: Any, checkpoint: bool = True) -> list[Weights]:
    """The models a resolved config loads, deduplicated, in pipeline order (``checkpoint``: with the
    IFCap checkpoint file, which `adjcap prepare ifcap` fetches rather than `prepare models`)."""
    out: list[Weights] = []

    def clip(role: str, enc: Any) -> None:
        if enc.pretrained is None:
            return
        tag = str(enc.pretrained)
        out.append(Weights(role, "file", tag) if _is_local(tag) else Weights(role, "open_clip", enc.model, tag))

    def hub(role: str, value: str, files: str) -> None:
        out.append(Weights(role, "file" if _is_local(value) else "hf", value, None if _is_local(value) else files))

    clip("retrieval encoder", cfg.retrieval.encoder)
    if cfg.verifier.enabled and cfg.verifier.family == "clip":  # an open_clip model (and its hub tokenizer)
        clip("verifier", cfg.verifier)
        if tok := hf_tokenizer_of(cfg.verifier.model):
            hub("verifier tokenizer", tok, "tokenizer")
    elif cfg.verifier.enabled:
        hub("verifier", cfg.verifier.model, "verifier")
        if cfg.verifier.backend == "lavis":
            hub("verifier tokenizer", cfg.verifier.tokenizer, "tokenizer")
    cap = cfg.captioner
    ifcap = cap.family == "ifcap"
    if checkpoint and ifcap:
        out.append(Weights("IFCap checkpoint", "file", cap.checkpoint))
    if ifcap:
        clip("IFCap CLIP", cap.clip)
    elif cap.family == "hf":
        hub("captioner", cap.hf.model, "verifier")  # config + weights, as the verifier's
    elif cap.family == "vlm":
        hub("vision-language captioner", cap.vlm.model, "vlm")  # config + weights + processor + chat template
    clip("output scorer", cfg.scorer_encoder())
    clip("CLIPScore encoder", cfg.eval.clipscore)
    if ifcap:
        hub("GPT-2 tokenizer", cap.tokenizer, "tokenizer")
        if cap.lm_config != "gpt2":
            out.append(Weights("GPT-2 config", "file", cap.lm_config))
    seen: set[tuple[str, str]] = set()
    uniq = []
    for w in out:
        if (w.kind, w.key) not in seen:
            seen.add((w.kind, w.key))
            uniq.append(w)
    return uniq


def hf_tokenizer_of(model: str) -> str | None:
    """The Hugging Face tokenizer an open_clip architecture's text tower reads (SigLIP's), or None."""
    import open_clip

    return ((open_clip.get_model_config(model) or {}).get("text_cfg") or {}).get("hf_tokenizer_name")


def _locate_file(w: Weights, cache_dir: str | None) -> str | None:
    p = expand(w.name)
    return str(p) if p.exists() else None


def _locate_open_clip(w: Weights, cache_dir: str | None) -> str | None:
    import open_clip

    pcfg = open_clip.get_pretrained_cfg(w.name, w.tag or "")
    if not pcfg:
        return None
    hit = cached_tag_file(pcfg, cache_dir)
    if hit is not None:
        return str(hit)
    url = tag_files(pcfg)[2]
    p = Path(cache_dir or expand("~/.cache/clip")) / os.path.basename(url or "")
    return str(p) if url and p.is_file() else None


# the files a hub repo must hold locally, per what it is used as (any one of each group)
HUB_FILES = {"verifier": (("config.json",), ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")),
             "tokenizer": (("tokenizer.json", "vocab.json", "spiece.model"),),
             "vlm": (("config.json",), ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"),
                     ("processor_config.json", "preprocessor_config.json"))}


def _locate_hf(w: Weights, cache_dir: str | None) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = None
    for group in HUB_FILES.get(w.tag or "verifier", (("config.json",),)):
        hits = [got for f in group if isinstance(got := try_to_load_from_cache(w.name, f, cache_dir=cache_dir), str)
                and os.path.isfile(got)]
        if not hits:
            return None
        found = found or hits[0]
    return str(Path(found).parent) if found else None


LOCATORS = {"file": _locate_file, "open_clip": _locate_open_clip, "hf": _locate_hf}
