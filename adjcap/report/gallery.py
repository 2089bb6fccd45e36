"""The qualitative galleries, read from the run's samples table (:mod:`adjcap.storage.samples`): LM-only
caption vs adjudicated caption per image, with references and per-image CIDEr, sortable by gain.

* in report.html, the highlights: at most ``limit`` images (the largest gains and losses), embedded as
  base64 JPEG thumbnails, so the report stays self-contained and its size bounded;
* ``gallery.html`` (:func:`write_paged_gallery`): every image, a page at a time. The page holds a small
  index of every image (id, scores: what sorting and filtering need) and the first page's rows; the other
  rows are in ``gallery/rows-<n>.js`` chunks that the page loads as it is paged (script tags, so it works
  from ``file://`` without a server). Images are linked (relative paths), not embedded, and load lazily;
  each row opens onto the whole beam with every judge's score and which pickers chose what.

An image that cannot be found or read is shown as its id."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adjcap.report.collect import LM_PICKER, RunData
from adjcap.storage.rundir import RunDir
from adjcap.storage.samples import read_samples


@dataclass
class GalleryItem:
    image_id: str
    lm_caption: str
    adj_caption: str
    lm_cider: float | None
    adj_cider: float | None
    references: list[str] = field(default_factory=list)
    image_src: str | None = None  # data: URI or relative path
    image_path: str | None = None  # relative to the benchmark's image root (samples.parquet)
    error: str | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)  # the beam with its judges' scores
    picks: dict[str, int | None] = field(default_factory=dict)  # picker -> candidate index

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
    samples: Any = None,
) -> list[GalleryItem]:
    """Images where the two captions differ, the largest gains and the largest losses first
    (``limit`` in all, half each); then unchanged ones if room is left. Read from the run's
    samples table (``samples``, default: samples.parquet, or the same table built from the run)."""
    items = [x for x in sample_items(samples if samples is not None else read_samples(RunDir(run.path)),
                                     protocol, adj_picker, run.apply_split)]
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
        p = find_image(root, x.image_path or x.image_id)
        if p is None and x.image_path:
            p = find_image(root, x.image_id)
        if p is not None:
            x.image_src = thumbnail_data_uri(p, thumb) if embed else p.resolve().as_uri()
    return chosen


def sample_items(samples: Any, protocol: str, adj_picker: str, split: str | None = None) -> list[GalleryItem]:
    """One item per image of the samples table that both pickers picked for (in table order), with
    every candidate, its judges' scores and which pickers chose it."""
    out = []
    for row in samples.to_pylist():
        if split is not None and row["split"] != split:
            continue
        mine = {p["picker"]: p for p in row["picks"] or [] if p["protocol"] == protocol}
        lm, adj = mine.get(LM_PICKER), mine.get(adj_picker)
        if lm is None or adj is None:
            continue
        x = GalleryItem(row["image_id"], lm["caption"] or "", adj["caption"] or "", lm["cider"], adj["cider"],
                        list(row["references"] or []))
        x.image_path = row["image_path"]
        x.error = row["error"]
        x.candidates = list(row["candidates"] or [])
        x.picks = {name: p["candidate_index"] for name, p in mine.items()}
        out.append(x)
    return out


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
table.provenance{border-collapse:collapse;font-size:12px;margin:8px 0;color:#444}
table.provenance caption{text-align:left;font-weight:600;padding:2px 0}
table.provenance th{text-align:left;padding:1px 12px 1px 0;vertical-align:top;white-space:nowrap}
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


# ---------------------------------------------------------------------------------------------
# the paged gallery of every image
# ---------------------------------------------------------------------------------------------

PAGE_ROWS = 50  # rows on one page
CHUNK_ROWS = 100  # rows per lazily loaded chunk file


def _round(v: Any, digits: int = 4) -> Any:
    if v is None or (isinstance(v, float) and v != v):
        return None
    return round(float(v), digits)


def _row_data(x: GalleryItem, src: str | None) -> dict[str, Any]:
    cands = [[c.get("text"), c.get("beam_rank"), _round(c.get("lm_logprob_mean")), _round(c.get("retrieval_cosine")),
              _round(c.get("verifier"))] for c in x.candidates]
    return {"id": x.image_id, "src": src, "lm": x.lm_caption, "adj": x.adj_caption, "lmc": _round(x.lm_cider, 2),
            "adjc": _round(x.adj_cider, 2), "refs": x.references, "err": x.error, "cands": cands,
            "picks": x.picks}


def _js_json(obj: Any) -> str:
    """JSON safe inside a <script> element."""
    import json

    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


def write_paged_gallery(samples: Any, html_path: Path, chunk_dir: Path, protocol: str, adj_picker: str, *,
                        title: str, split: str | None = None, image_root: Path | None = None) -> dict[str, Any]:
    """``gallery.html`` with every image of ``samples`` that both pickers picked for (see the module
    docstring); returns {"html", "chunks", "images"}. Old chunks of an earlier, larger run are removed."""
    from adjcap.storage.io import atomic_write_text
    import os

    items = sample_items(samples, protocol, adj_picker, split)
    items.sort(key=lambda x: (x.gain is None, -(x.gain or 0.0), x.image_id))  # default order: gain
    base = html_path.parent.resolve()
    rows = []
    for x in items:
        src = None
        p = find_image(image_root, x.image_path or x.image_id) if image_root else None
        if p is not None:
            src = Path(os.path.relpath(p.resolve(), base)).as_posix()
        rows.append(_row_data(x, src))
    index = [[k, x.image_id, _round(x.gain, 2), _round(x.lm_cider, 2), _round(x.adj_cider, 2),
              int(x.lm_caption.strip() != x.adj_caption.strip()), int(bool(x.error))] for k, x in enumerate(items)]
    chunks = [rows[i: i + CHUNK_ROWS] for i in range(0, len(rows), CHUNK_ROWS)] or [[]]
    rel_dir = Path(os.path.relpath(chunk_dir.resolve(), base)).as_posix()
    written = []
    for n, chunk in enumerate(chunks[1:], start=1):
        written.append(atomic_write_text(chunk_dir / f"rows-{n:05d}.js", f"adjcapGallery.chunk({n},{_js_json(chunk)});\n"))
    keep = {p.name for p in written}
    if chunk_dir.is_dir():
        for old in chunk_dir.glob("rows-*.js"):
            if old.name not in keep:
                old.unlink()
    e = html.escape
    config = {"pageRows": PAGE_ROWS, "chunkRows": CHUNK_ROWS, "dir": rel_dir, "adj": adj_picker, "lm": LM_PICKER}
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{e(title)}</title><style>{GALLERY_CSS}{PAGED_CSS}</style></head><body>"
        f"<h1>{e(title)}</h1>"
        f"<p>{len(items)} images; LM-only caption (red) vs {e(adj_picker)} caption (blue), per-image CIDEr, references. "
        "Click a row's image id to see the whole beam with every judge's score. Rows load a page at a time "
        "(gallery/rows-*.js).</p>"
        "<div class='controls'>show <select id='filter'><option value='all'>all images</option>"
        "<option value='changed'>pick changed</option><option value='same'>pick unchanged</option>"
        "<option value='failed'>failed</option></select> sort by <select id='sort'>"
        "<option value='gain-desc'>gain, largest first</option><option value='gain-asc'>gain, smallest first</option>"
        "<option value='adj-desc'>adjudicated CIDEr</option><option value='lm-desc'>LM-only CIDEr</option>"
        "<option value='id-asc'>image id</option></select> "
        "<button id='prev'>&larr; prev</button> <span id='where'></span> <button id='next'>next &rarr;</button></div>"
        "<table class='gallery' id='paged'><thead><tr><th>image</th><th>LM-only caption (CIDEr)</th>"
        f"<th>{e(adj_picker)} caption (CIDEr)</th><th>gain</th><th>references</th><th>image id</th></tr></thead>"
        "<tbody id='rows'></tbody></table>"
        f"<script>var GALLERY_CONFIG={_js_json(config)};var GALLERY_INDEX={_js_json(index)};</script>"
        f"<script>{PAGED_JS}</script>"
        f"<script>adjcapGallery.chunk(0,{_js_json(chunks[0])});</script>"
        "</body></html>"
    )
    atomic_write_text(html_path, page)
    return {"html": html_path, "chunks": written, "images": len(items)}


PAGED_CSS = """
div.controls{margin:10px 0;font-size:13px}div.controls select,div.controls button{font-size:13px}
td.id a{cursor:pointer;color:#2F7DBC;text-decoration:underline dotted}
table.beam{border-collapse:collapse;font-size:12px;margin-top:6px}
table.beam td,table.beam th{border-bottom:1px solid #eee;padding:2px 6px;text-align:left}
table.beam td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.beamrow td{background:#fafafa}td.err{color:#b3261e}
"""

PAGED_JS = """
var adjcapGallery=(function(){
  var C=GALLERY_CONFIG, I=GALLERY_INDEX, chunks={}, pending={}, page=0, view=[];
  function esc(s){return String(s==null?'':s).replace(/[&<>"']/g,function(c){return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c];});}
  function num(v){return v==null?'n/a':v.toFixed(1);}
  function key(v){return v==null?-Infinity:v;}
  function build(){
    var f=document.getElementById('filter').value, s=document.getElementById('sort').value;
    view=I.filter(function(r){return f==='all'||(f==='changed'&&r[5])||(f==='same'&&!r[5])||(f==='failed'&&r[6]);});
    var col={gain:2,lm:3,adj:4,id:1}[s.split('-')[0]], asc=s.split('-')[1]==='asc';
    view.sort(function(a,b){
      if(col===1){return a[1]<b[1]?-1:a[1]>b[1]?1:0;}
      var x=key(a[col]), y=key(b[col]); if(x===y){return a[0]-b[0];} return asc?x-y:y-x;});
    page=0; show();
  }
  function need(rows){
    var want={}; rows.forEach(function(r){var c=Math.floor(r[0]/C.chunkRows); if(!(c in chunks)){want[c]=1;}});
    return Object.keys(want);
  }
  function load(c){
    if(pending[c]){return;} pending[c]=1;
    var s=document.createElement('script'); s.src=C.dir+'/rows-'+('0000'+c).slice(-5)+'.js';
    s.onerror=function(){chunks[c]=[]; show();}; document.head.appendChild(s);
  }
  function row(d){
    var img=d.src?"<img src='"+esc(d.src)+"' alt='"+esc(d.id)+"' loading='lazy'>":"<div class='noimg'>"+esc(d.id)+"</div>";
    var g=(d.lmc==null||d.adjc==null)?null:d.adjc-d.lmc, cls=g>0?'pos':(g<0?'neg':'');
    var refs=(d.refs||[]).map(function(r){return '<li>'+esc(r)+'</li>';}).join('');
    var err=d.err?"<div class='err'>error: "+esc(d.err)+"</div>":'';
    return "<tr data-id='"+esc(d.id)+"'><td class='img'>"+img+"</td><td class='cap lm'>"+esc(d.lm)+"<div class='score'>"+num(d.lmc)+
      "</div></td><td class='cap adj'>"+esc(d.adj)+"<div class='score'>"+num(d.adjc)+"</div></td><td class='gain "+cls+"'>"+
      (g==null?'':(g>0?'+':'')+g.toFixed(1))+"</td><td class='refs'><ul>"+refs+"</ul>"+err+"</td><td class='id'><a>"+esc(d.id)+"</a></td></tr>";
  }
  function beam(d){
    var by={}; Object.keys(d.picks||{}).forEach(function(p){var i=d.picks[p]; if(i!=null){(by[i]=by[i]||[]).push(p);}});
    var h="<table class='beam'><tr><th>#</th><th>candidate</th><th>beam rank</th><th>LM (mean log-prob)</th><th>retrieval cosine</th><th>verifier</th><th>picked by</th></tr>";
    (d.cands||[]).forEach(function(c,i){h+="<tr><td>"+i+"</td><td>"+esc(c[0])+"</td><td class='num'>"+esc(c[1])+"</td><td class='num'>"+esc(c[2])+
      "</td><td class='num'>"+esc(c[3])+"</td><td class='num'>"+esc(c[4])+"</td><td>"+esc((by[i]||[]).join(', '))+"</td></tr>";});
    return h+"</table>";
  }
  function show(){
    var n=Math.max(1,Math.ceil(view.length/C.pageRows)); page=Math.min(page,n-1);
    var rows=view.slice(page*C.pageRows,(page+1)*C.pageRows), miss=need(rows);
    document.getElementById('where').textContent='page '+(page+1)+' of '+n+' ('+view.length+' images)';
    if(miss.length){miss.forEach(load); return;}
    var body=document.getElementById('rows'), out=[], data={};
    rows.forEach(function(r){var c=Math.floor(r[0]/C.chunkRows), d=chunks[c][r[0]-c*C.chunkRows]; if(d){data[d.id]=d; out.push(row(d));}});
    body.innerHTML=out.join(''); body.dataset.renderedMs=Math.round(performance.now());
    history.replaceState(null,'','#sort='+document.getElementById('sort').value+'&filter='+document.getElementById('filter').value+'&page='+(page+1));
    body.querySelectorAll('td.id a').forEach(function(a){a.addEventListener('click',function(){
      var tr=a.closest('tr'), nx=tr.nextSibling;
      if(nx&&nx.className==='beamrow'){nx.remove(); return;}
      var b=document.createElement('tr'); b.className='beamrow'; b.innerHTML="<td colspan='6'>"+beam(data[tr.dataset.id])+"</td>";
      tr.parentNode.insertBefore(b,tr.nextSibling);});});
  }
  function ready(){
    var h={}; location.hash.replace(/^#/,'').split('&').forEach(function(kv){var p=kv.split('='); if(p[1]){h[p[0]]=decodeURIComponent(p[1]);}});
    ['sort','filter'].forEach(function(k){var el=document.getElementById(k); if(h[k]&&el.querySelector("option[value='"+h[k]+"']")){el.value=h[k];}});
    document.getElementById('filter').addEventListener('change',build);
    document.getElementById('sort').addEventListener('change',build);
    document.getElementById('prev').addEventListener('click',function(){if(page>0){page--; show(); window.scrollTo(0,0);}});
    document.getElementById('next').addEventListener('click',function(){page++; show(); window.scrollTo(0,0);});
    build(); if(h.page){page=Math.max(0,parseInt(h.page,10)-1||0); show();}
  }
  var started=false;
  return {chunk:function(n,rows){chunks[n]=rows; if(n===0&&!started){started=true; ready();} else if(started){show();}}};
})();
"""
