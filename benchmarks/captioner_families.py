"""What each captioner family (captioner.family) costs per image on CPU: stage 3 alone, on demo-world
images, after retrieve + verify have run (their cost is the same for every family).

    ADJCAP_CACHE=DIR python benchmarks/captioner_families.py --images 40 --json out.json

DIR holds the demo world and its tiny models (make demo) and, for ``hf``, the tiny BLIP captioner
(``{cache}/tiny/blip-caption``: trained on first use by ``adjcap reproduce captioner-sweep --benchmark
demo``). Families: ifcap (the demo's tiny IFCap, beam 20), hf (the tiny BlipForConditionalGeneration,
beam 20), candidates with log-probs (IFCap's own beams exported, as ``samples.parquet`` would give them)
and candidates without (the same texts judged by a tiny random GPT-2 built here with the demo
tokenizer; GPT-2 small itself costs more). CPU seconds are this process's (``time.process_time``), so
the numbers hold on a loaded machine; one thread (``--threads``)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adjcap.engine import image_state, stage_registry  # noqa: E402
from adjcap.config import load_config  # noqa: E402
from adjcap.data.candidates import write_candidates  # noqa: E402
from adjcap.engine.run_plan import read_records  # noqa: E402
from adjcap.engine.pipeline import load_models  # noqa: E402


def _states(cfg, records):
    exif = cfg.benchmark_cfg().applies_exif()
    return [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path, r.error, exif)
            for r in records]


def _tiny_judge(cfg, out: Path) -> str:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(cfg.captioner.tokenizer)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                               bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = load_config("demo", ["captioner.beam_width=20", "captioner.batch_size=8"]).resolved()
    records = read_records(base)["test"][: args.images]
    models = load_models(base)
    m = vars(models)
    prepared = _states(base, records)
    for st in stage_registry.stages()[:2]:  # retrieve, verify: shared by every family
        st.run(prepared, m, base)
    caption = stage_registry.stage("caption")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfgs = {"ifcap": base,
                "hf": load_config("demo", ["captioner.beam_width=20", "captioner.batch_size=8", "captioner.family=hf",
                                           f"captioner.hf.model={base.paths.cache_dir}/tiny/blip-caption"]).resolved()}
        for name in ("ifcap", "hf", "candidates (log-probs in the file)", "candidates (tiny LM judge)"):
            if name.startswith("candidates"):
                rows = []
                for s in done_ifcap:  # each text once (a file repeating a candidate is refused)
                    seen: set[str] = set()
                    first = [c for c in s.candidates if not (c["text"] in seen or seen.add(c["text"]))]
                    rows.append({"image": s.image_id, "candidates": [c["text"] for c in first],
                                 **({"logprobs": [c["lm_logprob_sum"] for c in first],
                                     "n_tokens": [c["n_tokens"] for c in first]} if "log-probs" in name else {})})
                f = write_candidates(Path(tmp) / f"{len(results)}.jsonl", rows)
                sets = ["captioner.family=candidates", f"captioner.candidates.file={f}"]
                if "judge" in name:
                    sets.append(f"captioner.candidates.lm={_tiny_judge(base, Path(tmp) / 'gpt2')}")
                cfg = load_config("demo", sets).resolved()
            else:
                cfg = cfgs[name]
            t0 = time.process_time()
            model = stage_registry.family("captioner").load(cfg, None)
            load_s = time.process_time() - t0
            states = [image_state.ImageState(**{**s.__dict__, "done": set(s.done), "computed": set(s.computed),
                                                "candidates": []}) for s in prepared]
            t0, w0 = time.process_time(), time.perf_counter()
            caption.run(states, {"captioner": model}, cfg)
            cpu, wall = time.process_time() - t0, time.perf_counter() - w0
            errors = [s.error for s in states if s.error]
            if name == "ifcap":
                done_ifcap = states
            n = len(states)
            results[name] = {"images": n, "cpu_s_per_image": round(cpu / n, 4), "wall_s_per_image": round(wall / n, 4),
                             "load_cpu_s": round(load_s, 2), "candidates_per_image": round(
                                 sum(len(s.candidates) for s in states) / n, 1), "errors": len(errors)}
            print(f"{name:36s} {results[name]}")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "families": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
