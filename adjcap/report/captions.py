"""What ``adjcap caption DIR`` hands back: one JSON line per image (its path, the chosen caption, every
beam candidate with its three scores) and a self-contained HTML gallery of the same."""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from adjcap.storage.io import atomic_write_text
from adjcap.report.gallery import GALLERY_CSS


_CHOSEN_ROW = " class='rule'"


def caption_records(
    rows: Sequence[Mapping[str, Any]],
    chosen: Mapping[str, int],
    lm_chosen: Mapping[str, int],
    image_root: Path,
    picker: str,
    absolute: bool = False,
) -> list[dict[str, Any]]:
    """Feature rows (FEATURE_SCHEMA) + the picked candidate index per image -> one record per image,
    in image-id order: ``image`` (its path relative to ``image_root``, so a moved folder keeps
    working; ``absolute``: the absolute path), ``image_id``, ``caption`` (the picker's), ``lm_caption``
    (IFCap's own pick), ``picker``, ``error`` and ``candidates`` [{text, lm_logprob_mean,
    retrieval_cosine, verifier, beam_rank, chosen}] in beam order. A failed image keeps its record
    with ``caption`` None and ``error`` set."""
    out = []
    for row in sorted(rows, key=lambda r: str(r["image_id"])):
        iid = str(row["image_id"])
        cands = list(row.get("candidates") or [])
        k = chosen.get(iid)
        lm = lm_chosen.get(iid)
        out.append({
            "image": str(Path(image_root) / iid) if absolute else Path(iid).as_posix(),
            "image_id": iid,
            "caption": cands[k]["text"] if k is not None and not row.get("error") else None,
            "lm_caption": cands[lm]["text"] if lm is not None and not row.get("error") else None,
            "picker": picker,
            "error": row.get("error"),
            "candidates": [
                {"text": c["text"], "lm_logprob_mean": c["lm_logprob_mean"], "retrieval_cosine": c["retrieval_cosine"],
                 "verifier": c["verifier"], "beam_rank": c["beam_rank"], "chosen": j == k}
                for j, c in enumerate(cands)
            ],
        })
    return out


def write_jsonl(path: str | Path, records: Sequence[Mapping[str, Any]]) -> Path:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return atomic_write_text(Path(path), text)


def thumbnail(path: str | Path, size: int = 256) -> str | None:
    """A base64 JPEG data URI, EXIF orientation applied (as the job decoded it); None if unreadable."""
    try:
        from PIL import Image, ImageOps

        with Image.open(path) as im:
            im = ImageOps.exif_transpose(im).convert("RGB")
            im.thumbnail((size, size))
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=82)
    except Exception:  # noqa: BLE001 - an unreadable image is shown as its id
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def write_gallery(path: str | Path, records: Sequence[Mapping[str, Any]], *, title: str, show: int = 5,
                  image_root: str | Path | None = None) -> Path:
    """An HTML page: per image its thumbnail, the chosen caption, IFCap's own pick when different,
    and ``show`` candidates (the chosen one first, then the beam's best) with their three scores.
    Portable: thumbnails are embedded, and each links to its image by a path relative to the page
    (``image_root``: the folder relative ``image`` paths are under), so page and folder move together."""
    e = html.escape
    here = Path(path).expanduser().absolute().parent
    rows = []
    for r in records:
        file = Path(image_root or ".") / r["image"]
        src = thumbnail(file)
        href = quote(Path(os.path.relpath(file.absolute(), here)).as_posix())
        img = (f"<a href='{href}'><img src='{src}' alt='{e(r['image_id'])}'></a>" if src
               else f"<div class='noimg'>{e(r['image_id'])}</div>")
        if r.get("error"):
            body = f"<div class='err'>error: {e(str(r['error']))}</div>"
        else:
            body = f"<div class='cap adj'>{e(r['caption'] or '')}</div>"
            if r.get("lm_caption") and r["lm_caption"] != r["caption"]:
                body += f"<div class='cap lm'>LM-only: {e(r['lm_caption'])}</div>"
            cands = sorted(r["candidates"], key=lambda c: (not c["chosen"], c["beam_rank"]))[:show]
            body += ("<table class='metrics'><tr><th>candidate</th><th>LM log-prob</th><th>retrieval cos</th>"
                     "<th>verifier</th></tr>"
                     + "".join(f"<tr{_CHOSEN_ROW if c['chosen'] else ''}><td>{'&#x2713; ' if c['chosen'] else ''}"
                               f"{e(c['text'])}</td><td class='num'>{c['lm_logprob_mean']:.3f}</td>"
                               f"<td class='num'>{c['retrieval_cosine']:.3f}</td><td class='num'>{c['verifier']:.3f}</td></tr>"
                               for c in cands)
                     + "</table>")
        rows.append(f"<tr><td class='img'>{img}</td><td>{body}<div class='score'>{e(r['image'])}</div></td></tr>")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + e(title) + "</title>"
            f"<style>{GALLERY_CSS}td.cap.adj{{font-weight:600}}div.err{{color:#b3261e}}</style></head><body>"
            f"<h1>{e(title)}</h1><table class='gallery'><tbody>" + "\n".join(rows) + "</tbody></table></body></html>")
    return atomic_write_text(Path(path), page)
