"""Benchmark readers: reference captions (and image paths) from the usual annotation layouts.

Layouts understood (``fmt`` names in brackets; ``auto`` detects them from the content):

- **karpathy**: Karpathy's ``dataset_coco.json`` / ``dataset_flickr30k.json``:
  ``{"images": [{"filepath", "filename", "split", "sentences": [{"raw"}], "cocoid"?}]}``. The split
  ``train`` means Karpathy's ``train`` + ``restval`` (the 113K-image training set).
- **ifcap**: IFCap/ViECap ``annotations/<ds>/{train,val,test}_captions.json`` = ``{file name: [captions]}``;
  a directory ``annotations/<ds>/`` is accepted too (the file ``<split>_captions.json`` is read).
- **nocaps**: the official ``nocaps_val_4500_captions.json`` (COCO style; ``images[]`` carry
  ``open_images_id`` and ``domain``) or IFCap's ``nocaps_corpus.json`` (a list of
  ``{"split": in_domain|near_domain|out_domain, "image_id", "caption": [...]}``). Domains come out as
  ``in-domain`` / ``near-domain`` / ``out-domain``.
- **coco**: a COCO captions annotation file ``{"images": [{"id", "file_name"?}], "annotations":
  [{"image_id", "caption"}]}`` (e.g. ``captions_val2014.json`` or BLIP's ``coco_karpathy_test_gt.json``);
  the BLIP/LAVIS list ``[{"image": "val2014/....jpg", "caption": [...]}]`` is read under ``coco`` or
  ``lavis``.
- **folder**: a directory of images (searched recursively) without references, for captioning one's
  own images.

Canonical image ids are strings: the image file name where the layout has one
(``COCO_val2014_000000391895.jpg``, ``1007129816.jpg``, ``0.jpg``), otherwise the numeric id as a string
(``391895``). :class:`References` maps the other spellings (numeric COCO id, file name, stem, relative
path, Open Images id) back to the canonical id.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Iterable

from adjcap.data.records import DataError, Record, offenders

FORMATS = ("karpathy", "ifcap", "nocaps", "coco", "lavis", "folder")
NOCAPS_DOMAINS = ("in-domain", "near-domain", "out-domain")
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})

# which content layouts each --format accepts
_ACCEPTS: dict[str, tuple[str, ...]] = {
    "karpathy": ("karpathy",),
    "ifcap": ("ifcap", "ifcap_nocaps"),
    "nocaps": ("nocaps_official", "ifcap_nocaps"),
    "coco": ("coco", "nocaps_official", "lavis"),
    "lavis": ("lavis",),
    "folder": ("folder",),
}
_LAYOUT_FORMAT = {
    "karpathy": "karpathy",
    "ifcap": "ifcap",
    "ifcap_nocaps": "nocaps",
    "nocaps_official": "nocaps",
    "coco": "coco",
    "lavis": "lavis",
    "folder": "folder",
}
_LAYOUT_DESC = {
    "karpathy": "a Karpathy dataset_*.json",
    "ifcap": "an IFCap/ViECap {file name: [captions]} file",
    "ifcap_nocaps": "IFCap's nocaps_corpus.json",
    "nocaps_official": "the official nocaps captions file",
    "coco": "a COCO captions annotation file",
    "lavis": "a BLIP/LAVIS annotation list",
    "folder": "a folder of images",
}
_COCO_NAME = re.compile(r"^COCO_[A-Za-z]+\d*_(\d+)$")


def normalize_domain(value: Any) -> str | None:
    """``in_domain`` / ``in-domain`` / ``in`` (any case) -> ``in-domain``; likewise near, out."""
    if value is None:
        return None
    s = str(value).strip().lower().replace("_", "-").replace(" ", "-")
    for d in NOCAPS_DOMAINS:
        if s in (d, d.split("-")[0], d.replace("-", "")):
            return d
    return None


def coco_id_from_name(name: str) -> int | None:
    """``COCO_val2014_000000391895.jpg`` (or a path ending in it) -> 391895; else None."""
    stem = _stem(name)
    m = _COCO_NAME.match(stem)
    return int(m.group(1)) if m else None


def _basename(s: str) -> str:
    return s.replace("\\", "/").rsplit("/", 1)[-1]


def _stem(s: str) -> str:
    b = _basename(s)
    i = b.rfind(".")
    return b[:i] if i > 0 else b


# --------------------------------------------------------------------------------------------
# JSON loading and layout detection
# --------------------------------------------------------------------------------------------


try:  # optional: 3-5x faster on the 150 MB Karpathy files
    import orjson as _orjson

    def _json_loads(raw: bytes) -> Any:
        return _orjson.loads(raw)

except ImportError:  # pragma: no cover - depends on the environment

    def _json_loads(raw: bytes) -> Any:
        return json.loads(raw)


def _load_json(path: Path) -> Any:
    if not path.exists():
        raise DataError(
            f"{path}: file not found. Check the path (for a configured benchmark: "
            "--set benchmarks.<name>.annotations=FILE); see the README for where each benchmark's "
            "annotation files come from."
        )
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a JSON annotation file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e})") from e
    if not raw.strip():
        raise DataError(f"{path}: the file is empty; expected JSON annotations (re-download or re-copy it)")
    try:
        return _json_loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(
            f"{path}: not valid JSON ({e}); the file is probably truncated or not an annotation file"
        ) from e


def _first_dicts(items: list[Any], n: int = 5) -> list[dict[str, Any]]:
    return [x for x in items[:n] if isinstance(x, dict)]


def _layout_of(obj: Any, path: Path) -> str:
    """Name the content layout of a parsed annotation file, or raise DataError saying what was seen."""
    if isinstance(obj, dict):
        imgs = obj.get("images")
        if isinstance(imgs, list):
            head = _first_dicts(imgs)
            if "annotations" in obj:
                if any("open_images_id" in d or "domain" in d for d in head):
                    return "nocaps_official"
                return "coco"
            if any("sentences" in d for d in head):
                return "karpathy"
            if not imgs:
                raise DataError(f"{path}: 'images' is an empty list; the file has no images")
            raise DataError(
                f"{path}: has an 'images' list but neither 'annotations' (COCO format) nor "
                f"per-image 'sentences' (Karpathy format); first entry: {str(imgs[0])[:200]}"
            )
        if obj and any(isinstance(v, list) for v in islice(obj.values(), 5)):
            return "ifcap"
        if not obj:
            raise DataError(f"{path}: the JSON object is empty; the file has no images")
        keys = ", ".join(repr(k) for k in list(obj)[:8])
        raise DataError(
            f"{path}: unrecognised annotation layout (a JSON object with keys {keys}). Expected a "
            "Karpathy dataset_*.json, a COCO captions file, the nocaps val captions file, or an "
            "IFCap {file name: [captions]} file"
        )
    if isinstance(obj, list):
        if not obj:
            raise DataError(f"{path}: the JSON list is empty; the file has no images")
        head = _first_dicts(obj)
        if head:
            d = head[0]
            if "image_name" in d and "prediction" in d:
                raise DataError(
                    f"{path}: looks like generated captions (an IFCap/ViECap output with "
                    "'prediction'), not a reference annotation file"
                )
            if "image_id" in d and "caption" in d and "split" in d:
                return "ifcap_nocaps"
            if "image" in d and "caption" in d:
                return "lavis"
            if "image" in d:
                raise DataError(
                    f"{path}: a BLIP/LAVIS image list without 'caption' fields; it holds no reference "
                    "captions (for nocaps use IFCap's nocaps_corpus.json or nocaps_val_4500_captions.json)"
                )
            if "image_id" in d and "caption" in d:
                raise DataError(
                    f"{path}: looks like a COCO results (predictions) list [{{image_id, caption}}], "
                    "not a reference annotation file"
                )
        raise DataError(
            f"{path}: unrecognised annotation layout (a JSON list whose first entry is "
            f"{str(obj[0])[:200]}). Expected IFCap's nocaps_corpus.json or a BLIP/LAVIS list"
        )
    raise DataError(f"{path}: unrecognised annotation layout (top-level JSON {type(obj).__name__})")


def _dir_layout(path: Path) -> str:
    if any((path / f"{s}_captions.json").is_file() for s in ("test", "val", "train")) or (
        path / "nocaps_corpus.json"
    ).is_file():
        return "ifcap"
    return "folder"


def detect_format(path: str | Path) -> str:
    """The ``fmt`` name (karpathy | ifcap | nocaps | coco | lavis | folder) of an annotation file or
    directory. Raises DataError when the file is missing or its layout is not recognised."""
    p = Path(path)
    if p.is_dir():
        return _dir_layout(p)
    return _LAYOUT_FORMAT[_layout_of(_load_json(p), p)]


# --------------------------------------------------------------------------------------------
# Parsing into entries
# --------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    image_id: str
    rel_paths: tuple[str, ...]  # candidate paths relative to the image root, best first
    refs: Any  # as found in the file; validated later
    domain: str | None = None
    coco_id: int | None = None
    split: str | None = None  # the file's own split tag (Karpathy)
    aliases: tuple[str, ...] = ()
    numeric_id: int | None = None  # a COCO-style numeric id without a file name


def _require(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise DataError(f"{path}: {what}")


def _schema_offenders(path: Path, bad: list[str], what: str) -> None:
    if bad:
        raise DataError(f"{path}: {what}: {offenders(bad)}. Fix or remove these entries.")


def _parse_ifcap(obj: dict[str, Any], path: Path) -> list[_Entry]:
    out = []
    for key, refs in obj.items():
        cid = coco_id_from_name(key)
        out.append(
            _Entry(
                image_id=key,
                rel_paths=(key,) if _basename(key) == key else (key, _basename(key)),
                refs=refs,
                coco_id=cid,
                aliases=(_basename(key), _stem(key)) + ((str(cid),) if cid is not None else ()),
            )
        )
    return out


def _parse_ifcap_nocaps(obj: list[Any], path: Path) -> list[_Entry]:
    bad = [str(i) for i, d in enumerate(obj) if not isinstance(d, dict) or "image_id" not in d]
    _schema_offenders(path, bad, "entries without an 'image_id' (list indices)")
    out = []
    bad_dom = []
    for d in obj:
        key = str(d["image_id"])
        dom = normalize_domain(d.get("split"))
        if dom is None:
            bad_dom.append(f"{key}: {d.get('split')!r}")
        out.append(
            _Entry(
                image_id=key,
                rel_paths=(key,),
                refs=d.get("caption"),
                domain=dom,
                aliases=(_basename(key), _stem(key)),
            )
        )
    _schema_offenders(path, bad_dom, "entries whose 'split' is not in_domain/near_domain/out_domain")
    return out


def _group_annotations(obj: dict[str, Any], path: Path) -> dict[Any, list[Any]]:
    anns = obj.get("annotations")
    _require(isinstance(anns, list), path, "'annotations' must be a list of {image_id, caption}")
    by_img: dict[Any, list[Any]] = {}
    bad = []
    for i, a in enumerate(anns):
        if not isinstance(a, dict) or "image_id" not in a or "caption" not in a:
            bad.append(str(i))
            continue
        by_img.setdefault(a["image_id"], []).append(a["caption"])
    _schema_offenders(path, bad, "annotations without 'image_id' and 'caption' (list indices)")
    return by_img


def _parse_coco(obj: dict[str, Any], path: Path, nocaps: bool) -> list[_Entry]:
    imgs = obj["images"]
    by_img = _group_annotations(obj, path)
    out = []
    bad = []
    bad_dom = []
    seen = set()
    for i, im in enumerate(imgs):
        if not isinstance(im, dict) or "id" not in im:
            bad.append(str(i))
            continue
        num = im["id"]
        seen.add(num)
        fname = im.get("file_name")
        num_int = num if isinstance(num, int) else (int(num) if str(num).isdigit() else None)
        aliases: list[str] = [str(num)]
        if nocaps:
            dom = normalize_domain(im.get("domain"))
            if dom is None:
                bad_dom.append(f"{num}: {im.get('domain')!r}")
            oid = im.get("open_images_id")
            if oid:
                aliases.append(str(oid))
            if not fname and oid:
                fname = f"{oid}.jpg"
            coco_id = None
        else:
            dom = None
            coco_id = coco_id_from_name(fname) if fname else num_int
            if coco_id is None:
                coco_id = num_int
        if fname:
            image_id = _basename(str(fname))
            aliases += [str(fname), _stem(str(fname))]
            rel = (str(fname),) if str(fname) == image_id else (str(fname), image_id)
        else:
            image_id = str(num)
            rel = ()
        out.append(
            _Entry(
                image_id=image_id,
                rel_paths=rel,
                refs=by_img.get(num, []),
                domain=dom,
                coco_id=coco_id,
                aliases=tuple(aliases),
                numeric_id=num_int if not fname else None,
            )
        )
    _schema_offenders(path, bad, "'images' entries without an 'id' (list indices)")
    _schema_offenders(path, bad_dom, "images whose 'domain' is not in-domain/near-domain/out-domain")
    orphans = [str(k) for k in by_img if k not in seen]
    _schema_offenders(path, orphans, "annotations refer to image ids missing from 'images'")
    return out


def _karpathy_images(obj: dict[str, Any], path: Path, split: str | None) -> list[dict[str, Any]]:
    """The raw image dicts of ``split`` (``train`` = train + restval), checked for filename/split."""
    imgs = obj["images"]
    bad = [str(i) for i, im in enumerate(imgs) if not isinstance(im, dict) or "filename" not in im or "split" not in im]
    _schema_offenders(path, bad, "'images' entries without 'filename' and 'split' (list indices)")
    if split is None:
        raise DataError(
            f"{path}: a Karpathy file holds several splits ({_split_counts(imgs)}); say which one (--split)"
        )
    wanted = {"train", "restval"} if split == "train" else {split}
    sel = [im for im in imgs if im["split"] in wanted]
    if not sel:
        raise DataError(f"{path}: no images in split '{split}'; the file has: {_split_counts(imgs)}")
    return sel


def _split_counts(imgs: list[dict[str, Any]]) -> str:
    counts = Counter(str(im["split"]) for im in imgs)
    return ", ".join(f"{k} ({v})" for k, v in sorted(counts.items()))


def _parse_karpathy(obj: dict[str, Any], path: Path, split: str | None) -> list[_Entry]:
    out = []
    for im in _karpathy_images(obj, path, split):
        fname = str(im["filename"])
        fpath = im.get("filepath")
        cid = im.get("cocoid")
        cid = int(cid) if isinstance(cid, int) or (isinstance(cid, str) and cid.isdigit()) else None
        if cid is None:
            cid = coco_id_from_name(fname)
        sents = im.get("sentences")
        refs: Any
        if isinstance(sents, list):
            refs = []
            for s in sents:
                if isinstance(s, dict) and isinstance(s.get("raw"), str):
                    refs.append(s["raw"])
                elif isinstance(s, dict) and isinstance(s.get("tokens"), list):
                    refs.append(" ".join(map(str, s["tokens"])))
                else:
                    refs.append(s)  # rejected by validation with the image named
        else:
            refs = sents
        rel = (f"{fpath}/{fname}", fname) if fpath else (fname,)
        aliases = [fname, _stem(fname)]
        if cid is not None:
            aliases.append(str(cid))
        if fpath:
            aliases.append(f"{fpath}/{fname}")
        out.append(
            _Entry(
                image_id=fname,
                rel_paths=rel,
                refs=refs,
                coco_id=cid,
                split=str(im["split"]),
                aliases=tuple(aliases),
            )
        )
    return out


def _parse_lavis(obj: list[Any], path: Path) -> list[_Entry]:
    bad = [str(i) for i, d in enumerate(obj) if not isinstance(d, dict) or not isinstance(d.get("image"), str)]
    _schema_offenders(path, bad, "entries without an 'image' path string (list indices)")
    by_key: dict[str, _Entry] = {}
    for d in obj:
        img = d["image"]
        cap = d.get("caption")
        key = _basename(img)
        e = by_key.get(key)
        if e is None:
            cid = coco_id_from_name(key)
            al = [img, _stem(key)] + ([str(cid)] if cid is not None else [])
            if "image_id" in d:
                al.append(str(d["image_id"]))
            e = by_key[key] = _Entry(
                image_id=key,
                rel_paths=(img, key) if img != key else (key,),
                refs=[],
                coco_id=cid,
                aliases=tuple(al),
            )
        if isinstance(cap, list):
            e.refs.extend(cap)
        else:
            e.refs.append(cap)
    return list(by_key.values())


def _scan_folder(root: Path) -> list[_Entry]:
    if not root.exists():
        raise DataError(f"{root}: image folder not found; check the path given as images/annotations")
    if not root.is_dir():
        raise DataError(f"{root}: not a directory; the 'folder' format takes a directory of images")
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in filenames:
            if not fn.startswith(".") and os.path.splitext(fn)[1].lower() in IMAGE_EXTENSIONS:
                files.append(Path(dirpath, fn).relative_to(root).as_posix())
    files.sort()
    if not files:
        raise DataError(
            f"{root}: no image files found (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}, recursively)"
        )
    out = []
    for rel in files:
        base = _basename(rel)
        cid = coco_id_from_name(base)
        al = (base, _stem(rel)) + ((str(cid),) if cid is not None else ())
        out.append(_Entry(image_id=rel, rel_paths=(rel,), refs=(), coco_id=cid, aliases=al))
    return out


def _ifcap_file_in_dir(d: Path, split: str | None, fmt: str) -> Path:
    cands = [d / f"{split}_captions.json"] if split else []
    if fmt == "nocaps":
        cands.insert(0, d / "nocaps_corpus.json")
    else:
        cands.append(d / "nocaps_corpus.json")
    for c in cands:
        if c.is_file():
            return c
    have = sorted(p.name for p in d.glob("*.json"))
    raise DataError(
        f"{d}: no {split}_captions.json in this annotation directory (found: "
        f"{', '.join(have) or 'no JSON files'}); pass the annotation file itself or the right split"
    )


def _entries(
    fmt: str, annotations: Path, split: str | None
) -> tuple[str, Path, list[_Entry]]:
    """Parse ``annotations`` as ``fmt`` -> (layout, file actually read, entries)."""
    if fmt not in FORMATS and fmt != "auto":
        raise DataError(f"unknown benchmark format '{fmt}'; use one of: {', '.join(FORMATS)}, auto")
    if fmt == "folder" or (fmt == "auto" and annotations.is_dir() and _dir_layout(annotations) == "folder"):
        return "folder", annotations, _scan_folder(annotations)
    if annotations.is_dir():
        if fmt not in ("ifcap", "nocaps", "auto"):
            raise DataError(f"{annotations}: is a directory; format '{fmt}' needs an annotation file")
        annotations = _ifcap_file_in_dir(annotations, split, fmt)
    obj = _load_json(annotations)
    layout = _layout_of(obj, annotations)
    if fmt != "auto" and layout not in _ACCEPTS[fmt]:
        raise DataError(
            f"{annotations}: this is {_LAYOUT_DESC[layout]} (format '{_LAYOUT_FORMAT[layout]}'), "
            f"not format '{fmt}'. Pass --format {_LAYOUT_FORMAT[layout]} (or auto)"
        )
    if layout == "ifcap":
        entries = _parse_ifcap(obj, annotations)
    elif layout == "ifcap_nocaps":
        entries = _parse_ifcap_nocaps(obj, annotations)
    elif layout == "nocaps_official":
        entries = _parse_coco(obj, annotations, nocaps=True)
    elif layout == "coco":
        entries = _parse_coco(obj, annotations, nocaps=False)
    elif layout == "karpathy":
        entries = _parse_karpathy(obj, annotations, split)
    else:
        entries = _parse_lavis(obj, annotations)
    return layout, annotations, entries


def _clean_refs(entries: list[_Entry], path: Path) -> list[tuple[str, ...]]:
    """Validate reference lists; drop blank captions; error on wrong types or empty references."""
    wrong: list[str] = []
    empty: list[str] = []
    out: list[tuple[str, ...]] = []
    for e in entries:
        refs = e.refs
        if not isinstance(refs, (list, tuple)) or not all(isinstance(c, str) for c in refs):
            wrong.append(e.image_id)
            out.append(())
            continue
        kept = tuple(c for c in refs if c.strip())
        if not kept:
            empty.append(e.image_id)
        out.append(kept)
    _schema_offenders(path, wrong, "reference captions must be a list of strings; these images do not have one")
    if empty:
        raise DataError(
            f"{path}: images with no reference captions: {offenders(empty)}. Every image of a "
            "benchmark needs at least one reference; remove these images or use the right annotation file"
        )
    dup = [k for k, v in Counter(e.image_id for e in entries).items() if v > 1]
    _schema_offenders(path, dup, "image ids listed more than once")
    return out


# --------------------------------------------------------------------------------------------
# Image paths
# --------------------------------------------------------------------------------------------


def _numeric_index(root: Path) -> dict[int, str]:
    """Map the trailing number of every image file name under root (non-recursive, then one level
    down) to its relative path, for COCO files that list only numeric ids."""
    idx: dict[int, str] = {}
    pat = re.compile(r"(\d+)$")
    for sub in [root] + sorted(p for p in root.iterdir() if p.is_dir()):
        for p in sub.iterdir():
            if p.suffix.lower() in IMAGE_EXTENSIONS:
                m = pat.search(p.stem)
                if m:
                    idx.setdefault(int(m.group(1)), p.relative_to(root).as_posix())
    return idx


def _image_paths(
    entries: list[_Entry], images: Path | None, check: bool, annotations: Path
) -> list[str | None]:
    if images is None:
        return [None] * len(entries)
    if not images.exists():
        raise DataError(
            f"{images}: image folder not found (images for {annotations}). Point the benchmark's "
            "images path at the folder holding the image files (--set benchmarks.<name>.images=DIR)"
        )
    if not images.is_dir():
        raise DataError(f"{images}: not a directory; the images path must be the folder of image files")
    num_idx: dict[int, str] | None = None
    out: list[str | None] = []
    missing: list[str] = []
    for e in entries:
        rels = list(e.rel_paths)
        if not rels and e.numeric_id is not None:
            if num_idx is None:
                num_idx = _numeric_index(images)
            hit = num_idx.get(e.numeric_id)
            rels = [hit] if hit else []
        if not rels:
            if check:
                missing.append(e.image_id)
            out.append(None)
            continue
        chosen = None
        if check:
            for r in rels:
                p = images / r
                if p.is_file():
                    chosen = p
                    break
            if chosen is None:
                missing.append(rels[0])
        else:
            chosen = images / rels[0]
        out.append(str(chosen) if chosen is not None else None)
    if missing:
        raise DataError(
            f"{len(missing)} of {len(entries)} images listed in {annotations} are not in {images}: "
            f"{offenders(missing)}. Point the images path at the folder that holds them "
            "(--set benchmarks.<name>.images=DIR), or use check_images=False to keep them and report "
            "each as a per-image error."
        )
    return out


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def read_benchmark(
    fmt: str,
    annotations: str | Path,
    images: str | Path | None,
    split: str,
    *,
    limit: int | None = None,
    check_images: bool = True,
) -> list[Record]:
    """Read one split of a benchmark as :class:`Record` s, in file order.

    ``fmt``: karpathy | ifcap | nocaps | coco | lavis | folder | auto. ``images``: the image root
    (None: records carry no image path; for ``folder`` it defaults to ``annotations``).
    ``limit``: keep the first N images. ``check_images``: every image must exist under ``images``
    (otherwise a DataError lists the missing ones).
    """
    ann = Path(annotations).expanduser()
    img_root = Path(images).expanduser() if images is not None else None
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0, got {limit}")
    layout, src, entries = _entries(fmt, ann, split)
    if layout == "folder":
        img_root = img_root or src
        if img_root != src:
            entries = _scan_folder(img_root)
    if limit is not None:
        entries = entries[:limit]
    if layout == "folder":
        refs = [() for _ in entries]
    else:
        refs = _clean_refs(entries, src)
    paths = _image_paths(entries, img_root, check_images, src)
    return [
        Record(
            image_id=e.image_id,
            image_path=p,
            references=r,
            split=split,
            domain=e.domain,
            coco_id=e.coco_id,
        )
        for e, r, p in zip(entries, refs, paths)
    ]


@dataclass
class References:
    """Reference captions keyed by canonical image id, plus the id spellings predictions may use."""

    captions: dict[str, list[str]]
    domains: dict[str, str] | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    source: str = ""
    fmt: str = ""

    def __len__(self) -> int:
        return len(self.captions)

    @property
    def ids(self) -> list[str]:
        return list(self.captions)

    def resolve(self, pred_image_id: Any) -> str | None:
        """The canonical id for a prediction's ``image_id`` (int or str: numeric COCO id, file name,
        relative path, stem), or None when it matches no image."""
        if pred_image_id is None or isinstance(pred_image_id, bool):
            return None
        if isinstance(pred_image_id, float):
            if not pred_image_id.is_integer():
                return None
            pred_image_id = int(pred_image_id)
        if isinstance(pred_image_id, int) or type(pred_image_id).__name__.startswith(("int", "uint")):
            key = str(int(pred_image_id))
        else:
            key = str(pred_image_id).strip()
        tries = [key]
        base = _basename(key)
        tries += [base, _stem(base)]
        if key.isdigit():
            tries.append(str(int(key)))
        cid = coco_id_from_name(base)
        if cid is not None:
            tries.append(str(cid))
        for k in tries:
            if k in self.captions:
                return k
            hit = self.aliases.get(k)
            if hit is not None:
                return hit
        return None

    def subset(self, ids: Iterable[str]) -> "References":
        keep = [i for i in ids if i in self.captions]
        ks = set(keep)
        return References(
            captions={i: self.captions[i] for i in keep},
            domains={i: self.domains[i] for i in keep} if self.domains is not None else None,
            aliases={a: c for a, c in self.aliases.items() if c in ks},
            source=self.source,
            fmt=self.fmt,
        )

    @classmethod
    def from_records(cls, records: list[Record], source: str = "", fmt: str = "") -> "References":
        entries = [
            _Entry(
                image_id=r.image_id,
                rel_paths=(),
                refs=list(r.references),
                domain=r.domain,
                coco_id=r.coco_id,
                aliases=(_basename(r.image_id), _stem(r.image_id))
                + ((str(r.coco_id),) if r.coco_id is not None else ()),
            )
            for r in records
        ]
        return _build_references(entries, [list(r.references) for r in records], source, fmt)


def _build_references(entries: list[_Entry], refs: list[Any], source: str, fmt: str) -> References:
    captions = {e.image_id: list(r) for e, r in zip(entries, refs)}
    has_dom = any(e.domain is not None for e in entries)
    domains = {e.image_id: e.domain for e in entries if e.domain is not None} if has_dom else None
    aliases: dict[str, str] = {}
    ambiguous: set[str] = set()
    for e in entries:
        for a in e.aliases:
            if not a or a in captions or a in ambiguous:
                continue
            prev = aliases.get(a)
            if prev is None:
                aliases[a] = e.image_id
            elif prev != e.image_id:
                ambiguous.add(a)
                del aliases[a]
    return References(captions=captions, domains=domains, aliases=aliases, source=source, fmt=fmt)


def read_references(path: str | Path, fmt: str = "auto", split: str | None = None) -> References:
    """Reference captions of an annotation file (any layout but ``folder``).

    ``split`` selects the split of a Karpathy file (``train`` = train + restval) and the
    ``<split>_captions.json`` of an IFCap annotation directory; other layouts hold one split.
    """
    p = Path(path).expanduser()
    layout, src, entries = _entries(fmt, p, split)
    if layout == "folder":
        raise DataError(f"{p}: a folder of images has no reference captions; pass an annotation file")
    refs = _clean_refs(entries, src)
    return _build_references(entries, refs, str(src), _LAYOUT_FORMAT[layout])
