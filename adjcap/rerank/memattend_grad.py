"""MemAttend's training step written out: listwise loss and its parameter gradients for one chunk of
images, computed with an explicit backward pass instead of autograd.

Same function and same gradients as ``listwise_loss(MemAttend(...)(...))`` + ``backward()`` (tests
compare both to float tolerance); it exists because fitting is the CPU-bound part of the reranker:
200 full passes over 5,000 images x 25 tokens. Written out, one chunk needs fewer and larger
kernels than autograd's graph: no autograd bookkeeping, the attention scale folded into the query
projection, one fused projection per layer, and the attention core either in the fused C kernel
of :mod:`adjcap.rerank.native` (one pass per image and head) or, where that is not available, in
torch ops laid out for these shapes (transposed products with 25-wide rows, softmax along the key
axis). Chunks are independent: fitting runs them on worker threads and sums their gradients in a
fixed order, which keeps it bit-for-bit deterministic whatever the thread count.

Shapes: B images, M memory + N beam = T tokens, d = d_model, H heads of e = d / H; the last layer
computes queries (and FFN, norms) for the N beam tokens only, as ``MemAttend.forward`` does.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from adjcap.rerank import native
from adjcap.rerank.heads import MemAttend

aten = torch.ops.aten


def _split_heads(x: torch.Tensor, b: int, t: int, h: int, e: int) -> torch.Tensor:
    """[B*t, h*e] (any row stride) -> contiguous [B*h, t, e]."""
    return x.reshape(b, t, h, e).permute(0, 2, 1, 3).reshape(b * h, t, e)


class _Layer:
    """Weights of one post-norm encoder layer, with the attention scale folded into W_q."""

    def __init__(self, layer: torch.nn.TransformerEncoderLayer):
        attn = layer.self_attn
        d = attn.embed_dim
        self.h = attn.num_heads
        self.e = d // self.h
        self.scale = self.e**-0.5
        w, wb = attn.in_proj_weight.detach(), attn.in_proj_bias.detach()
        sc = torch.ones(3 * d, dtype=w.dtype)
        sc[:d] = self.scale
        self.w_qkv, self.b_qkv = w * sc[:, None], wb * sc
        self.w_o, self.b_o = attn.out_proj.weight.detach(), attn.out_proj.bias.detach()
        self.w1, self.b1 = layer.linear1.weight.detach(), layer.linear1.bias.detach()
        self.ffn = self.w1.shape[0]
        self.w2, self.b2 = layer.linear2.weight.detach(), layer.linear2.bias.detach()
        self.g1, self.be1, self.eps1 = layer.norm1.weight.detach(), layer.norm1.bias.detach(), layer.norm1.eps
        self.g2, self.be2, self.eps2 = layer.norm2.weight.detach(), layer.norm2.bias.detach(), layer.norm2.eps
        self.d = d
        self.sc = sc

    def forward(
        self, x: torch.Tensor, b: int, t: int, q0: int, mask: torch.Tensor | None, fused: bool,
        qkv: torch.Tensor | None = None,
    ):
        """x [B*t, d] -> (y [B*tq, d], saved). Queries are tokens q0..t-1 of each image. ``mask``
        (None: every token may be attended to) comes in the form the attention path reads, made
        once per chunk by :meth:`MemAttendStep.__call__`: uint8 [B, t] keep flags for the fused C
        kernel of :mod:`adjcap.rerank.native` (``fused``), an additive [B, 1, t, 1] bias (-inf on
        tokens not to attend to) for torch ops. With q0 = 0 the caller may pass the (scaled)
        projection ``qkv`` [B*t, 3d] already computed."""
        d, h, e = self.d, self.h, self.e
        tq = t - q0
        if q0 == 0:
            xq = x
            if qkv is None:
                qkv = torch.addmm(self.b_qkv, x, self.w_qkv.t())  # [B*t, 3d]
            q, k, v = qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]
        else:
            xq = x.view(b, t, d)[:, q0:].reshape(b * tq, d)
            q = torch.addmm(self.b_qkv[:d], xq, self.w_qkv[:d].t())  # [B*tq, d]
            kv = torch.addmm(self.b_qkv[d:], x, self.w_qkv[d:].t())  # [B*t, 2d]
            k, v = kv[:, :d], kv[:, d:]
        if fused:
            o, att = native.attention_forward(b, t, tq, h, q, k, v, mask)
        else:
            o, att = _attention_torch(q, k, v, mask, b, t, tq, h, e)
        r1 = torch.addmm(self.b_o, o, self.w_o.t()).add_(xq)
        y1, m1, s1 = aten.native_layer_norm(r1, [d], self.g1, self.be1, self.eps1)
        if fused and self.ffn % 8 == 0:
            z, g = native.gelu_bias_forward(y1.mm(self.w1.t()), self.b1)
        else:
            z = torch.addmm(self.b1, y1, self.w1.t())
            g = F.gelu(z)
        r2 = torch.addmm(self.b2, g, self.w2.t()).add_(y1)
        y, m2, s2 = aten.native_layer_norm(r2, [d], self.g2, self.be2, self.eps2)
        return y, (x, xq, q, k, v, att, o, r1, m1, s1, y1, z, g, r2, m2, s2, fused)

    def backward(self, dy: torch.Tensor, saved, b: int, t: int, q0: int, split: bool = False):
        """dy [B*tq, d] -> (dx [B*t, d], grads in ``_LAYER_PARAMS`` order for this layer). With
        ``split`` (q0 = 0 only) dx comes back as its two terms (dr1, dqkv): the residual path and
        the projection's gradient (scaled space), for a caller that folded the input embedding
        into the projection and never needs dqkv W_qkv itself."""
        x, xq, q, k, v, att, o, r1, m1, s1, y1, z, g, r2, m2, s2, fused = saved
        d, h, e = self.d, self.h, self.e
        tq = t - q0
        dr2, dg2, dbe2 = aten.native_layer_norm_backward(dy, r2, [d], m2, s2, self.g2, self.be2, [True, True, True])
        dw2, db2 = _wgrad(dr2, g), dr2.sum(0)
        if fused and self.ffn % 8 == 0:
            dz = native.gelu_backward(dr2.mm(self.w2), z)
        else:
            dz = aten.gelu_backward(dr2.mm(self.w2), z)
        dw1, db1 = _wgrad(dz, y1), dz.sum(0)
        dy1 = torch.addmm(dr2, dz, self.w1)
        dr1, dg1, dbe1 = aten.native_layer_norm_backward(dy1, r1, [d], m1, s1, self.g1, self.be1, [True, True, True])
        dwo, dbo = _wgrad(dr1, o), dr1.sum(0)
        do = dr1.mm(self.w_o)  # [B*tq, d]
        if q0 == 0:
            dqkv = torch.empty(b * t, 3 * d, dtype=do.dtype)
            dq, dk, dv = dqkv[:, :d], dqkv[:, d : 2 * d], dqkv[:, 2 * d :]
        else:
            dq = torch.empty(b * tq, d, dtype=do.dtype)
            dkv = torch.empty(b * t, 2 * d, dtype=do.dtype)
            dk, dv = dkv[:, :d], dkv[:, d:]
        if fused:
            native.attention_backward(b, t, tq, h, q, k, v, att, do, dq, dk, dv)
        else:
            _attention_torch_backward(att, do, dq, dk, dv, b, t, tq, h, e)
        if q0 == 0:
            dw_qkv, db_qkv = _wgrad(dqkv, x), dqkv.sum(0)
            dx = (dr1, dqkv) if split else torch.addmm(dr1, dqkv, self.w_qkv)
        else:
            dwq, dbq = _wgrad(dq, xq), dq.sum(0)
            dwkv, dbkv = _wgrad(dkv, x), dkv.sum(0)
            dw_qkv, db_qkv = torch.cat([dwq, dwkv]), torch.cat([dbq, dbkv])
            dx = dkv.mm(self.w_qkv[d:])
            dxq = torch.addmm(dr1, dq, self.w_qkv[:d])
            dx.view(b, t, d)[:, q0:] += dxq.view(b, tq, d)
        # gradients w.r.t. the stored (unscaled) in_proj parameters
        dw_qkv = dw_qkv * self.sc[:, None]
        db_qkv = db_qkv * self.sc
        return dx, [dw_qkv, db_qkv, dwo, dbo, dw1, db1, dw2, db2, dg1, dbe1, dg2, dbe2]


def _wgrad(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dW = dy^T x for y = x W^T, computed as (x^T dy)^T: the same sums, and MKL is faster with the
    narrow operand on the left (several times so for the 5-wide input features)."""
    return x.t().mm(dy).t()


def _attention_torch(q, k, v, bias, b: int, t: int, tq: int, h: int, e: int):
    """softmax(q k^T + mask) v with torch ops: rows [B*tq, d] / [B*t, d] -> (o [B*tq, d], saved).
    The products are taken transposed where that gives 25-wide output rows (about twice as fast
    as 8-wide ones), and the softmax runs along the key axis of transposed scores."""
    qh, kh, vh = _split_heads(q, b, tq, h, e), _split_heads(k, b, t, h, e), _split_heads(v, b, t, h, e)
    st = torch.bmm(kh, qh.transpose(1, 2))  # [B*h, t, tq]: scores, keys along dim 1
    if bias is not None:
        st = (st.view(b, h, t, tq) + bias).view(b * h, t, tq)
    pt = torch.softmax(st, dim=1)
    ot = torch.bmm(vh.transpose(1, 2), pt)  # O^T [B*h, e, tq]
    o = ot.view(b, h, e, tq).permute(0, 3, 1, 2).reshape(b * tq, h * e)
    return o, (qh, kh, vh, pt)


def _attention_torch_backward(att, do, dq, dk, dv, b: int, t: int, tq: int, h: int, e: int) -> None:
    """Writes dq, dk, dv (row views) from do [B*tq, d] and the saved tensors of _attention_torch."""
    qh, kh, vh, pt = att
    dot = do.view(b, tq, h, e).permute(0, 2, 3, 1).reshape(b * h, e, tq)  # dO^T
    dpt = torch.bmm(vh, dot)  # [B*h, t, tq]
    dst = aten._softmax_backward_data(dpt, pt, 1, pt.dtype)
    dqt = torch.bmm(kh.transpose(1, 2), dst)  # dQ^T [B*h, e, tq]
    dkt = torch.bmm(qh.transpose(1, 2), dst.transpose(1, 2))  # dK^T [B*h, e, t]
    dvt = torch.bmm(dot, pt.transpose(1, 2))  # dV^T [B*h, e, t]
    dq.view(b, tq, h, e).copy_(dqt.view(b, h, e, tq).permute(0, 3, 1, 2))
    dk.view(b, t, h, e).copy_(dkt.view(b, h, e, t).permute(0, 3, 1, 2))
    dv.view(b, t, h, e).copy_(dvt.view(b, h, e, t).permute(0, 3, 1, 2))


# order of a layer's gradients as returned by _Layer.backward, as parameter-name suffixes
_LAYER_PARAMS = (
    "self_attn.in_proj_weight",
    "self_attn.in_proj_bias",
    "self_attn.out_proj.weight",
    "self_attn.out_proj.bias",
    "linear1.weight",
    "linear1.bias",
    "linear2.weight",
    "linear2.bias",
    "norm1.weight",
    "norm1.bias",
    "norm2.weight",
    "norm2.bias",
)


class MemAttendStep:
    """Loss and gradients of ``listwise_loss(head(beam, memory, masks), target, mask)`` for chunks
    of images, for the head's *current* weights (call :meth:`refresh` after each optimiser step).

    Gradients come back as one list aligned with ``list(head.parameters())``."""

    def __init__(self, head: MemAttend, fused: bool | None = None):
        """``fused``: use the C attention kernel (:mod:`adjcap.rerank.native`); None = when usable."""
        if not isinstance(head, MemAttend):
            raise TypeError(f"MemAttendStep needs a MemAttend head, got {type(head).__name__}")
        for layer in head.layers:
            if layer.norm_first or layer.activation_relu_or_gelu != 2 or layer.self_attn.dropout != 0.0:
                raise ValueError("MemAttendStep: only post-norm GELU layers without dropout are written out")
        self.head = head
        self.fused = fused
        if fused and not native.usable(head.d_model // head.n_heads, 1):
            raise RuntimeError(f"MemAttendStep(fused=True): the fused kernel is not usable: {native.why_not() or 'head width is not 8'}")
        self.names = [n for n, _ in head.named_parameters()]
        self.refresh()

    def refresh(self) -> None:
        """Re-read the head's weights (after an optimiser step)."""
        h = self.head
        self.w_in, self.b_in = h.w_in.weight.detach(), h.w_in.bias.detach()
        self.role = h.role.weight.detach()
        self.layers = [_Layer(layer) for layer in h.layers]
        self.w_out, self.b_out = h.head.weight.detach(), h.head.bias.detach()
        # the input embedding is affine, so the first layer's projection folds through it (a
        # K=5 product instead of K=32): qkv = f (W_qkv W_in)^T + W_qkv (b_in + role) + b_qkv
        self.tok_bias = self.b_in[None] + self.role  # [2, d]: memory, beam
        self.fold = len(self.layers) > 1
        if self.fold:
            l0 = self.layers[0]
            self.w_fold = l0.w_qkv.mm(self.w_in)  # [3d, f]
            self.b_fold = torch.addmm(l0.b_qkv, self.tok_bias, l0.w_qkv.t())  # [2, 3d]

    @torch.no_grad()
    def __call__(
        self,
        beam: torch.Tensor,
        memory: torch.Tensor,
        beam_mask: torch.Tensor,
        memory_mask: torch.Tensor,
        target: torch.Tensor,
        weight: float = 1.0,
    ) -> tuple[float, list[torch.Tensor]]:
        """One chunk -> (mean listwise loss over its images, gradients of ``weight * loss``)."""
        b, n, f = beam.shape
        m = memory.shape[1]
        t = m + n
        d = self.w_in.shape[0]
        beam_mask, memory_mask = beam_mask.to(torch.bool), memory_mask.to(torch.bool)
        feats = torch.cat([memory, beam], dim=1).reshape(b * t, f)
        x = feats.mm(self.w_in.t()).view(b, t, d)
        x[:, :m] += self.tok_bias[0]
        x[:, m:] += self.tok_bias[1]
        x = x.view(b * t, d)
        qkv0 = None
        if self.fold:
            qkv0 = feats.mm(self.w_fold.t()).view(b, t, -1)
            qkv0[:, :m] += self.b_fold[0]
            qkv0[:, m:] += self.b_fold[1]
            qkv0 = qkv0.view(b * t, -1)
        keep = torch.cat([memory_mask, beam_mask], dim=1)
        # an image with no token at all has no valid candidate either, so nothing flows back
        # from it; letting it attend to its (padding) tokens keeps its values finite
        keep[~keep.any(dim=1)] = True
        fused = self.fused
        if fused is None:
            fused = native.usable(d // self.layers[0].h, t) if self.layers else False
        mask = None  # the attention mask, once per chunk in the form the attention path reads
        if not bool(keep.all()):
            if fused:
                mask = keep.to(torch.uint8)
            else:
                mask = torch.zeros(keep.shape, dtype=x.dtype).masked_fill_(~keep, float("-inf")).view(b, 1, t, 1)
        saved = []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            q0 = m if i == last else 0
            x, s = layer.forward(x, b, t, q0, mask, fused, qkv0 if i == 0 else None)
            saved.append((s, q0))
        if not self.layers:
            x = x.view(b, t, d)[:, m:].reshape(b * n, d)
        logits = torch.addmm(self.b_out, x, self.w_out.t()).view(b, n)

        # listwise loss: mean over images with a valid candidate of -sum_y t_y log softmax_y
        neg = torch.finfo(logits.dtype).min
        lsm = torch.log_softmax(logits.masked_fill(~beam_mask, neg), dim=-1).masked_fill_(~beam_mask, 0.0)
        tgt = target.to(lsm.dtype)
        has = beam_mask.any(dim=-1)
        n_has = int(has.sum())
        if n_has == 0:
            return 0.0, [torch.zeros_like(p) for p in self.head.parameters()]
        per_image = -(tgt * lsm).sum(dim=-1)
        loss = float(per_image[has].sum()) / n_has
        # d loss / d logits = (softmax * sum(t) - t) on valid entries, / n_has, times weight
        p = lsm.exp().masked_fill_(~beam_mask, 0.0)
        dlogits = (p * tgt.sum(dim=-1, keepdim=True) - tgt).masked_fill_(~has[:, None], 0.0)
        dlogits.mul_(float(weight) / n_has)

        dflat = dlogits.reshape(b * n, 1)
        dw_out, db_out = dflat.t().mm(x), dflat.sum(0)
        dx = dflat.mm(self.w_out)  # [B*n, d]
        layer_grads: list[list[torch.Tensor]] = [[] for _ in self.layers]
        if not self.layers:
            full = torch.zeros(b, t, d, dtype=dx.dtype)
            full[:, m:] = dx.view(b, n, d)
            dx = full.view(b * t, d)
        for i in range(len(self.layers) - 1, -1, -1):
            s, q0 = saved[i]
            dx, layer_grads[i] = self.layers[i].backward(dx, s, b, t, q0, split=self.fold and i == 0)
        # x = f W_in^T + b_in + role[memory | beam]
        if self.fold:
            # dx = dr1 + dqkv W_qkv is never formed: W_qkv^T is applied to the small reductions
            dr1, dqkv = dx
            w_qkv = self.layers[0].w_qkv
            dw_in = torch.addmm(_wgrad(dr1, feats), w_qkv.t(), _wgrad(dqkv, feats))
            r1_tok, qkv_tok = dr1.view(b, t, d).sum(0), dqkv.view(b, t, -1).sum(0)
            drole = torch.stack([r1_tok[:m].sum(0), r1_tok[m:].sum(0)])
            drole += torch.stack([qkv_tok[:m].sum(0), qkv_tok[m:].sum(0)]).mm(w_qkv)
        else:
            dw_in = _wgrad(dx, feats)
            per_token = dx.view(b, t, d).sum(0)  # [t, d]
            drole = torch.stack([per_token[:m].sum(0), per_token[m:].sum(0)])
        db_in = drole.sum(0)

        grads: dict[str, torch.Tensor] = {
            "w_in.weight": dw_in,
            "w_in.bias": db_in,
            "role.weight": drole,
            "head.weight": dw_out,
            "head.bias": db_out,
        }
        for i, lg in enumerate(layer_grads):
            for suffix, g in zip(_LAYER_PARAMS, lg):
                grads[f"layers.{i}.{suffix}"] = g
        return loss, [grads[name] for name in self.names]
