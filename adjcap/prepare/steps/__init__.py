"""The steps of `adjcap prepare`, by name, in the order they run (ifcap first: coco and flickr30k read
their image lists from its annotations)."""

from __future__ import annotations

from adjcap.prepare.steps.base import Context, Options, Planned, Step
from adjcap.prepare.steps.corpora import CC3M, LAION_COCO
from adjcap.prepare.steps.ifcap import STEP as IFCAP
from adjcap.prepare.steps.images import COCO, FLICKR30K, NOCAPS
from adjcap.prepare.steps.instances import STEP as COCO_INSTANCES
from adjcap.prepare.steps.models import STEP as MODELS
from adjcap.prepare.steps.tools import NLTK, SPICE

STEPS: dict[str, Step] = {s.name: s for s in (IFCAP, COCO, FLICKR30K, NOCAPS, MODELS, NLTK, SPICE, COCO_INSTANCES,
                                              CC3M, LAION_COCO)}
# `all`: everything the paper's tables need that can be fetched without help (flickr30k needs --from DIR;
# coco-instances, 250 MB, only the original CHAIR: eval.chair = instances | both; the other caption corpora,
# corpus-cc3m and corpus-laion-coco, only `reproduce corpus-swap`: --for corpus-swap)
ALL = ("ifcap", "coco", "nocaps", "models", "nltk", "spice")

__all__ = ["ALL", "STEPS", "Context", "Options", "Planned", "Step"]
