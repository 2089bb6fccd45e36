"""The configuration's schema: the typed sections of a run's :class:`Config` (pydantic models, each
key with its type, default and description), the built-in benchmark table, and the walk of the
schema the overrides and the key lists share (:func:`section_model`, :data:`DICT_SECTIONS`)."""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adjcap.picker_needs import PICKER_NEEDS
from adjcap.registry import unknown
from adjcap.engine.verifier_families import NAMES as VERIFIER_FAMILIES

Precision = Literal["auto", "fp32", "fp16", "bf16"]


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key and what to do."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


class PathsCfg(_Strict):
    cache_dir: str = Field(
        default_factory=lambda: os.environ.get("ADJCAP_CACHE", "~/.cache/adjcap"),
        description="content-addressed cache: corpus indexes, the tiny-model world, the demo world",
    )
    data_dir: str = Field(
        default_factory=lambda: os.environ.get("ADJCAP_DATA", "~/adjcap-data"),
        description="root of the real benchmarks, annotations and checkpoints",
    )
    runs_dir: str = Field(
        default_factory=lambda: os.environ.get("ADJCAP_RUNS", "runs"),
        description="where run directories go: <runs_dir>/<preset>-<benchmark> by default (on a cluster: a shared "
        "mount, never a relative path inside Ray's unpacked working directory)",
    )


class EncoderCfg(_Strict):
    """An open_clip dual encoder: architecture name + pretrained tag or local checkpoint file."""

    model: str = Field("ViT-bigG-14", description="open_clip architecture name (ViT-bigG-14, ViT-B-32, RN50x64, ...)")
    pretrained: str | None = Field(
        "laion2b_s39b_b160k", description="open_clip pretrained tag, hf-hub:REPO, or a local checkpoint file"
    )
    precision: Precision = Field(
        "fp32", description="fp32 as the paper (auto = bf16/fp16 on a GPU, fp32 on CPU); root `precision` overrides"
    )
    image_batch_size: int = Field(32, gt=0, description="images per forward pass of the image tower")
    text_batch_size: int = Field(512, gt=0, description="captions per forward pass of the text tower (corpus encoding)")
    text_token_budget: int = Field(
        0, ge=0, description="token-budget text batches: captions sorted by length, a batch cut before its padded "
        "tokens (rows x its longest caption) exceed this; 0 = off (batches of text_batch_size rows, the paper "
        "presets': a batch's make-up moves the embeddings' last bits); the gpu preset sets it")

    def same_model(self, other: "EncoderCfg") -> bool:
        """Loads the same model at the same precision as ``other`` (batch sizes aside)."""
        return (self.model, self.pretrained, self.precision) == (other.model, other.pretrained, other.precision)


class RetrievalCfg(_Strict):
    encoder: EncoderCfg = Field(default_factory=EncoderCfg)
    top_l: int = Field(9, gt=0, description="L: corpus captions retrieved per image")
    index_dir: str | None = Field(
        None, description="explicit index directory; default: {cache}/index/<encoder>-<corpus fingerprint>"
    )
    index_precision: Literal["fp16", "fp32"] = Field("fp16", description="dtype of the stored caption index vectors")
    shard_size: int = Field(65536, gt=0, description="corpus captions per index shard")
    corpus: str | None = Field(
        None, description="search this registered caption corpus (adjcap/data/corpora.toml: cc3m, laion-coco, "
        "demo-alt; `adjcap prepare corpus-NAME`) instead of the benchmark's own; None = benchmarks.<name>.corpus"
    )

    @field_validator("corpus")
    @classmethod
    def _known_corpus(cls, v: str | None) -> str | None:
        if v is not None:
            from adjcap.data.corpora import get_corpus  # the registry owns the names

            get_corpus(v)  # DataError (a ValueError) naming the known corpora
        return v


class VerifierCfg(_Strict):
    enabled: bool = Field(True, description="run stage 2; false keeps the first k retrieved, in retrieval order")
    family: Literal[VERIFIER_FAMILIES] = Field(  # adjcap.engine.verifier_families: one record each
        "blip_itm", description="the judge of stages 2 and 4: blip_itm (BLIP ITM head, match probability in (0, 1)), "
        "blip2_itm (BLIP-2 Q-Former ITM head, match probability in (0, 1)) or clip (any open_clip dual encoder: "
        "sigmoid(scale * cosine + bias) in (0, 1) for a model with a logit bias (SigLIP), else (cosine + 1) / 2 "
        "in [0, 1])"
    )
    model: str = Field(
        "Salesforce/blip-itm-large-coco", description="blip_itm: hub id, local directory or a LAVIS .pth file; "
        "blip2_itm: hub id or local directory (Salesforce/blip2-itm-vit-g); clip: open_clip architecture name "
        "(ViT-SO400M-14-SigLIP-384)"
    )
    pretrained: str | None = Field(
        None, description="clip family: the open_clip pretrained tag (webli), hf-hub:REPO or a local checkpoint of "
        "verifier.model (unused by the other families)"
    )
    keep: int = Field(5, gt=0, description="k: verified captions kept out of the L retrieved")
    max_text_tokens: int = Field(35, gt=0, description="LAVIS truncates ITM text at 35 tokens")
    long_captions: Literal["whole", "sentence_min", "sentence_mean"] = Field(
        "whole", description="how the judge reads a candidate (stage 4; stage 2 reads the corpus captions whole): "
        "whole (one caption, cut at the judge's window) or sentence_min / sentence_mean (each sentence judged "
        "alone, the candidate scored by the least / the mean of its sentences; a sentence ends at . ! ? before "
        "white space or at a line break; a candidate of one sentence is judged as whole)")
    precision: Precision = Field("fp32", description="fp32 as the paper; root `precision` overrides")
    batch_size: int = Field(16, gt=0, description="images per verifier call")
    text_token_budget: int = Field(
        0, ge=0, description="the ITM text side's token budget: images' captions in length order, a chunk cut "
        "before its padded tokens exceed this; 0 = off (chunks of up to 256 caption rows, the paper presets')")
    attention: Literal["eager", "sdpa"] = Field(
        "eager", description="BLIP's vision attention: eager (transformers' matmul + softmax, the paper's) or "
        "sdpa (torch's scaled_dot_product_attention: fused kernels on a GPU, equal to 1e-5; the gpu preset's)")
    itm_first_token: Literal["enc", "cls"] = Field(
        "enc", description="first ITM text token: [ENC] as LAVIS/BLIP do, or [CLS] as the transformers example"
    )
    caption_preprocess: Literal["lavis", "none"] = Field(
        "lavis", description="LAVIS pre_caption cleaning (lower case, drop .!\"()*#:;~, 50 words) before tokenising"
    )
    backend: Literal["transformers", "lavis"] = Field(
        "transformers",
        description="'transformers' (BlipForImageTextRetrieval in this environment) or 'lavis' (salesforce-lavis's "
        "own blip_image_text_matching in its isolated environment, built by `adjcap lavis-env`)",
    )
    tokenizer: str = Field(
        "bert-base-uncased",
        description="BERT tokenizer (hub id or local directory) of a LAVIS .pth verifier.model; [DEC], [ENC] are appended",
    )


class EntityCfg(_Strict):
    mode: Literal["frequency", "clip_classifier", "none"] = Field(
        "frequency", description="how the hard prompt's entities are chosen: nouns counted over the pool "
        "(frequency), a CLIP classifier over `vocabulary` (NoCaps), or none"
    )
    threshold: int = Field(3, ge=0, description="K: admit a noun counted at least K times")
    pool: Literal["verified", "retrieved"] = Field(
        "verified", description="count nouns over the k verified captions or all L retrieved"
    )
    tagger: str = Field(
        "nltk",
        description="'nltk' (word_tokenize + pos_tag + WordNet, as IFCap) or a JSON lexicon {word: [tag, lemma]}",
    )
    vocabulary: str | None = Field(None, description="CLIP-classifier vocabulary (JSON list or class2ind)")
    classifier_top_k: int = Field(3, description="clip_classifier: at most this many entities")
    classifier_threshold: float = Field(0.2, description="clip_classifier: an entity's least probability")
    classifier_temperature: float = Field(0.01, description="clip_classifier: softmax temperature over the vocabulary")


class HfCaptionerCfg(_Strict):
    """captioner.family = hf: a transformers image-to-text model that beam-searches."""

    model: str = Field("Salesforce/blip-image-captioning-large",
                       description="hub id or save_pretrained directory of a BlipForConditionalGeneration, "
                       "GitForCausalLM or VisionEncoderDecoderModel")
    prompt: str | None = Field(None, description="text the caption continues (BLIP: 'a picture of'); None: "
                               "the model's own start; the caption is the continuation only")


class VlmCaptionerCfg(_Strict):
    """captioner.family = vlm: a vision-language model (any AutoModelForImageTextToText checkpoint) asked
    one instruction per image through its chat template (adjcap.models.vlm_captioner)."""

    model: str = Field("llava-hf/llava-1.5-7b-hf", description="hub id or save_pretrained directory of an "
                       "image-text-to-text model with its processor (tokenizer, chat template)")
    prompt: str = Field("detail", description="the instruction: 'detail' (\"Please describe this image in "
                        "detail.\", the CHAIR protocol of OPERA / VCD), 'short' (\"Provide a one-sentence caption "
                        "for the provided image.\") or the text itself")
    chat_template: bool = Field(True, description="put the prompt in the processor's chat template after the "
                                "image; false: the prompt is the whole text and holds the image token itself")
    search: Literal["beam", "sample"] = Field(
        "beam", description="beam: num_beams = num_return_sequences = captioner.beam_width; sample: that many "
        "samples (temperature 1, no top-k / top-p), seeded per image; captioner.decoder = greedy: one")
    max_new_tokens: int = Field(512, gt=0, description="most tokens a candidate is generated to (the protocol: 512)")
    sample_seed: int = Field(0, description="search = sample: each image's seed is this + a hash of its id")
    precision: Precision = Field("auto", description="the model's weights: auto = bf16 on a GPU, fp32 on a CPU")


class CandidatesCfg(_Strict):
    """captioner.family = candidates: captions from any system, read from a file (adjcap.data.candidates)."""

    file: str | None = Field(None, description="JSONL or Parquet: one row per image {image, candidates, "
                             "logprobs (optional)}; `adjcap caption DIR --candidates FILE` sets it")
    lm: str = Field("gpt2", description="the LM judge where a row has no logprobs: a text-only causal LM "
                    "(hub id or directory) scoring each candidate")
    lm_batch_size: int = Field(32, gt=0, description="candidates per forward pass of the LM judge")
    max_chars: int = Field(5000, gt=0, description="the longest candidate accepted, in characters: a longer one "
                           "is refused with its line (raise it for long descriptions)")
    allow_missing: bool = Field(False, description="let images of the benchmark have no line in the file: they "
                                "become error rows ('no candidates'); default: refused before the job starts")

    @field_validator("file")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        """A relative path is taken from the working directory, once: the run's identity then counts the
        file by its content (adjcap.engine.identity.content_id reads paths, not bare names)."""
        if v and "{" not in v and not v.startswith("~") and not os.path.isabs(v):
            return os.path.abspath(v)
        return v


class CaptionerCfg(_Strict):
    family: Literal["ifcap", "hf", "vlm", "candidates"] = Field(
        "ifcap", description="which captioner makes the candidates: IFCap (the settings below), a transformers "
        "model (captioner.hf), a vision-language model (captioner.vlm) or a file of candidates "
        "(captioner.candidates); adjcap.engine.captioners")
    hf: HfCaptionerCfg = Field(default_factory=HfCaptionerCfg)
    vlm: VlmCaptionerCfg = Field(default_factory=VlmCaptionerCfg)
    candidates: CandidatesCfg = Field(default_factory=CandidatesCfg)
    checkpoint: str = Field("{data}/ifcap/checkpoints/train_coco/coco-indomain-004.pt",
                            description="the released IFCap checkpoint (.pt), loaded strictly")
    clip: EncoderCfg = Field(default_factory=lambda: EncoderCfg(model="ViT-B-32", pretrained="openai"))
    tokenizer: str = Field("gpt2", description="HF id or directory of the GPT-2 BPE tokenizer")
    lm_config: str = Field("gpt2", description="'gpt2' (built in) or a directory holding config.json")
    mapping_heads: int = Field(8, description="attention heads of IFCap's mapping network (8 in the release)")
    fusion_captions: int = Field(5, gt=0, description="retrieved captions fed to the mapping network")
    decoder: Literal["beam", "greedy"] = Field("beam", description="beam search, or greedy (IFCap's Flickr30k setting)")
    beam_width: int = Field(20, gt=0, description="beams kept: the candidates each image gets")
    max_len: int = Field(64, gt=0, description="most tokens a caption is decoded to")
    search: Literal["fast", "reference"] = Field(
        "fast", description="fast: KV-cached, batched beam; reference: GPT-2's full forward per step, bitwise the "
        "official search"
    )
    batch_size: int = Field(32, gt=0, description="images decoded together by the fast beam search (its image "
                            "slots) when captioner.rows is unset; a call to the hf family's generate")
    rows: int | None = Field(
        None, gt=0, description="beam rows the fast beam search keeps on the device (image slots x beam_width; "
        "continuous batching: a finished image's rows take the next image at the next step); None: batch_size "
        "image slots. The gpu preset sizes it for a GPU. A speed setting: in no identity")
    compile: Literal["off", "default", "graphs"] = Field(
        "off", description="default: torch.compile the fast beam search's step (GPT-2 + the vocabulary-wide beam "
        "step, fixed shapes), once per captioner process and rows shape, on a GPU (ignored on a CPU, said once in "
        "the log); graphs: the same, replayed as CUDA graphs (mode reduce-overhead). The same beams, compiled "
        "once per compile_cache; off in every preset (BENCHMARKS.md). A speed setting: in no identity")
    compile_cache: str = Field(
        "{cache}/compile", description="where torch.compile keeps its compiled artifacts (inductor's and Triton's "
        "caches): a second captioner process, or a later job, loads them instead of compiling (a shared volume on "
        "a cluster). A speed setting: in no identity")
    precision: Precision = Field("fp32", description="the GPT-2 language model's (root `precision` leaves it)")
    entities: EntityCfg = Field(default_factory=EntityCfg)
    contrastive_lambda: float = Field(
        0.0, ge=0.0, description="negative result: l_cd=(1+lambda) l_pos - lambda l_neg; 0 disables"
    )


class ScorerCfg(_Strict):
    lm_feature: Literal["mean", "sum"] = Field(
        "mean", description="LM log-prob used as a feature; 'mean' is what the beam itself ranks by"
    )
    encoder: EncoderCfg | None = Field(
        None, description="output scorer: the CLIP of the stage-4 cosine s_R; None = the retrieval encoder "
        "(stage 1's image embedding is then reused)"
    )
    batch_size: int = Field(16, gt=0, description="images per scorer call")


class TriFuseCfg(_Strict):
    hidden: int = Field(8, description="hidden units of TriFuse's MLP")
    lr: float = Field(1e-2, description="Adam learning rate")
    epochs: int = Field(100, description="passes over the fit split")


class MemAttendCfg(_Strict):
    d_model: int = Field(32, description="width of MemAttend's transformer")
    layers: int = Field(2, description="transformer layers")
    heads: int = Field(4, description="attention heads")
    ffn: int = Field(64, description="feed-forward width")
    memory_tokens: int = Field(5, description="verified captions read as memory tokens")
    lr: float = Field(3e-3, description="Adam learning rate")
    epochs: int = Field(200, description="passes over the fit split")


class RerankCfg(_Strict):
    picker: str = Field("ensemble", description="a declared picker (adjcap.picker_needs.PICKER_NEEDS lists them)")
    protocol: Literal["inductive", "transductive", "training-free"] = Field(
        "inductive", description="inductive: fit the heads on fit_split, pick on apply_split; transductive: fit on "
        "the apply split's own beams; training-free: fit nothing"
    )
    fit_split: str = Field("val", description="the split the heads are fitted on (inductive)")
    apply_split: str = Field("test", description="the split whose captions are picked and scored")
    alpha: float = Field(0.48, ge=0.0, le=1.0, description="fixed picker: alpha * z(LM) + (1 - alpha) * z(cosine)")
    beta: float = Field(0.75, ge=0.0, le=1.0,
                        description="ensemble picker: beta * z(TriFuse) + (1 - beta) * z(MemAttend)")
    trifuse: TriFuseCfg = Field(default_factory=TriFuseCfg)
    memattend: MemAttendCfg = Field(default_factory=MemAttendCfg)
    select: bool = Field(False, description="choose alpha/beta by Borda pseudo-label loss on held-out")
    holdout_fraction: float = Field(0.2, gt=0.0, lt=1.0,
                                    description="with select: the share of fit images held out to choose them")
    threads: int | None = Field(
        None, ge=1, description="CPU threads for fitting the heads; None = every available CPU (results do not depend on it)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the heads are fitted: auto = one GPU when the cluster has one, else CPU"
    )
    batch_images: int | None = Field(
        256, ge=1, description="images per optimiser step when fitting the heads; None = full batch (the "
                               "largest size within 0.5% of the best held-out Borda loss: docs/benchmarks/pipeline.md)"
    )

    seeds: list[int] | None = Field(
        None, description="the seed study: heads fitted once per seed on the same features, each learned picker "
        "scored per seed, mean and sd across seeds and Cohen's d against fixed and lm (e.g. [42, 43, 44]); "
        "None = [seed], the one seed the paper reports (no study)"
    )

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError(f"rerank.seeds = {v}: give distinct seeds, e.g. [42, 43, 44] (or leave it unset)")
        return v

    def seed_list(self, seed: int) -> list[int]:
        """The seeds of the study (``seed``, the run's own, when none are listed)."""
        return list(self.seeds) if self.seeds is not None else [int(seed)]

    def meta(self) -> dict[str, Any]:
        """The section as recorded beside the heads (seeds only when given: unchanged records without)."""
        return self.model_dump(mode="json", exclude={"seeds"} if self.seeds is None else None)

    @field_validator("picker")
    @classmethod
    def _known_picker(cls, v: str) -> str:
        if v not in PICKER_NEEDS:
            raise ValueError(PICKER_NEEDS.unknown(v))
        return v


class BenchmarkCfg(_Strict):
    format: str = Field(description="an annotation layout registered in adjcap/data/layouts, or auto")
    annotations: str = Field(description="reference file, in the layout `format` names")
    images: str = Field(description="image root directory")
    corpus: str | None = Field(None, description="training-caption corpus for retrieval")
    corpus_format: Literal["ifcap", "karpathy", "lines"] = Field(
        "ifcap", description="the corpus file's layout: IFCap's caption list, a Karpathy dataset_*.json, or one "
        "caption a line"
    )
    annotations_by_split: dict[str, str] = Field(
        default_factory=dict, description="per-split annotation files (IFCap layout: test/val files)"
    )
    exif_transpose: bool | None = Field(
        None, description="apply EXIF orientation when decoding; None = only for a folder of the user's own "
                          "images (the paper's benchmarks are read as their official pipelines read them: ignored)"
    )

    def applies_exif(self) -> bool:
        return self.format == "folder" if self.exif_transpose is None else self.exif_transpose

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        from adjcap.data.layouts import check_format  # the registry owns the names

        check_format(v)  # DataError (a ValueError) naming the known formats
        return v


class PoolCfg(_Strict):
    """One pool's actors (``ray.pool.<pool>``: retriever, verifier, captioner, scorer, fused or encoder;
    adjcap.engine.pools): unset values take the defaults of the ray section."""

    actors: int | None = Field(None, gt=0, description="actors of this pool (None: ray.workers)")
    gpus: float | None = Field(None, gt=0.0, description="GPU per actor on a cluster with GPUs (None: ray.gpu_share; "
                               "fused: the sum of the split pools' shares)")
    cpus: float | None = Field(None, gt=0.0, description="CPUs per actor (None: 1 with GPUs, else ray.cpu_share "
                               "shrunk so that every actor fits)")
    batch_size: int | None = Field(None, gt=0, description="images per Ray Data batch of this pool (None: "
                                   "ray.batch_size)")


class RayCfg(_Strict):
    workers: int = Field(1, gt=0, description="actors per pool (the default of ray.pool.<pool>.actors)")
    address: str | None = Field(None, description="existing cluster; None starts an embedded local Ray")
    dashboard_host: str = Field("127.0.0.1",
                                description="where the embedded Ray's dashboard listens (0.0.0.0 exposes it)")
    include_dashboard: bool | None = Field(None, description="start the embedded Ray's dashboard; None = Ray's default")
    pools: Literal["split", "fused", "auto"] = Field(
        "auto", description="split: one pool per stage (retriever, verifier, captioner, scorer); fused: every "
        "stage in one actor, each model loaded once; auto: fused without GPUs; with GPUs split when MPS is on "
        "(ray.mps), else fused, one CUDA context per GPU (adjcap.engine.pools)")
    mps: bool | None = Field(None, description="the GPU nodes run NVIDIA MPS (split pools then share a GPU without "
                             "time-slicing); None: whether this machine runs it (CUDA_MPS_PIPE_DIRECTORY or the "
                             "default pipe /tmp/nvidia-mps; `adjcap doctor` says)")
    scale_wait_s: float = Field(900.0, ge=0.0, description="on an autoscaling cluster, seconds the job waits for the "
                                "nodes its plan asked the autoscaler for before it ends naming those that never came")
    autoscaler_config: str | None = Field(None, description="the cluster launcher's config (its available_node_types: "
                                          "what the autoscaler can add) when Ray's GCS does not say; None: "
                                          "~/ray_bootstrap_config.yaml where it exists (the launcher's head)")
    pool: dict[str, PoolCfg] = Field(default_factory=dict, description="per-pool actors and CPU / GPU shares, "
                                     "e.g. ray.pool.captioner.actors=3, ray.pool.captioner.gpus=0.25")
    gpu_share: float = Field(0.25, gt=0.0, description="GPU per actor of a split pool (ray.pool.<pool>.gpus "
                             "overrides; the default puts one actor of every pool on a GPU)")
    cpu_share: float = Field(0.25, gt=0.0, description="CPUs per actor when no GPU is present")
    decode_cpus: float = Field(0.25, gt=0.0, description="CPUs per image-decoding task")
    decode_tasks: int | None = Field(None, gt=0, description="image-decoding tasks at once, cluster-wide (each is "
                                     "a worker process holding torch); None: 2 x workers")
    tokenize_tasks: bool | None = Field(None, description="CPU tasks tokenise the corpus's shards beside the "
                                        "encoder pool, so a GPU encoder's thread encodes one shard while the next "
                                        "is tokenised; None: when the cluster has GPUs (on CPUs the encode itself "
                                        "is the cost, and each task process imports open_clip)")
    prepare_pixels: bool = Field(True, description="the decode tasks resize and crop each image for the pools' "
                                 "models (uint8 pixels, normalised on the model's device), so the GPU actors "
                                 "decode no JPEG and run no PIL; false: the pools decode the image's bytes")
    batch_size: int | None = Field(None, gt=0, description="images per Ray Data batch of every pool (ray.pool.<pool>."
                                   "batch_size overrides one pool's); None: 64 on a cluster with GPUs, 16 without")
    rows_per_part: int = Field(256, gt=0, description="feature rows per Parquet part file")
    max_failed_share: float = Field(0.5, ge=0.0, le=1.0, description="stop the job (exit 65, the parts written "
                                    "kept, no fit) once more than this share of its images failed, checked as "
                                    "batches come back once 32 have; 1 = never stop (any failed image still "
                                    "exits 65, after everything is written)")
    data_poll_s: float = Field(0.5, gt=0.0, le=5.0, description="seconds Ray Data's scheduler on the driver waits "
                               "for running tasks before it looks again (Ray's own: 0.1); each look costs the "
                               "driver CPU, whatever the images; where blocks come back slowly the job looks up to "
                               "a quarter of the gap between them, at most 2 s")
    verbose: bool = Field(False, description="Ray's own console output: Ray Data's operator progress and Ray's "
                          "INFO log lines, and the workers' output forwarded to the driver (--verbose)")
    progress_interval: float = Field(10.0, gt=0.0, description="seconds between progress lines when the output "
                                     "is a file or a pipe (a terminal gets a live bar)")
    metrics_export_port: int | None = Field(None, ge=0, le=65535, description="the embedded Ray's Prometheus "
                                            "metrics port (adjcap_* metrics; None: Ray picks one)")

    @field_validator("gpu_share", mode="before")
    @classmethod
    def _one_gpu_share(cls, v: Any) -> Any:
        if isinstance(v, dict):
            raise ValueError("ray.gpu_share is one share for every pool's actor; per pool set "
                             "ray.pool.<pool>.gpus (e.g. ray.pool.captioner.gpus=0.5)")
        return v


class EvalCfg(_Strict):
    spice: bool = Field(True, description="score SPICE (Java and the CoreNLP 3.6.0 jars)")
    spice_jars: str | None = Field(
        "{data}/spice/lib", description="directory with Stanford CoreNLP 3.6.0 jars (`adjcap prepare spice` puts them here)"
    )
    spice_download: bool = Field(
        False, description="fetch the CoreNLP zip when the jars are missing (checked against its sha1)"
    )
    java: str = Field("java", description="the Java executable (PTB tokenizer, METEOR, SPICE)")
    java_mem: str = Field("8G", description="SPICE's Java heap (-Xmx)")
    clipscore_w: float = Field(2.5, description="CLIPScore = w * max(cos, 0) (Hessel et al.)")
    chair: Literal["proxy", "instances", "both"] = Field(
        "proxy", description="CHAIR's ground truth: proxy (the image's references, the paper's), instances (COCO "
        "instance annotations + references, the original CHAIR of Rohrbach et al. 2018; COCO images only) or both")
    coco_instances: list[str] = Field(
        default_factory=lambda: ["{data}/coco/annotations/instances_val2014.json"],
        description="COCO instances files for eval.chair = instances | both (`adjcap prepare coco-instances`); "
        "the Karpathy splits' images are all in val2014")
    clipscore: EncoderCfg = Field(
        default_factory=EncoderCfg,
        description="the fixed CLIPScore encoder (the paper's ViT-bigG-14 laion2b_s39b_b160k), the same for every run; "
        "its cosines are computed in stage 4 (reusing the output scorer's when it is the same encoder)",
    )


class CacheCfg(_Strict):
    share_stages: bool = Field(
        True, description="reuse per-stage outputs stored in stages_dir by runs that agree up to a stage"
    )
    stages_dir: str = Field("{cache}/stages", description="where per-stage outputs are stored (content-addressed)")


# the sections whose ``precision`` the root ``precision`` sets when it is not None (Config.resolved); a
# command-line setting of one of them that would be overridden is refused (adjcap.config.loading). The
# captioner's models keep their own (captioner.clip.precision, captioner.precision): its CLIP in bf16 changed
# the beam on 57 of 100 demo images for no speed worth having (a ViT-B/32 beside bigG;
# benchmarks/results/captioner-clip-bf16-demo.json)
ROOT_PRECISION_SECTIONS = ("retrieval.encoder", "verifier", "eval.clipscore", "scorer.encoder")


class Config(_Strict):
    name: str = Field("headline", description="the preset's name (run directories and messages use it)")
    description: str = Field("", description="one line on what this configuration is (adjcap config --list)")
    seed: int = Field(42, description="seeds the heads' fit, the held-out split of rerank.select and the demo world")
    device: str = Field(
        "auto", description="where the frozen models run: auto (a GPU when there is one), cpu, cuda, cuda:N"
    )
    benchmark: str = Field("coco", description="the benchmark to run: a name in `benchmarks`")
    splits: list[str] = Field(default_factory=lambda: ["val", "test"], description="the benchmark's splits to compute")
    limit: int | None = Field(None, gt=0, description="only the first N images of each split")
    sample: int | None = Field(None, gt=0, description="a seeded sample of N images of each split (by `seed` and "
                               "the split; after `limit`): the LVLM CHAIR protocol's 500 images")
    precision: Precision | None = Field(
        None, description="one switch for the frozen judges' encoders (retrieval, output scorer, CLIPScore) and "
        "the verifier; None = each section's own (fp32, the paper's). bf16 = speed mode. The captioner keeps "
        "its own (captioner.clip.precision, captioner.precision): bf16 there moves the beams"
    )
    tf32: bool = Field(
        False, description="TF32 tensor cores for the fp32 matmuls on a CUDA GPU (torch's float32 matmul "
        "precision 'high'): GPT-2, the log-probs and every fp32 model; false = exact fp32 (the paper presets'); "
        "no effect on a CPU"
    )
    numerics: Literal["fast", "portable"] = Field(
        "fast", description="fast: this machine's best kernels, whole batches. portable: the same bits on every "
        "x86-64 CPU (one kernel level, one thread, one image at a time; slower; the demo's). See adjcap.machine.numerics"
    )
    executor: Literal["ray", "local"] = Field(
        "ray", description="what runs the stages: ray (Ray Data pools on the embedded local Ray or ray.address) or "
        "local (this process, no Ray: one machine, a notebook; the same stage functions, the same outputs; not "
        "with a family that runs in an environment of its own, such as verifier.backend=lavis)"
    )
    paths: PathsCfg = Field(default_factory=PathsCfg)
    retrieval: RetrievalCfg = Field(default_factory=RetrievalCfg)
    verifier: VerifierCfg = Field(default_factory=VerifierCfg)
    captioner: CaptionerCfg = Field(default_factory=CaptionerCfg)
    scorer: ScorerCfg = Field(default_factory=ScorerCfg)
    rerank: RerankCfg = Field(default_factory=RerankCfg)
    benchmarks: dict[str, BenchmarkCfg] = Field(default_factory=lambda: default_benchmarks())
    ray: RayCfg = Field(default_factory=RayCfg)
    eval: EvalCfg = Field(default_factory=EvalCfg)
    cache: CacheCfg = Field(default_factory=CacheCfg)

    @field_validator("splits")
    @classmethod
    def _splits_nonempty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one split is needed")
        return v

    # ---- helpers -------------------------------------------------------------------------
    def resolved(self) -> "Config":
        """A copy with ``{cache}``, ``{data}`` and a leading ``~`` expanded in every string, once, at
        the edge; everything below takes typed sections whose paths are ready to open. The saved
        ``config.toml`` keeps the placeholders (write the unresolved config)."""
        cache = os.path.expanduser(self.paths.cache_dir)
        data = os.path.expanduser(self.paths.data_dir)

        def expand(v: Any) -> Any:
            if isinstance(v, str):
                out = v.replace("{cache}", cache).replace("{data}", data)
                return os.path.expanduser(out) if out.startswith("~") else out
            if isinstance(v, dict):
                return {k: expand(x) for k, x in v.items()}
            if isinstance(v, list):
                return [expand(x) for x in v]
            return v

        data = expand(self.model_dump(mode="python"))
        name = self.retrieval.corpus
        if name is not None and data["benchmark"] in data["benchmarks"]:  # the benchmark searches that corpus
            from adjcap.data.corpora import get_corpus

            bench = data["benchmarks"][data["benchmark"]]
            bench["corpus"] = str(get_corpus(name).path(data["paths"]["data_dir"], data["paths"]["cache_dir"]))
            bench["corpus_format"] = "lines"
        if self.precision is not None:
            for dotted in ROOT_PRECISION_SECTIONS:
                section = data
                for part in dotted.split("."):
                    section = section[part] if section is not None else None
                if section is not None:
                    section["precision"] = self.precision
        return Config.model_validate(data)

    def scorer_encoder(self) -> EncoderCfg:
        """The output scorer's encoder (stage-4 cosine): ``scorer.encoder`` or the retrieval encoder."""
        return self.scorer.encoder or self.retrieval.encoder

    def benchmark_cfg(self, name: str | None = None) -> BenchmarkCfg:
        name = name or self.benchmark
        if name not in self.benchmarks:
            raise ConfigError(
                f"{unknown('benchmark', name, sorted(self.benchmarks))}; "
                f"add one with --set benchmarks.{name}.format=... (see README)"
            )
        return self.benchmarks[name]

    def to_toml(self) -> str:
        import tomli_w  # only where configs are written (not needed in the LAVIS pools' environment)

        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))


def default_benchmarks() -> dict[str, BenchmarkCfg]:
    """The built-in benchmark table (``adjcap/benchmarks.toml``)."""
    data = tomllib.loads((resources.files("adjcap") / "benchmarks.toml").read_text(encoding="utf-8"))
    return {name: BenchmarkCfg.model_validate(b) for name, b in data.items()}


# --------------------------------------------------------------------------------------------
# The schema's shape: which fields are sections and tables of sections
# --------------------------------------------------------------------------------------------


def section_model(annotation: Any) -> Any:
    """The model a field holds (a section), "dict" for a table of sections, None for a plain value."""
    import typing

    origin = typing.get_origin(annotation)
    if origin is dict:
        return "dict"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


# the tables of sections by name: field -> (the model of each entry, the name's placeholder in key lists)
DICT_SECTIONS: dict[str, tuple[Any, str]] = {"benchmarks": (BenchmarkCfg, "<name>"), "pool": (PoolCfg, "<pool>")}


def dict_entry_model(field: str) -> Any:
    """The model of each entry of a table of sections (``benchmarks``, ``ray.pool``), None for another field."""
    return DICT_SECTIONS[field][0] if field in DICT_SECTIONS else None
