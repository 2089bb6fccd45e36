"""The qualitative gallery: LM-only caption vs adjudicated caption per image, with references and
per-image CIDEr, sortable by gain. Images are embedded as base64 JPEG thumbnails (the HTML is
self-contained); an image that cannot be found or read is shown as its id."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adjcap.report.collect import LM_PICKER, RunData


@dataclass
class GalleryItem:
    image_id: str
    lm_caption: str
    adj_caption: str
    lm_cider: float | None
    adj_cider: float | None
    references: list[str] = field(default_factory=list)
    image_src: str | None = None  # data: URI or relative path

    @property
    def gain(self) -> float | None:
        if self.lm_cider is None or self.adj_cider is None:
            return None
        return self.adj_cider - self.lm_cider


def thumbnail_data_uri(path: Path, size: int = 224) -> str | None:
    """A base64 JPEG data URI of the image, at most ``size`` px on its long side; None if unreadable."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            im = im.convert("RGB")
            im.thumbnail((size, size))
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=82)
    except Exception:  # noqa: BLE001 - any unreadable image is just shown without a picture
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def find_image(root: Path | None, image_id: str) -> Path | None:
    if root is None:
        return None
    for cand in (root / image_id, root / Path(image_id).name):
        if cand.is_file():
            return cand
    return None


def gallery_items(
    run: RunData,
    protocol: str,
    adj_picker: str,
    *,
    limit: int = 60,
    image_root: Path | None = None,
    embed: bool = True,
    thumb: int = 224,
) -> list[GalleryItem]:
    """Images where the two captions differ, the largest gains and the largest losses first
    (``limit`` in all, half each); then unchanged ones if room is left."""
    lm = run.predictions(protocol, LM_PICKER)
    adj = run.predictions(protocol, adj_picker)
    lm_pi = run.per_image(protocol, LM_PICKER)
    adj_pi = run.per_image(protocol, adj_picker)
    refs = run.references()
    ids = [i for i in adj if i in lm]
    items = []
    for i in ids:
        a = adj_pi.get(i, {}).get("CIDEr")
        b = lm_pi.get(i, {}).get("CIDEr")
        items.append(GalleryItem(i, lm[i], adj[i], b, a, list(refs.get(i, []))))
    changed = [x for x in items if x.lm_caption.strip() != x.adj_caption.strip()]
    same = [x for x in items if x.lm_caption.strip() == x.adj_caption.strip()]
    changed.sort(key=lambda x: (x.gain is None, -(x.gain or 0.0), x.image_id))
    half = limit // 2
    if len(changed) <= limit:
        chosen = changed
    else:
        chosen = changed[: limit - half] + changed[-half:]
    chosen += same[: max(0, limit - len(chosen))]
    root = image_root or run.image_root
    for x in chosen:
        p = find_image(root, x.image_id)
        if p is not None:
            x.image_src = thumbnail_data_uri(p, thumb) if embed else p.resolve().as_uri()
    return chosen


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def gallery_html(items: list[GalleryItem], *, title: str, table_id: str, adj_name: str) -> str:
    """One sortable gallery table (needs GALLERY_CSS and GALLERY_JS on the page)."""
    e = html.escape
    head = (
        f"<table class='gallery' id='{e(table_id)}'><thead><tr>"
        "<th>image</th>"
        f"<th class='sort' data-key='lm' data-type='num'>LM-only caption (CIDEr)</th>"
        f"<th class='sort' data-key='adj' data-type='num'>{e(adj_name)} caption (CIDEr)</th>"
        "<th class='sort' data-key='gain' data-type='num'>gain &#x25BE;</th>"
        "<th>references</th>"
        "<th class='sort' data-key='id' data-type='str'>image id</th>"
        "</tr></thead><tbody>"
    )
    rows = []
    for x in items:
        img = (
            f"<img src='{e(x.image_src)}' alt='{e(x.image_id)}' loading='lazy'>"
            if x.image_src
            else f"<div class='noimg'>{e(x.image_id)}</div>"
        )
        gain = x.gain
        cls = "pos" if (gain or 0) > 0 else ("neg" if (gain or 0) < 0 else "")
        refs = "".join(f"<li>{e(r)}</li>" for r in x.references)

        def key(v: float | None) -> str:
            return "" if v is None else f"{v:.6f}"

        rows.append(
            f"<tr data-lm='{key(x.lm_cider)}' data-adj='{key(x.adj_cider)}' data-gain='{key(gain)}' "
            f"data-id='{e(x.image_id)}'>"
            f"<td class='img'>{img}</td>"
            f"<td class='cap lm'>{e(x.lm_caption)}<div class='score'>{_num(x.lm_cider)}</div></td>"
            f"<td class='cap adj'>{e(x.adj_caption)}<div class='score'>{_num(x.adj_cider)}</div></td>"
            f"<td class='gain {cls}'>{'' if gain is None else f'{gain:+.1f}'}</td>"
            f"<td class='refs'><ul>{refs}</ul></td>"
            f"<td class='id'>{e(x.image_id)}</td></tr>"
        )
    return f"<h3>{e(title)}</h3>\n" + head + "\n".join(rows) + "</tbody></table>"


GALLERY_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px}
table.metrics{border-collapse:collapse;margin:10px 0;font-size:13px}
table.metrics caption{text-align:left;font-weight:600;padding:4px 0}
table.metrics th,table.metrics td{border-bottom:1px solid #e3e3e3;padding:3px 9px;text-align:left}
table.metrics td.num{text-align:right;font-variant-numeric:tabular-nums}
table.metrics tr.rule td{border-top:2px solid #999}
p.caption{font-size:12px;color:#555;max-width:900px}
table.gallery{border-collapse:collapse;font-size:13px;width:100%}
table.gallery th{position:sticky;top:0;background:#f4f4f4;padding:6px;text-align:left;white-space:nowrap}
table.gallery th.sort{cursor:pointer;text-decoration:underline dotted}
table.gallery td{border-bottom:1px solid #e6e6e6;padding:6px;vertical-align:top}
td.img img{max-width:224px;max-height:224px;border-radius:3px}
div.noimg{width:160px;height:100px;background:#eee;color:#777;font-size:11px;display:flex;align-items:center;justify-content:center;text-align:center}
td.cap.lm{color:#C04A1A}td.cap.adj{color:#2F7DBC}
div.score{font-size:11px;color:#666;margin-top:4px}
td.gain{font-weight:600;white-space:nowrap}td.gain.pos{color:#1b7f3b}td.gain.neg{color:#b3261e}
td.refs ul{margin:0;padding-left:16px;color:#444}td.id{font-size:11px;color:#777}
"""

GALLERY_JS = """
document.querySelectorAll('table.gallery').forEach(function(t){
  t.querySelectorAll('th.sort').forEach(function(th){
    th.addEventListener('click',function(){
      var key=th.dataset.key, num=th.dataset.type==='num';
      var desc=th.dataset.dir!=='desc'; th.dataset.dir=desc?'desc':'asc';
      var body=t.tBodies[0], rows=Array.prototype.slice.call(body.rows);
      rows.sort(function(a,b){
        var x=a.dataset[key], y=b.dataset[key];
        if(num){x=x===''?-Infinity:parseFloat(x); y=y===''?-Infinity:parseFloat(y); return desc?y-x:x-y;}
        return desc?(y<x?-1:y>x?1:0):(x<y?-1:x>y?1:0);
      });
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
});
"""


def item_dicts(items: list[GalleryItem]) -> list[dict[str, Any]]:
    return [
        {"image_id": x.image_id, "lm": x.lm_caption, "adjudicated": x.adj_caption, "lm_cider": x.lm_cider,
         "adjudicated_cider": x.adj_cider, "gain": x.gain, "has_image": x.image_src is not None}
        for x in items
    ]
