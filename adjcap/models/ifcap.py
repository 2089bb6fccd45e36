"""IFCap captioner, re-implemented from the IFCap paper and code: mapping network (projector + fusion module),
GPT-2 with a soft + hard prompt, and the strict loader of the released checkpoints.

Module tree (fixes the state-dict keys, spec 2.3)::

    ClipCaptionModel
      gpt              transformers GPT2LMHeadModel
      mapping_network  MappingNetwork
        prefix_const   (prefix_length, d)
        linear         Linear clip_dim -> clip_project_length * d
        rt_linear      Linear clip_dim -> d
        transformer    Transformer(layers = num_layers x TBlock)      self-attention
        crossatt       FusionModule(transformer = Transformer(1 x TBlock))  cross-attention

The released checkpoints (IFCap GitHub release v1.0, ``checkpoints.zip``;
``checkpoints/<EXP_NAME>/<CKPT_NAME>-00<n>.pt``, e.g. ``checkpoints/train_coco/coco-indomain-004.pt``)
are a plain ``torch.save`` of ``ClipCaptionModel.state_dict()`` written with transformers 4.19, which
still stored the two GPT-2 attention mask buffers per layer. :func:`load_ifcap` drops exactly those
(``gpt.transformer.h.<i>.attn.bias`` / ``.attn.masked_bias``), then loads everything else strictly.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from adjcap.config import CaptionerCfg
from adjcap.models.decoding import Candidate, beam_step, decode_prompts
from adjcap.models.entities import hard_prompt
from adjcap.models.gpt2_tokenizer import load_gpt2_tokenizer, stop_token_ids
from adjcap.models.precision import pick_device
from adjcap.models.sources import existing_file

__all__ = [
    "CheckpointMismatchError",
    "ClipCaptionModel",
    "IFCapCaptioner",
    "MappingDims",
    "MappingNetwork",
    "TBlock",
    "Transformer",
    "check_state_dict",
    "drop_gpt2_mask_buffers",
    "gpt2_config",
    "infer_mapping_dims",
    "load_ifcap",
    "load_ifcap_from_config",
    "prepare_state_dict",
]

RELEASE_HINT = (
    "Get the released IFCap checkpoints from the GitHub release v1.0 of boreng0817/IFCap "
    "(asset checkpoints.zip; unzip it and use checkpoints/<EXP_NAME>/<CKPT_NAME>-00<n>.pt, e.g. "
    "checkpoints/train_coco/coco-indomain-004.pt), and set captioner.checkpoint to it."
)

# --------------------------------------------------------------------------------------------
# Mapping network (spec 1.2-1.3)
# --------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Separate query and key/value inputs; no bias on the q and kv projections; K = first half of
    ``to_keys_values`` output rows, V = second half; heads are contiguous slices."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"mapping-network width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.to_queries = nn.Linear(dim, dim, bias=False)
        self.to_keys_values = nn.Linear(dim, 2 * dim, bias=False)
        self.project = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        m = kv.shape[1]
        h = self.num_heads
        q = self.to_queries(x).reshape(b, n, h, c // h)
        keys_values = self.to_keys_values(kv).reshape(b, m, 2, h, c // h)
        k, v = keys_values[:, :, 0], keys_values[:, :, 1]
        att = torch.einsum("bnhd,bmhd->bnmh", q, k) * self.scale
        att = att.softmax(dim=2)
        out = torch.einsum("bnmh,bmhd->bnhd", att, v).reshape(b, n, c)
        return self.project(out)


class MlpTransformer(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TBlock(nn.Module):
    """Pre-LN block; a given ``kv`` is used as is (no LayerNorm on it), else K/V = norm1(q)."""

    def __init__(self, dim: int, num_heads: int, mlp_hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = MultiHeadAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MlpTransformer(dim, mlp_hidden)

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h if kv is None else kv)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, dim: int, num_heads: int, num_layers: int, mlp_hidden: int):
        super().__init__()
        self.layers = nn.ModuleList([TBlock(dim, num_heads, mlp_hidden) for _ in range(num_layers)])

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, kv)
        return x


class FusionModule(nn.Module):
    """The cross-attention "Fusion Module": image tokens attend over retrieved-caption tokens."""

    def __init__(self, dim: int, num_heads: int, num_layers: int, mlp_hidden: int):
        super().__init__()
        self.transformer = Transformer(dim, num_heads, num_layers, mlp_hidden)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.transformer(x, r)


@dataclass(frozen=True)
class MappingDims:
    clip_dim: int = 512
    d_model: int = 768
    clip_project_length: int = 10
    prefix_length: int = 10
    num_layers: int = 8
    cross_layers: int = 1
    mlp_hidden: int = 1536


class MappingNetwork(nn.Module):
    """x (B, clip_dim) L2-normalised image embedding, r (B, k, clip_dim) raw retrieved-caption
    embeddings -> soft prompt (B, prefix_length, d_model): the outputs at the prefix_const slots."""

    def __init__(self, dims: MappingDims = MappingDims(), num_heads: int = 8):
        super().__init__()
        d = dims.d_model
        self.dims = dims
        self.prefix_const = nn.Parameter(torch.randn(dims.prefix_length, d))
        self.linear = nn.Linear(dims.clip_dim, dims.clip_project_length * d)
        self.rt_linear = nn.Linear(dims.clip_dim, d)
        self.transformer = Transformer(d, num_heads, dims.num_layers, dims.mlp_hidden)
        self.crossatt = FusionModule(d, num_heads, dims.cross_layers, dims.mlp_hidden)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        d = self.dims.d_model
        img = self.linear(x).view(b, self.dims.clip_project_length, d)
        ret = self.rt_linear(r)
        fused = self.crossatt(img, ret)
        z = torch.cat([fused, self.prefix_const.unsqueeze(0).expand(b, -1, -1)], dim=1)
        z = self.transformer(z)
        return z[:, self.dims.clip_project_length :]


class ClipCaptionModel(nn.Module):
    """The official wrapper: children ``gpt`` then ``mapping_network`` (fixes the key prefixes)."""

    def __init__(self, gpt_cfg, dims: MappingDims, mapping_heads: int = 8):
        super().__init__()
        from transformers import GPT2LMHeadModel

        if gpt_cfg.n_embd != dims.d_model:
            raise ValueError(
                f"GPT-2 width n_embd={gpt_cfg.n_embd} differs from the mapping network width {dims.d_model}"
            )
        self.gpt = GPT2LMHeadModel(gpt_cfg)
        self.mapping_network = MappingNetwork(dims, mapping_heads)


# --------------------------------------------------------------------------------------------
# GPT-2 configuration
# --------------------------------------------------------------------------------------------

GPT2_SMALL = dict(
    vocab_size=50257,
    n_positions=1024,
    n_embd=768,
    n_layer=12,
    n_head=12,
    activation_function="gelu_new",
    layer_norm_epsilon=1e-5,
    bos_token_id=50256,
    eos_token_id=50256,
    tie_word_embeddings=True,
)


def gpt2_config(lm_config: str | os.PathLike = "gpt2"):
    """``"gpt2"``: the built-in GPT-2 small configuration (no download). Otherwise a directory
    holding a GPT-2 ``config.json`` (or the path of that file)."""
    from transformers import GPT2Config

    if str(lm_config) == "gpt2":
        return GPT2Config(**GPT2_SMALL)
    p = Path(os.path.expanduser(str(lm_config)))
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise FileNotFoundError(
            f"GPT-2 config {f} does not exist: set captioner.lm_config to 'gpt2' (GPT-2 small, built in) "
            "or to a directory holding the config.json of the language model"
        )
    try:
        data = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: not valid JSON: {e}") from e
    if data.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"{f}: model_type is {data.get('model_type')!r}; IFCap uses a GPT-2 language model")
    return GPT2Config(**{k: v for k, v in data.items() if k not in ("architectures", "transformers_version")})


# --------------------------------------------------------------------------------------------
# State-dict handling (spec 2.3-2.4)
# --------------------------------------------------------------------------------------------

_MASK_KEY = re.compile(r"^gpt\.transformer\.h\.(\d+)\.attn\.(bias|masked_bias)$")


class CheckpointMismatchError(ValueError):
    """The checkpoint's keys or shapes do not match the IFCap architecture."""


def drop_gpt2_mask_buffers(sd: Mapping[str, torch.Tensor], n_layer: int) -> tuple[dict, list[str]]:
    """Remove exactly the GPT-2 mask buffers ``gpt.transformer.h.<i>.attn.bias`` and
    ``.attn.masked_bias`` for i < n_layer (never ``c_attn.bias``). Returns (rest, dropped keys)."""
    kept, dropped = {}, []
    for k, v in sd.items():
        m = _MASK_KEY.match(k)
        if m and int(m.group(1)) < n_layer:
            dropped.append(k)
        else:
            kept[k] = v
    return kept, dropped


def check_state_dict(sd: Mapping[str, torch.Tensor], expected: Mapping[str, Sequence[int]], source: str = "") -> None:
    """Strict check: same key set, same shapes. Raises :class:`CheckpointMismatchError` listing
    missing keys, unexpected keys and shape mismatches. Works on meta tensors (no allocation)."""
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    shapes = [
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(expected[k])}"
        for k in expected
        if k in sd and tuple(sd[k].shape) != tuple(expected[k])
    ]
    if missing or unexpected or shapes:
        parts = []

        def listing(title: str, items: list[str]) -> None:
            if items:
                more = f" ... and {len(items) - 20} more" if len(items) > 20 else ""
                parts.append(f"{title} ({len(items)}): " + "; ".join(items[:20]) + more)

        listing("missing keys", missing)
        listing("unexpected keys", unexpected)
        listing("shape mismatches", shapes)
        where = f"{source}: " if source else ""
        raise CheckpointMismatchError(
            f"{where}checkpoint does not match the IFCap architecture (GPT-2 config / mapping_heads / "
            "inferred mapping-net dims):\n  " + "\n  ".join(parts)
        )


def prepare_state_dict(
    sd: Mapping[str, torch.Tensor], model: ClipCaptionModel, source: str = ""
) -> dict[str, torch.Tensor]:
    """The loader's key handling: drop the 24 (2 per layer) GPT-2 mask buffers, add
    ``gpt.lm_head.weight`` = wte when absent (tied), then check strictly against ``model``'s
    state dict (which may live on the meta device)."""
    n_layer = model.gpt.config.n_layer
    out, _ = drop_gpt2_mask_buffers(sd, n_layer)
    if "gpt.lm_head.weight" not in out and "gpt.transformer.wte.weight" in out:
        out["gpt.lm_head.weight"] = out["gpt.transformer.wte.weight"]
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    check_state_dict(out, expected, source)
    return out


def infer_mapping_dims(sd: Mapping[str, torch.Tensor], source: str = "") -> MappingDims:
    """Mapping-network sizes from the state-dict shapes (clip dim, widths, prefix lengths, layers)."""
    where = f"{source}: " if source else ""
    need = [
        "mapping_network.linear.weight",
        "mapping_network.rt_linear.weight",
        "mapping_network.prefix_const",
        "mapping_network.transformer.layers.0.mlp.fc1.weight",
    ]
    absent = [k for k in need if k not in sd]
    if absent:
        raise CheckpointMismatchError(
            f"{where}not an IFCap ClipCaptionModel state dict: missing {', '.join(absent)} "
            f"(it has {len(sd)} keys, e.g. {', '.join(list(sd)[:3])})"
        )
    lin = sd["mapping_network.linear.weight"]
    d = int(sd["mapping_network.rt_linear.weight"].shape[0])
    if lin.shape[0] % d:
        raise CheckpointMismatchError(
            f"{where}mapping_network.linear.weight {tuple(lin.shape)} is not a multiple of width {d}"
        )

    def count(prefix: str) -> int:
        idx = {int(m.group(1)) for k in sd if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
        return max(idx) + 1 if idx else 0

    return MappingDims(
        clip_dim=int(lin.shape[1]),
        d_model=d,
        clip_project_length=int(lin.shape[0]) // d,
        prefix_length=int(sd["mapping_network.prefix_const"].shape[0]),
        num_layers=count("mapping_network.transformer.layers."),
        cross_layers=count("mapping_network.crossatt.transformer.layers."),
        mlp_hidden=int(sd["mapping_network.transformer.layers.0.mlp.fc1.weight"].shape[0]),
    )


# --------------------------------------------------------------------------------------------
# Captioner
# --------------------------------------------------------------------------------------------

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _resolve_dtype(precision: str, device: torch.device) -> torch.dtype:
    if precision == "auto":
        # IFCap decodes in fp32 (spec 1.5); beams are sensitive to precision, so auto keeps fp32.
        return torch.float32
    if precision not in _DTYPES:
        raise ValueError(f"precision must be one of auto, fp32, fp16, bf16; got {precision!r}")
    if device.type == "cpu" and precision == "fp16":
        raise ValueError("precision fp16 is not supported on CPU; use fp32 or bf16")
    return _DTYPES[precision]


class IFCapCaptioner:
    """A loaded IFCap model + tokenizer with the inference entry points.

    Inputs follow spec 2.5: ``image_feats`` are the captioner CLIP's image embeddings (L2-normalised
    inside :meth:`soft_prompt`, so raw or normalised both work); ``retrieved_feats`` are the raw,
    **unnormalised** CLIP text embeddings of the k retrieved captions.
    """

    def __init__(self, model: ClipCaptionModel, tokenizer, *, device: torch.device | str = "cpu", compile: str = "off",
                 compile_cache: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        # the fast beam search's GPT-2 step: eager, or compiled once per process (captioner.compile)
        self.step = beam_step(compile, self.device, compile_cache)
        self.stop_ids = stop_token_ids(tokenizer)
        if len(tokenizer) > model.gpt.config.vocab_size:
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but the language model only {model.gpt.config.vocab_size}"
            )

    # ---- properties --------------------------------------------------------------------------
    @property
    def gpt(self):
        return self.model.gpt

    @property
    def mapping_network(self) -> MappingNetwork:
        return self.model.mapping_network

    @property
    def dims(self) -> MappingDims:
        return self.model.mapping_network.dims

    @property
    def dtype(self) -> torch.dtype:
        return self.model.gpt.transformer.wte.weight.dtype

    # ---- prompts ----------------------------------------------------------------------------
    @torch.no_grad()
    def soft_prompt(
        self, image_feats: torch.Tensor, retrieved_feats: torch.Tensor, normalize: bool = True
    ) -> torch.Tensor:
        """[B, C] image embeddings (L2-normalised here unless ``normalize=False``) and [B, k, C] raw
        retrieved-caption embeddings -> soft prompt [B, prefix_length, D] in the LM dtype."""
        x = torch.as_tensor(image_feats, device=self.device).float()
        r = torch.as_tensor(retrieved_feats, device=self.device).float()
        if x.dim() == 1:
            x = x[None]
        if r.dim() == 2:
            r = r[None]
        c = self.dims.clip_dim
        if x.dim() != 2 or x.shape[1] != c:
            raise ValueError(f"image_feats must be [B, {c}], got {tuple(x.shape)}")
        if r.dim() != 3 or r.shape[0] != x.shape[0] or r.shape[2] != c or r.shape[1] < 1:
            raise ValueError(f"retrieved_feats must be [B={x.shape[0]}, k>=1, {c}], got {tuple(r.shape)}")
        if normalize:
            x = x / x.norm(dim=-1, keepdim=True)
        mp = self.model.mapping_network
        w = mp.linear.weight.dtype
        return mp(x.to(w), r.to(w)).to(self.dtype)

    def hard_prompt_ids(self, entities: Sequence[str]) -> list[int]:
        return self.tokenizer.encode(hard_prompt(list(entities)), add_special_tokens=False)

    @torch.no_grad()
    def prompt_embeddings(self, soft: torch.Tensor, entities_list: Sequence[Sequence[str]]) -> list[torch.Tensor]:
        """[S ; H] per image: the soft prompt then the GPT-2 token embeddings of the hard prompt."""
        if len(entities_list) != soft.shape[0]:
            raise ValueError(f"{soft.shape[0]} soft prompts but {len(entities_list)} entity lists")
        wte = self.gpt.transformer.wte
        out = []
        for s, ents in zip(soft, entities_list):
            ids = torch.tensor(self.hard_prompt_ids(ents), dtype=torch.long, device=self.device)
            out.append(torch.cat([s.to(self.dtype), wte(ids)], dim=0))
        return out

    # ---- decoding ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        image_feats: torch.Tensor,
        retrieved_feats: torch.Tensor | Sequence[torch.Tensor],
        entities_list: Sequence[Sequence[str]],
        *,
        decoder: str = "beam",
        beam_width: int = 20,
        max_len: int = 64,
        search: str = "fast",
        batch_size: int | None = None,
        rows: int | None = None,
        temperature: float = 1.0,
        negative_retrieved_feats: torch.Tensor | Sequence[torch.Tensor] | None = None,
        contrastive_lambda: float = 0.0,
    ) -> list[list[Candidate]]:
        """Captions for B images: one list of :class:`~adjcap.models.decoding.Candidate` per image, sorted
        by mean log-prob (incl. the stop token) descending; ``beam_width`` candidates for the beam
        decoder, one for greedy. ``search="reference"`` runs IFCap's own procedure image by image;
        ``"fast"`` the batched KV-cached search that returns the same beams.
        ``retrieved_feats`` may be a list of [k_i, C] tensors when k differs between images.

        Contrastive decoding (a negative result kept as an option, off by default): with
        ``negative_retrieved_feats`` (e.g. the verifier's bottom-4 captions' raw CLIP embeddings) and
        ``contrastive_lambda`` > 0, a negative prompt [S_neg ; H] is built from the same image and
        entities and the beam ranks (1+lambda) l_pos - lambda l_neg per token; the candidates' scores
        are then of that contrastive quantity."""
        x = torch.as_tensor(image_feats)
        if x.dim() == 1:
            x = x[None]
        prompts = self.prompt_embeddings(self._soft(x, retrieved_feats), entities_list)
        neg = None
        if negative_retrieved_feats is not None and contrastive_lambda != 0.0:
            neg = self.prompt_embeddings(self._soft(x, negative_retrieved_feats), entities_list)
        return decode_prompts(
            self.gpt,
            self.tokenizer,
            prompts,
            decoder=decoder,
            search=search,
            beam_width=beam_width,
            max_len=max_len,
            stop_ids=self.stop_ids,
            batch_size=batch_size,
            rows=rows,
            temperature=temperature,
            neg_prompts=neg,
            contrastive_lambda=contrastive_lambda,
            step=self.step,
        )

    def _soft(self, x: torch.Tensor, retrieved_feats) -> torch.Tensor:
        if isinstance(retrieved_feats, torch.Tensor) and retrieved_feats.dim() == 3:
            return self.soft_prompt(x, retrieved_feats)
        if len(retrieved_feats) != x.shape[0]:
            raise ValueError(f"{x.shape[0]} images but {len(retrieved_feats)} retrieved-feature sets")
        # one mapping-network call per distinct k (usually one for the whole batch), not per image
        feats = [torch.as_tensor(r) for r in retrieved_feats]
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(feats):
            groups.setdefault(tuple(r.shape), []).append(i)
        out: list[torch.Tensor | None] = [None] * len(feats)
        for idx in groups.values():
            sel = torch.tensor(idx)
            soft = self.soft_prompt(x[sel], torch.stack([feats[i] for i in idx]))
            for j, i in enumerate(idx):
                out[i] = soft[j : j + 1]
        return torch.cat(out)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Loader
# --------------------------------------------------------------------------------------------


def load_ifcap(
    checkpoint: str | os.PathLike,
    *,
    lm_config: str | os.PathLike = "gpt2",
    tokenizer: str | os.PathLike = "gpt2",
    device: str | torch.device = "auto",
    mapping_heads: int = 8,
    precision: str = "fp32",
    compile: str = "off",
    compile_cache: str | None = None,
) -> IFCapCaptioner:
    """Load an IFCap checkpoint (a plain state dict, as released) strictly.

    ``lm_config``: "gpt2" (built-in GPT-2 small config) or a directory with config.json.
    ``tokenizer``: HF id ("gpt2") or a local tokenizer directory. ``mapping_heads`` is not stored in
    the file (8 for the released models). Mapping-network sizes are inferred from the shapes.
    ``compile``: ``captioner.compile`` (:func:`adjcap.models.decoding.beam_step`), its artifacts under ``compile_cache``.
    """
    path = existing_file(checkpoint, "IFCap checkpoint", RELEASE_HINT)
    try:
        sd = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - unpickling errors come in many types
        raise CheckpointMismatchError(
            f"{path}: could not read it as a weights-only torch state dict ({e}). {RELEASE_HINT}"
        ) from e
    if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
        raise CheckpointMismatchError(
            f"{path}: holds a wrapper dict with 'state_dict'; IFCap checkpoints are a plain state dict"
        )
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointMismatchError(f"{path}: not a plain state dict of tensors. {RELEASE_HINT}")
    cfg = gpt2_config(lm_config)
    dims = infer_mapping_dims(sd, str(path))
    with torch.device("meta"):
        model = ClipCaptionModel(cfg, dims, mapping_heads)
    sd = prepare_state_dict(sd, model, str(path))
    tied = torch.equal(sd["gpt.lm_head.weight"], sd["gpt.transformer.wte.weight"])
    model.load_state_dict(sd, strict=True, assign=True)
    if tied:
        model.gpt.lm_head.weight = model.gpt.transformer.wte.weight
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:
        raise CheckpointMismatchError(f"{path}: tensors not loaded: {', '.join(leftover)}")
    dev = pick_device(device)
    dtype = _resolve_dtype(precision, dev)
    model = model.to(device=dev, dtype=dtype).eval()
    tok = load_gpt2_tokenizer(tokenizer)
    return IFCapCaptioner(model, tok, device=dev, compile=compile, compile_cache=compile_cache)


def load_ifcap_from_config(cfg: CaptionerCfg, *, device: str | torch.device = "auto") -> IFCapCaptioner:
    """Load from a resolved ``CaptionerCfg`` (checkpoint, lm_config, tokenizer, heads, precision, compile)."""
    return load_ifcap(cfg.checkpoint, lm_config=cfg.lm_config, tokenizer=cfg.tokenizer, device=device,
                      mapping_heads=cfg.mapping_heads, precision=cfg.precision, compile=cfg.compile,
                      compile_cache=cfg.compile_cache)
