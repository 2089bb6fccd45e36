"""The tiny-world trainings' sizes and schedules, apart from the trainers: reading them (the world's
fingerprint, :func:`adjcap.demo.tiny.tiny_world_ready`) imports neither torch's model families nor
the trainers."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TinyTrainSettings:
    """Sizes and schedules of the tiny-world trainings (defaults: the demo's; tests shrink them).

    The judges (retrieval CLIP, BLIP ITM) see paired images; IFCap sees text only. Every model trains
    on the same rendered pool of ``pool_images`` scenes."""

    pool_images: int = 5000
    clip_steps: int = 500
    clip_batch: int = 64
    clip_lr: float = 5e-3
    retrieval_clip_steps: int = 2000
    retrieval_clip_lr: float = 5e-3
    blip_steps: int = 1000
    blip_batch: int = 64
    blip_lr: float = 5e-3
    blip_image_size: int = 64
    blip_swap_fraction: float = 0.4
    blip_count_fraction: float = 0.15
    blip_insert_fraction: float = 0.2
    blip_hard_fraction: float = 0.15
    ifcap_steps: int = 700
    ifcap_batch: int = 64
    ifcap_lr: float = 5e-3
    threads: int = 1

    def scaled(self, factor: float, pool_images: int | None = None) -> TinyTrainSettings:
        """The same settings with every step count multiplied by ``factor`` (at least 1 step; a
        zero stays zero)."""
        steps = {k: (max(1, int(round(getattr(self, k) * factor))) if getattr(self, k) else 0)
                 for k in ("clip_steps", "retrieval_clip_steps", "blip_steps", "ifcap_steps")}
        if pool_images is not None:
            steps["pool_images"] = int(pool_images)
        return replace(self, **steps)
