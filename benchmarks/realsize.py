"""The whole job on real-size architectures: random weights in the real on-disk layouts, real images.

    python benchmarks/realsize.py --images 2                     # CPU: writes the checkpoints, then
                                                                 # fp32 and bf16 (Ray job or stages)
    python benchmarks/realsize.py --images 2 --mode stages       # in-process, one model at a time
    python benchmarks/realsize.py --device cuda --images 500     # one GPU, through the Ray job
    python benchmarks/realsize.py --device cuda --encode-only    # the corpus encode of 566,747 captions
    python benchmarks/realsize.py --judges cpu-16gb --precision fp32 --mode ray   # the cpu-16gb preset's judges
    python benchmarks/realsize.py --images 2 --precision fp32 --mode side-by-side  # adjcap vs the paper's way
    python benchmarks/realsize.py --device cuda --parity --images 64 --corpus 50000  # the gpu preset vs fp32

Every run keeps IFCap's GPT-2 and its log-probs at the production precision (fp32): ``--precision`` is the
root switch (every encoder and the verifier), so a bf16 run decodes with production's language model.
``--preset gpu`` runs the gpu speed preset's settings (TF32 on CUDA, token-budget text batches, SDPA
vision attention; adjcap/presets/gpu.toml) instead of the headline's.

Writes, under ``--assets`` (default ``$ADJCAP_CACHE/realsize``, reused when present):

* ``bigG/vit-bigg-14.safetensors``: an open_clip ViT-bigG-14 state dict (both towers, bf16; the
  laion2b release is the same key layout in fp32);
* ``vit-b-32/vit-b-32.safetensors``: an open_clip ViT-B-32 state dict (fp32), loaded as
  ``ViT-B-32-quickgelu`` like OpenAI's weights;
* ``blip-itm-large/``: a ``BlipForImageTextRetrieval`` ``save_pretrained`` directory with
  blip-itm-large-coco's configuration (ViT-L/16 at 384 px, BERT-base text with cross-attention), a
  WordPiece tokenizer with [DEC]/[ENC] and the BLIP image processor;
* ``ifcap/coco-indomain-004.pt``: IFCap in the released layout (286 entries: GPT-2 124M with the 24 mask
  buffers of transformers 4.19, the 8-layer mapping network with its fusion block, lm_head tied);
* ``gpt2-tokenizer/``: a byte-level BPE trained on COCO captions, its vocabulary padded to GPT-2's 50,257
  ids with ``<|endoftext|>`` last (id 50256), so every id the LM can emit decodes;
* ``data/``: the two real COCO val2014 images of tests/fixtures (copied under new names when more
  images are asked for), their references, and a corpus of COCO-like captions.

Weights are drawn tensor by tensor from the architectures' state-dict layout (built on the meta
device) and streamed to disk, so writing bigG needs about one tensor of memory. Speed does not depend on
the weights; random-weight captions are gibberish, so the metrics mean nothing.

Modes (``--mode``):

* ``ray``: ``python cli.py run-job realsize --set ...`` in a subprocess (embedded local Ray), once per
  precision; a sampler thread records the peak RSS of every Ray worker process by pool (the process
  title names the actor class); prints the job's own figures and the end-to-end rate.
* ``stages``: in this process, one pool's models at a time (load, run its stage over all images, free):
  seconds per image per stage and the RSS after loading each pool's models. Needed where the four pools
  do not fit in memory at once (fp32 on a 24 GB machine shared with others).
* ``auto`` (default): ``ray`` unless the job's own up-front check (``pool_plan``: the pools' declared
  memory, adjcap.models.budget, against the local Ray's memory resource) would refuse it, else ``stages``.
* ``side-by-side``: as ``stages``, and every stage also the way the paper's code does it
  (benchmarks/paper_way.py: one image at a time, BLIP ITM per pair with the image encoded again, IFCap's
  beam without a KV cache, 77-token text towers) on the same inputs: CPU seconds per image of both ways,
  their ratio, and whether the outputs agree (retrieved ids, kept captions, beams, top candidates).
Nothing is asserted; the figures go to BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "data"
FIXTURE_IMAGES = ("COCO_val2014_000000354533.jpg", "COCO_val2014_000000579664.jpg")
POOL_OF_ACTOR = {"CorpusEncoderActor": "encoder", "RetrieverActor": "retriever", "VerifierActor": "verifier",
                 "CaptionerActor": "captioner", "ScorerActor": "scorer", "FusedActor": "fused"}
GPT2_VOCAB = 50257
ENDOFTEXT = "<|endoftext|>"
COCO_CORPUS = 566_747


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# --------------------------------------------------------------------------------------------
# Writing random weights tensor by tensor
# --------------------------------------------------------------------------------------------

_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.uint8: "U8",
              torch.int64: "I64"}


def random_like(name: str, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """A plausible random value for a parameter called ``name``: norms 1/0, biases 0, logit scale
    log(1/0.07), everything else N(0, 0.02) (GPT-2 / CLIP init)."""
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("logit_scale"):
        return torch.full(shape, math.log(1 / 0.07), dtype=dtype)
    if name.endswith("logit_bias"):
        return torch.full(shape, -10.0, dtype=dtype)
    is_norm = re.search(r"(^|\.|_)(ln|norm|layernorm|layer_norm)[^.]*\.(weight|bias)$", name) is not None
    if is_norm and leaf == "weight":
        return torch.ones(shape, dtype=dtype)
    if leaf == "bias" or len(shape) == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen).to(dtype)


def write_safetensors(path: Path, items: list[tuple[str, tuple[int, ...], torch.dtype]],
                      make=random_like, seed: int = 0) -> None:
    """Stream a safetensors file (header, then each tensor as it is drawn): memory ~ one tensor."""
    gen = torch.Generator().manual_seed(seed)
    header, offset = {}, 0
    for name, shape, dtype in items:
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, dtype in items:
            t = make(name, shape, dtype, gen).contiguous()
            f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    os.replace(tmp, path)


def open_clip_layout(model: str) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of an open_clip model's state dict (built on the meta device: no memory)."""
    import open_clip

    with torch.device("meta"):
        net = open_clip.create_model(model, pretrained=None, device="meta")
    return [(k, tuple(v.shape)) for k, v in net.state_dict().items()]


def write_open_clip(model: str, path: Path, dtype: torch.dtype, seed: int) -> Path:
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    t = time.time()
    write_safetensors(path, [(k, s, dtype) for k, s in open_clip_layout(model)], seed=seed)
    print(f"  wrote {path} ({gib(path.stat().st_size)}) in {time.time() - t:.0f}s")
    return path


# --------------------------------------------------------------------------------------------
# Tokenizers, BLIP, IFCap
# --------------------------------------------------------------------------------------------


def coco_captions() -> list[str]:
    data = json.loads((FIXTURES / "coco_test_captions.json").read_text())
    return [c.strip() for caps in data.values() for c in caps]


def corpus_captions(n: int) -> list[str]:
    """n COCO-like captions: the fixture's captions, then recombinations of their halves (lengths stay
    COCO-like: 8-20 words)."""
    base = coco_captions()
    out = list(base[:n])
    i = 0
    while len(out) < n:
        a, b = base[i % len(base)].split(), base[(i * 7 + 3) % len(base)].split()
        out.append(" ".join(a[: len(a) // 2] + b[len(b) // 2:]))
        i += 1
    return out


def write_gpt2_tokenizer(out: Path) -> Path:
    """A byte-level BPE trained on captions, padded to GPT-2's 50,257 ids (endoftext = 50256)."""
    if (out / "tokenizer.json").exists():
        return out
    from transformers import GPT2TokenizerFast

    from adjcap.demo.tiny_ifcap import train_gpt2_tokenizer

    tmp = out.with_name(out.name + ".train")
    train_gpt2_tokenizer(corpus_captions(5000), tmp, vocab_size=4000)
    vocab = json.loads((tmp / "vocab.json").read_text())
    vocab.pop(ENDOFTEXT, None)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    # filler ids: "Ġ" + letters from the byte-level alphabet, as real GPT-2 word pieces look
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    have = set(tokens)
    while len(tokens) < GPT2_VOCAB - 1:
        word, k = "", i
        for _ in range(3):
            word, k = word + letters[k % 26], k // 26
        cand = "Ġ" + word + (str(i // 17576) if i >= 17576 else "")
        if cand not in have:
            tokens.append(cand)
            have.add(cand)
        i += 1
    tokens.append(ENDOFTEXT)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps({t: j for j, t in enumerate(tokens)}))
    shutil.copy(tmp / "merges.txt", out / "merges.txt")
    tok = GPT2TokenizerFast(vocab=str(out / "vocab.json"), merges=str(out / "merges.txt"),
                            bos_token=ENDOFTEXT, eos_token=ENDOFTEXT, unk_token=ENDOFTEXT)
    tok.model_max_length = 1024
    tok.save_pretrained(str(out))
    shutil.rmtree(tmp)
    assert len(tok) == GPT2_VOCAB and tok.convert_tokens_to_ids(ENDOFTEXT) == GPT2_VOCAB - 1, len(tok)
    return out


BLIP_VISION = {  # the vision towers of blip-itm-large-coco (ViT-L/16) and blip-itm-base-coco (ViT-B/16), 384 px
    "large": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16),
    "base": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
}


def blip_config(tok, size: str = "large"):
    """blip-itm-{large,base}-coco's configuration (its config.json), the text ids taken from ``tok``."""
    from transformers import BlipConfig

    dec = tok.convert_tokens_to_ids("[DEC]")
    vision = BLIP_VISION[size]
    return BlipConfig(
        text_config=dict(vocab_size=30524, hidden_size=768, encoder_hidden_size=vision["hidden_size"],
                         intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                         max_position_embeddings=512, bos_token_id=dec, pad_token_id=tok.pad_token_id,
                         sep_token_id=tok.sep_token_id, eos_token_id=tok.sep_token_id),
        vision_config=dict(**vision, image_size=384, patch_size=16, layer_norm_eps=1e-5),
        image_text_hidden_size=256, projection_dim=512,
    )


def write_blip(out: Path, size: str = "large") -> Path:
    if (out / "model.safetensors").exists():
        return out
    from transformers import BlipForImageTextRetrieval, BlipImageProcessor
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    from adjcap.demo.tiny_blip import train_wordpiece_tokenizer

    t = time.time()
    tok = train_wordpiece_tokenizer(corpus_captions(5000), vocab_size=30000)
    cfg = blip_config(tok, size)
    with torch.device("meta"):
        net = BlipForImageTextRetrieval(cfg)
    items = [(k, tuple(v.shape), torch.float32) for k, v in net.state_dict().items()]
    del net
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", items, seed=1)
    cfg_dict = cfg.to_dict()
    cfg_dict["architectures"] = ["BlipForImageTextRetrieval"]
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    BlipImageProcessor(size={"height": 384, "width": 384}, resample=3, image_mean=OPENAI_CLIP_MEAN,
                       image_std=OPENAI_CLIP_STD, do_convert_rgb=True).save_pretrained(out)
    tok.save_pretrained(out)
    print(f"  wrote {out} ({gib((out / 'model.safetensors').stat().st_size)}) in {time.time() - t:.0f}s")
    return out


def write_ifcap(out: Path, tokenizer_dir: Path) -> Path:
    """IFCap in the released layout (286 entries), GPT-2 re-initialised to stop after ~10 tokens."""
    pt = out / "coco-indomain-004.pt"
    if pt.exists():
        return pt
    from collections import OrderedDict

    from adjcap.demo.tiny_ifcap import captioner_like_init, with_gpt2_mask_buffers
    from adjcap.models.gpt2_tokenizer import load_gpt2_tokenizer, stop_token_ids
    from adjcap.models.ifcap import ClipCaptionModel, MappingDims, gpt2_config

    t = time.time()
    torch.manual_seed(2)
    model = ClipCaptionModel(gpt2_config("gpt2"), MappingDims(), mapping_heads=8)
    stop = stop_token_ids(load_gpt2_tokenizer(tokenizer_dir), (".",))[0]
    captioner_like_init(model, stop, stop_bias=10.0)  # "." competes with 50k random logits
    sd = with_gpt2_mask_buffers(OrderedDict((k, v.detach()) for k, v in model.state_dict().items()), 12, 1024)
    sd["gpt.lm_head.weight"] = sd["gpt.transformer.wte.weight"]  # tied, as torch.save of the real model
    assert len(sd) == 286, len(sd)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(sd, pt.with_suffix(".tmp"))
    os.replace(pt.with_suffix(".tmp"), pt)
    print(f"  wrote {pt} ({gib(pt.stat().st_size)}) in {time.time() - t:.0f}s")
    return pt


def write_data(out: Path, n_images: int, n_corpus: int) -> dict[str, Path]:
    """Images (the fixture's real COCO images, copied under new ids beyond the first two), their
    references (IFCap layout) and a corpus (IFCap layout)."""
    images = out / f"images-{n_images}"
    refs = json.loads((FIXTURES / "coco_test_captions.json").read_text())
    ann: dict[str, list[str]] = {}
    images.mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        src = FIXTURE_IMAGES[i % len(FIXTURE_IMAGES)]
        name = src if i < len(FIXTURE_IMAGES) else f"COCO_val2014_{900000000 + i:012d}.jpg"
        dst = images / name
        if not dst.exists():
            shutil.copy(FIXTURES / "images" / src, dst)
        ann[name] = refs[src]
    ann_path = out / f"test_captions-{n_images}.json"
    ann_path.write_text(json.dumps(ann, indent=4))
    corpus = out / f"corpus-{n_corpus}.json"
    if not corpus.exists():
        caps = corpus_captions(n_corpus)
        corpus.write_text(json.dumps({f"c{i}.jpg": [c] for i, c in enumerate(caps)}))
    return {"images": images, "annotations": ann_path, "corpus": corpus}


NOUNS = ("man woman person people child boy girl dog cat horse cow sheep bird elephant bear zebra giraffe "
         "bus car truck train motorcycle bicycle bike airplane plane boat street road sidewalk building "
         "table pizza plate sandwich cake food bowl cup bottle glass knife fork phone laptop computer "
         "keyboard tv television room kitchen bed couch chair bench clock umbrella kite surfboard wave "
         "beach ocean water snow skis skateboard tennis racket ball frisbee field grass tree park sign "
         "light window door shirt hat toilet sink bathroom mirror vase flowers giraffe hydrant")


def write_lexicon(path: Path) -> Path:
    """A {word: [tag, lemma]} lexicon of common COCO nouns for the entity filter: NLTK's tagger data
    cannot be installed from PyPI, and which nouns are found does not change the speed."""
    lex = {}
    for n in NOUNS.split():
        lex[n] = ["NN", n]
        lex.setdefault(n + ("es" if n.endswith(("s", "x", "ch", "sh")) else "s"), ["NNS", n])
    path.write_text(json.dumps(lex, indent=0, sort_keys=True))
    return path


def write_judges(root: Path, judges: str) -> dict[str, Path]:
    """The judges' files: the headline's (bigG, BLIP ITM large) or the cpu-16gb preset's (ViT-L-14,
    BLIP ITM base)."""
    if judges == "cpu-16gb":
        return {"retrieval": write_open_clip("ViT-L-14", root / "vit-l-14" / "vit-l-14.safetensors", torch.float32,
                                             seed=5),
                "blip": write_blip(root / "blip-itm-base", "base")}
    return {"retrieval": write_open_clip("ViT-bigG-14", root / "bigG" / "vit-bigg-14.safetensors", torch.bfloat16,
                                         seed=3),
            "blip": write_blip(root / "blip-itm-large")}


RETRIEVAL_MODEL = {"headline": "ViT-bigG-14", "cpu-16gb": "ViT-L-14"}


def write_assets(root: Path, n_images: int, n_corpus: int, judges: str = "headline") -> dict[str, Path]:
    """Every file the job needs; existing files are kept (one big model in memory at a time)."""
    print(f"assets in {root}")
    tok = write_gpt2_tokenizer(root / "gpt2-tokenizer")
    return {
        **write_judges(root, judges),
        "vitb32": write_open_clip("ViT-B-32", root / "vit-b-32" / "vit-b-32.safetensors", torch.float32, seed=4),
        "ifcap": write_ifcap(root / "ifcap", tok),
        "tokenizer": tok,
        "lexicon": write_lexicon(root / "lexicon.json"),
        **write_data(root / "data", n_images, n_corpus),
    }


def overrides(a: dict[str, Path], precision: str, device: str, n_images: int, cache: Path,
              judges: str = "headline") -> list[str]:
    """--set overrides of the ``judges`` preset that point every model at the written files."""
    p = precision
    retrieval = RETRIEVAL_MODEL[judges]
    if judges == "cpu-16gb":  # CLIPScore with OpenAI's ViT-B/32 (the captioner's CLIP file), as the preset
        clipscore = ["eval.clipscore.model=ViT-B-32-quickgelu", f"eval.clipscore.pretrained={a['vitb32']}"]
    else:  # CLIPScore's encoder is the same bigG file: the scorer pool reuses the output cosine
        clipscore = [f"eval.clipscore.model={retrieval}", f"eval.clipscore.pretrained={a['retrieval']}"]
    return [
        "name=realsize", f"device={device}", "benchmark=realsize", 'splits=["test"]', f"limit={n_images}",
        f"paths.cache_dir={cache}", f"paths.runs_dir={cache / 'runs'}",
        "benchmarks.realsize.format=ifcap", f"benchmarks.realsize.annotations={a['annotations']}",
        f"benchmarks.realsize.images={a['images']}", f"benchmarks.realsize.corpus={a['corpus']}",
        f"retrieval.encoder.model={retrieval}",
        # the root switch: the judges' encoders and the verifier at ``p``; the captioner keeps its own (its
        # CLIP at captioner.clip.precision; GPT-2 and its log-probs at fp32), so a bf16 run decodes production's beams
        f"precision={p}", "captioner.precision=fp32",
        f"retrieval.encoder.pretrained={a['retrieval']}",
        *clipscore,
        f"verifier.model={a['blip']}",
        f"captioner.checkpoint={a['ifcap']}", f"captioner.tokenizer={a['tokenizer']}",
        "captioner.clip.model=ViT-B-32-quickgelu", f"captioner.clip.pretrained={a['vitb32']}",
        f"captioner.entities.tagger={a['lexicon']}",
        "rerank.protocol=transductive", "rerank.fit_split=test", "eval.spice=false",
        "ray.include_dashboard=false",
    ]


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------


def proc_rss(pid: int | str = "self", field: str = "RssAnon") -> int:
    """Memory of a process from /proc (Linux): ``RssAnon`` (its own memory: weights, activations; the
    default), or ``VmRSS`` (which also counts the pages of memory-mapped checkpoint files it read,
    page cache the kernel can drop)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def proc_cpu_seconds(pid: int | str) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss() -> int:
    return proc_rss()


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def descendants(root: int):
    """(pid, command line) of every process below ``root`` (the job's driver starts Ray's raylet,
    which starts the workers), so that other users' Ray jobs on a shared machine are not counted."""
    parent, cmds = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmds[int(d)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
    for pid, cmd in cmds.items():
        p, seen = pid, 0
        while p in parent and p != root and seen < 64:
            p, seen = parent[p], seen + 1
        if p == root and pid != root:
            yield pid, cmd


class PoolMemory(threading.Thread):
    """Samples the anonymous RSS of Ray's worker processes every ``every`` s; keeps the peak per pool
    (the process title ``ray::MapWorker(MapBatches(RetrieverActor))`` names the actor class)."""

    def __init__(self, root: int, every: float = 0.5):
        super().__init__(daemon=True)
        self.root = root
        self.every, self.peak, self.total_peak = every, {}, 0
        self.cpu: dict[str, dict[str, float]] = {}  # pool -> pid -> CPU seconds so far (incl. loading)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            total = 0
            for pid, cmd in descendants(self.root):
                if not cmd.startswith("ray::"):
                    continue
                try:
                    mem = proc_rss(pid)
                except OSError:
                    continue
                total += mem
                for actor, pool in POOL_OF_ACTOR.items():
                    if actor in cmd:
                        self.peak[pool] = max(self.peak.get(pool, 0), mem)
                        try:
                            self.cpu.setdefault(pool, {})[pid] = proc_cpu_seconds(pid)
                        except (OSError, ValueError, IndexError):
                            pass
            self.total_peak = max(self.total_peak, total)
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def estimated_bytes(cfg) -> int:
    """All four pools at once (the loaders build open_clip models in fp32, then cast) + Ray itself."""
    from adjcap.engine.pools import pool_budget

    b = pool_budget(cfg, gpu=False)
    return sum(b[p]["bytes"] for p in ("retriever", "verifier", "captioner", "scorer")) + (3 << 30)


def ray_refuses(cfg, avail: int) -> str | None:
    """The job's own up-front check (adjcap.engine.cluster_plan.pool_plan) against the local Ray this machine
    would start: its ``memory`` resource is what is available less the object store (30% by default)."""
    from adjcap.engine.cluster_plan import ResourceError, pool_plan

    try:
        pool_plan(cfg, {"CPU": float(os.cpu_count() or 1), "memory": 0.7 * avail})
    except ResourceError as e:
        return str(e)
    return None


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def run_ray(sets: list[str], run_dir: Path, env: dict, preset: str = "headline", evaluate: bool = True,
            timeout_s: float | None = None) -> dict:
    """``cli.py run-job`` in a subprocess; returns the figures it printed and the pools' peak RSS
    (``evaluate=False``: the features only; ``timeout_s``: the job is killed then, and that is the error)."""
    cmd = [sys.executable, str(ROOT / "cli.py"), "run-job", "realsize", "--preset", preset,
           "--run-dir", str(run_dir), "--fresh", "--workers", "1", *([] if evaluate else ["--no-evaluate"])]
    for s in sets:
        cmd += ["--set", s]
    print("  $ " + " ".join(cmd[:8]) + f" ... ({len(sets)} --set overrides)")
    t = time.time()
    log = run_dir.parent / f"{run_dir.name}.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
        mon = PoolMemory(proc.pid)
        mon.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            mon.stop()
            raise SystemExit(f"run-job killed after {timeout_s:.0f}s; its last lines: {log.read_text()[-1500:]}")
    wall = time.time() - t
    mon.stop()
    out = log.read_text()
    print(f"  job output: {log}")
    if proc.returncode != 0:
        print(out[-6000:])
        raise SystemExit(f"run-job failed (exit {proc.returncode})")
    figures = {"wall_s": wall, "pool_peak_rss": mon.peak, "ray_peak_rss": mon.total_peak,
               "pool_cpu_s": {pool: sum(v.values()) for pool, v in mon.cpu.items()}}
    m = re.search(r"throughput: ([\d.]+) images/s over ([\d.]+)s", out)
    if m:
        figures["features_images_per_s"], figures["features_s"] = float(m.group(1)), float(m.group(2))
    m = re.search(r"streaming: ([\d.]+) images/s \((\d+) images after the first batch, in ([\d.]+)s\)", out)
    if m:
        figures["streaming_images_per_s"] = float(m.group(1))
        figures["streaming_images"], figures["streaming_s"] = int(m.group(2)), float(m.group(3))
    m = re.search(r"index: \d+ shards \((\d+) captions\) encoded in ([\d.]+)s", out)
    if m:
        figures["corpus_captions"], figures["corpus_encode_s"] = int(m.group(1)), float(m.group(2))
    for line in out.splitlines():
        if line.startswith(("features ", "throughput", "index: ")):
            print("   ", line)
    from adjcap.storage.rundir import RunDir

    rows = RunDir(run_dir).read_features("realsize", "test").to_pylist()
    figures["errors"] = [r["error"] for r in rows if r["error"]]
    figures["example"] = {"image": rows[0]["image_id"], "candidates": len(rows[0]["candidates"] or []),
                          "best": (rows[0]["candidates"] or [{}])[0].get("text")}
    return figures


def test_records(cfg) -> list:
    """The benchmark's test records, read by the library (no Ray: the GPU machine may not have it)."""
    from adjcap.data.benchmarks import read_benchmark, split_annotations

    b = cfg.benchmark_cfg(cfg.benchmark)
    return read_benchmark(b.format, split_annotations(b, "test", cfg.benchmark), b.images, "test", limit=cfg.limit)


JUDGES = ("lm_logprob_mean", "retrieval_cosine", "verifier")  # each single judge's top candidate


def outputs(states) -> list[dict]:
    """What parity compares per image: retrieved and kept corpus ids, the beam's texts, each judge's top
    candidate (the stage-4 scores)."""
    out = []
    for s in states:
        cands = s.candidates or []
        top = {j: (max(range(len(cands)), key=lambda i: cands[i][j]) if cands else None) for j in JUDGES}
        out.append({"image": s.image_id, "retrieved": [r["corpus_id"] for r in s.retrieved or []],
                    "verified": [v["corpus_id"] for v in s.verified or []], "beam": [c["text"] for c in cands],
                    "top": {j: (cands[i]["text"] if i is not None else None) for j, i in top.items()}})
    return out


def parity(a: list[dict], b: list[dict]) -> dict:
    """Images (of the same list) whose retrieval, kept captions, beam or each judge's top candidate differ."""
    n = len(a)
    res = {"images": n, "retrieved": sum(x["retrieved"] != y["retrieved"] for x, y in zip(a, b)),
           "verified": sum(x["verified"] != y["verified"] for x, y in zip(a, b)),
           "beam": sum(x["beam"] != y["beam"] for x, y in zip(a, b))}
    for j in JUDGES:
        res[f"top by {j}"] = sum(x["top"][j] != y["top"][j] for x, y in zip(a, b))
    return res


def decoded_states(cfg, n_images: int, prepare: bool) -> tuple[list, float]:
    """The first ``n_images`` test images decoded into states, and with ``prepare`` their pixels made as
    the Ray job's decode tasks make them (the stages then read no image); with the CPU-s per image."""
    from adjcap.engine import image_state, stage_registry

    recs = test_records(cfg)[:n_images]
    preps, known = stage_registry.pixel_preps(cfg, stage_registry.names()) if prepare else ((), False)
    t = time.process_time()
    states = [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path,
                                       keep_bytes=not (prepare and known)) for r in recs]
    if prepare:
        for s in states:
            s.prepare_pixels(preps)
            s.image = None
    return states, (time.process_time() - t) / max(1, n_images)


def run_stages(cfg, n_images: int) -> dict:
    """One pool's models at a time, in this process: seconds per image per stage, RSS per pool."""
    from adjcap.engine import stages
    from adjcap.data.corpus import load_corpus
    from adjcap.index import CaptionIndex
    from adjcap.models.roles import load_captioner, load_retrieval_encoder, load_verifier

    from adjcap.models.precision import set_tf32

    set_tf32(cfg.tf32, cfg.device)  # as the pools do where they load their models
    states, decode_cpu_s = decoded_states(cfg, n_images, prepare=cfg.ray.prepare_pixels)
    corpus = load_corpus(cfg.benchmark_cfg().corpus, cfg.benchmark_cfg().corpus_format)
    dev = cfg.device
    # the decode tasks' CPU per image (not in the stages: the Ray job runs it in CPU tasks)
    out: dict = {"load_s": {}, "stage_s_per_image": {}, "rss_after_load": {}, "decode_cpu_s_per_image": decode_cpu_s,
                 "prepared_pixels": sorted({k for s in states for k in s.pixels})}
    base = rss()

    out["stage_cpu_s_per_image"] = {}

    def timed(label, fn):
        t, c = time.perf_counter(), time.process_time()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out["stage_s_per_image"][label] = (time.perf_counter() - t) / n_images
        # CPU seconds of this process (all its threads): what a busy shared machine does not inflate
        out["stage_cpu_s_per_image"][label] = (time.process_time() - c) / n_images
        print(f"  {label:9s} {out['stage_s_per_image'][label]:8.2f} s/image wall, "
              f"{out['stage_cpu_s_per_image'][label]:8.2f} CPU-s/image", flush=True)

    def loaded(label, fn):
        gc.collect()
        t = time.perf_counter()
        m = fn()
        out["load_s"][label] = time.perf_counter() - t
        out["rss_after_load"][label] = rss() - base
        print(f"  {label:9s} load {out['load_s'][label]:5.1f}s, RSS (anonymous) +{gib(out['rss_after_load'][label])}",
              flush=True)
        return m

    enc = loaded("encoder", lambda: load_retrieval_encoder(cfg.retrieval.encoder, dev, towers=("text",)))
    t = time.perf_counter()
    vecs = enc.encode_texts(list(corpus.texts), normalize=True)
    out["corpus_encode_s_per_caption"] = (time.perf_counter() - t) / len(corpus.texts)
    print(f"  corpus encode {out['corpus_encode_s_per_caption'] * 1000:.0f} ms/caption wall", flush=True)
    index = CaptionIndex.from_arrays(vecs.float().cpu().numpy(), device=dev, precision="fp16")
    del enc
    enc = loaded("retriever", lambda: load_retrieval_encoder(cfg.retrieval.encoder, dev, towers=("image",)))
    timed("retrieve", lambda: stages.retrieve(states, enc, index, corpus.texts, cfg.retrieval.top_l))
    del enc
    ver = loaded("verifier", lambda: load_verifier(cfg.verifier, dev))
    timed("verify", lambda: stages.verify(states, ver, cfg.verifier.keep))
    del ver
    role = loaded("captioner", lambda: load_captioner(cfg.captioner, dev))
    timed("caption", lambda: stages.caption(states, role.captioner, role.clip, cfg.captioner, role.vocabulary))
    del role
    gc.collect()

    def scorer():
        return load_retrieval_encoder(cfg.retrieval.encoder, dev, towers=("text",)), load_verifier(cfg.verifier, dev)

    enc, ver = loaded("scorer", scorer)
    timed("score", lambda: stages.score(states, enc, ver))
    del enc, ver
    gc.collect()
    errors = [s.error for s in states if s.error]
    out["errors"] = errors
    out["outputs"] = outputs(states)
    out["example"] = {"image": states[0].image_id, "retrieved": [c["text"] for c in states[0].retrieved[:2]],
                      "candidates": len(states[0].candidates), "verified": len(states[0].verified)}
    return out


def run_side_by_side(cfg, n_images: int) -> dict:
    """adjcap's stages against the paper's way (benchmarks/paper_way.py), one pool's models at a time."""
    from adjcap.data.corpus import load_corpus
    from adjcap.index import CaptionIndex
    from adjcap.models.roles import load_captioner, load_retrieval_encoder, load_verifier
    from benchmarks.paper_way import side_by_side

    from adjcap.models.precision import set_tf32

    set_tf32(cfg.tf32, cfg.device)  # as the pools do where they load their models
    states, _ = decoded_states(cfg, n_images, prepare=False)  # the paper's way decodes the image itself
    corpus = load_corpus(cfg.benchmark_cfg().corpus, cfg.benchmark_cfg().corpus_format)
    dev = cfg.device
    enc = load_retrieval_encoder(cfg.retrieval.encoder, dev, towers=("text",))
    index = CaptionIndex.from_arrays(enc.encode_texts(list(corpus.texts), normalize=True).float().cpu().numpy(),
                                     device=dev, precision="fp16")
    del enc
    gc.collect()
    loaders = {
        "retriever": lambda: load_retrieval_encoder(cfg.retrieval.encoder, dev, towers=("image",)),
        "verifier": lambda: load_verifier(cfg.verifier, dev),
        "captioner": lambda: load_captioner(cfg.captioner, dev),
        "scorer": lambda: (load_retrieval_encoder(cfg.retrieval.encoder, dev, towers=("text",)),
                           load_verifier(cfg.verifier, dev)),
    }

    def load(pool: str):
        gc.collect()
        return loaders[pool]()

    out = side_by_side(cfg, states, load, index, corpus.texts)
    out["example"] = {"image": states[0].image_id, "candidates": len(states[0].candidates),
                      "verified": len(states[0].verified)}
    return out


def encode_only(cfg, n: int) -> None:
    """The retrieval encoder's text tower over n COCO-like captions (566,747: COCO Karpathy train)."""
    from adjcap.models.roles import load_retrieval_encoder

    enc = load_retrieval_encoder(cfg.retrieval.encoder, cfg.device, towers=("text",))
    texts = corpus_captions(n)
    enc.encode_texts(texts[:4096], normalize=True)  # warm-up
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    enc.encode_texts(texts, normalize=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    print(f"corpus encode: {n} captions in {dt:.1f}s = {n / dt:.0f} captions/s "
          f"({enc.model_name}, {enc.dtype}, {enc.device}); target <= 30 s for {COCO_CORPUS}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--corpus", type=int, default=None, help="corpus captions (default: 128 on CPU, 566,747 on cuda)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--mode", default="auto", choices=["auto", "ray", "stages", "side-by-side"])
    ap.add_argument("--assets", type=Path, default=None)
    ap.add_argument("--assets-only", action="store_true", help="write the checkpoints and stop")
    ap.add_argument("--encode-only", action="store_true", help="time the corpus encode only")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--judges", default="headline", choices=sorted(RETRIEVAL_MODEL),
                    help="whose judges: the headline's (bigG, BLIP large) or the cpu-16gb preset's (ViT-L-14, BLIP base)")
    ap.add_argument("--preset", default="headline", choices=["headline", "gpu"],
                    help="the method's settings: the headline's (the paper's fidelity settings) or the gpu speed "
                         "preset's (TF32, token-budget text batches, SDPA vision attention); --precision sets the "
                         "encoders' and the verifier's precision in both")
    ap.add_argument("--parity", action="store_true",
                    help="the gpu preset's parity: the headline in fp32, then the gpu preset (bf16), both --mode stages, "
                         "and which outputs moved (--preset and --precision are then ignored)")
    args = ap.parse_args()

    from adjcap.config import load_config

    cache = Path(os.environ.get("ADJCAP_CACHE", "~/.cache/adjcap")).expanduser()
    root = (args.assets or cache / "realsize").resolve()
    n_corpus = args.corpus or (COCO_CORPUS if args.device.startswith("cuda") else 128)
    assets = write_assets(root, args.images, n_corpus, args.judges)
    if args.assets_only:
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "TOKENIZERS_PARALLELISM": "false"}
    results = {}
    runs = [("headline", "fp32"), ("gpu", "bf16")] if args.parity else [(args.preset, p) for p in args.precision]
    if args.parity:
        args.mode = "stages"
    for preset, prec in runs:
        args.preset = preset
        sets = overrides(assets, prec, args.device, args.images, root / "cache", args.judges)
        cfg = load_config(preset, sets).resolved()
        if args.encode_only:
            encode_only(cfg, n_corpus)
            continue
        need, avail = estimated_bytes(cfg), available_bytes()
        mode, why = args.mode, ""
        if mode == "auto":
            refused = None if args.device.startswith("cuda") else ray_refuses(cfg, avail)
            mode, why = ("stages", f"; the job would refuse: {refused}") if refused else ("ray", "")
        print(f"\n== {preset} preset, {prec} on {args.device}, {args.images} images, {n_corpus} corpus captions: mode {mode} "
              f"(all pools at once ~{gib(need)}, available {gib(avail)}{why})")
        if mode == "ray":
            r = run_ray(sets, root / "runs" / f"{args.judges}-{args.preset}-{prec}-{args.images}", env, args.preset)
            print(f"  end to end: {args.images / r['wall_s']:.3f} images/s ({r['wall_s']:.0f}s wall, incl. Ray start, "
                  f"model loading, corpus encode, fit, evaluate)")
            for pool, b in sorted(r["pool_peak_rss"].items()):
                print(f"  {pool:9s} peak RSS (anonymous) {gib(b)}, CPU {r['pool_cpu_s'].get(pool, 0):.0f}s incl. loading")
            print(f"  peak RSS of all Ray workers together {gib(r['ray_peak_rss'])}")
            print(f"  example: {r['example']}")
            if r["errors"]:
                print(f"  ERRORS ({len(r['errors'])}): {r['errors'][0][:400]}")
        elif mode == "side-by-side":
            r = run_side_by_side(cfg, args.images)
            print(f"  example: {r['example']}")
        else:
            r = run_stages(cfg, args.images)
            print(f"  example: {r['example']}")
            if r["errors"]:
                print(f"  ERRORS: {r['errors']}")
        results[f"{preset}-{prec}-{mode}" if args.parity or preset != "headline" else f"{prec}-{mode}"] = r
    staged = [r for r in results.values() if "outputs" in r]
    if len(staged) == 2:  # two precisions in one process: what moved between them
        results["parity"] = parity(staged[0]["outputs"], staged[1]["outputs"])
        print(f"\n== parity, {' vs '.join(k for k, r in results.items() if 'outputs' in r)}: images whose ... differ")
        for k, v in results["parity"].items():
            print(f"  {k:28s} {v}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
