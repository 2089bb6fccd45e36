"""The verifier families (``verifier.family``): one record each, the one list of them. Everything that
knows a family reads its record: the configuration (the family names, and the refusals of a setting
the family cannot run: :func:`refusal`), stage 2's identity (:func:`unread`), the memory plan
(``adjcap.models.budget.verifier_params``), the image preparation the decode tasks do
(``adjcap.models.roles.verifier_pixel_prep``), the loader (``adjcap.models.roles.load_verifier``) and
the environment a backend runs in when not the job's (:class:`Isolated`: the stage registry's verifier
family's ``env``).

* ``blip_itm``: BLIP's ITM head (:mod:`adjcap.models.blip`), also through salesforce-lavis's own
  code (``verifier.backend = "lavis"``, in an environment of its own);
* ``blip2_itm``: BLIP-2's Q-Former ITM head (:mod:`adjcap.models.blip2`);
* ``clip``: any open_clip dual encoder, SigLIP's among them (:mod:`adjcap.models.clip_verifier`).

The configuration sits below the models (tests/test_imports.py), so this module imports nothing but
the standard library: a record names its model-side functions as ``"module:function"`` (as a package's
entry points do) and the models layer resolves them (``pkgutil.resolve_name``, in ``adjcap.models``);
``tests/test_verifier_families.py`` checks each one resolves to a function under ``adjcap.models``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from adjcap.registry import lookup

@dataclass(frozen=True)
class Isolated:
    """A ``verifier.backend`` that runs a family's judge in an environment of its own (``lavis``): its
    ``load`` (``(cfg, *, device) -> judge``, run inside that environment) and ``env`` (``(cache_dir) ->``
    the Ray runtime environment its pools' workers start in), ``"module:function"`` each. Its pools run
    stage 2 and the verifier's part of stage 4 (the stage registry's verifier ``Family.parts``)."""

    load: str
    env: str


@dataclass(frozen=True)
class VerifierFamily:
    """One judge family. ``title``: what its errors call it; ``load``: ``(cfg, *, device) -> judge`` with
    the verifier interface of :class:`adjcap.models.blip.Verifier` (``encode_images``,
    ``memo_from_image_embeds``, ``score``); ``params``: ``(cfg) -> int``, its parameters without loading
    it (the memory plan); ``pixels``: ``(cfg) -> PixelPrep | None``, the image preparation its judge
    wants on the transformers backend, without loading it (None: not known before loading: the image's
    bytes travel); each a ``"module:function"`` under ``adjcap.models``.

    ``unread``: verifier keys left out of stage 2's identity for this family (BLIP ITM reads neither
    ``family`` nor ``pretrained``, so the runs from before there were families keep their identities);
    ``backends``: the ``verifier.backend`` values it runs on; ``needs``: (key, what to set) for keys it
    cannot run without; ``hub``: the prefix of its checkpoints' hub ids (a model of another family's
    prefix is refused); ``example``: a model of its own, for the refusal lines; ``isolated``: the backends
    it runs in an environment of their own (:class:`Isolated`), by name."""

    name: str
    title: str
    load: str
    params: str
    pixels: str
    unread: tuple[str, ...] = ()
    backends: tuple[str, ...] = ("transformers",)
    needs: tuple[tuple[str, str], ...] = ()
    hub: str = ""
    example: str = ""
    isolated: Mapping[str, Isolated] = field(default_factory=dict)


FAMILIES: dict[str, VerifierFamily] = {f.name: f for f in (
    VerifierFamily(
        "blip_itm", "BLIP ITM verifier",
        load="adjcap.models.blip:load_verifier_from_config", params="adjcap.models.budget:blip_itm_params",
        pixels="adjcap.models.blip:verifier_pixel_prep", unread=("family", "pretrained"),
        backends=("transformers", "lavis"), hub="Salesforce/blip-itm", example="Salesforce/blip-itm-large-coco",
        # salesforce-lavis's own BLIP ITM, in its environment (it cannot share this one: adjcap.models.lavis_env)
        isolated={"lavis": Isolated(load="adjcap.models.lavis_itm:load_from_config",
                                    env="adjcap.models.lavis_env:runtime_env")}),
    VerifierFamily(
        "blip2_itm", "BLIP-2 ITM verifier",
        load="adjcap.models.blip2:load_blip2_from_config", params="adjcap.models.budget:blip2_itm_params",
        pixels="adjcap.models.blip:verifier_pixel_prep", unread=("pretrained",),
        hub="Salesforce/blip2-itm", example="Salesforce/blip2-itm-vit-g"),
    VerifierFamily(
        "clip", "open_clip verifier",
        load="adjcap.models.clip_verifier:load_clip_verifier_from_config",
        params="adjcap.models.budget:encoder_params",  # verifier.model is the architecture, pretrained the weights
        pixels="adjcap.models.clip_verifier:verifier_pixel_prep",
        needs=(("pretrained", "an open_clip pretrained tag of verifier.model (e.g. webli), hf-hub:REPO or a local "
                              "checkpoint"),),
        example="ViT-SO400M-14-SigLIP-384"),
)}
NAMES = tuple(FAMILIES)


def family(name: str) -> VerifierFamily:
    return lookup(FAMILIES, name, "verifier family", ValueError)


def of(v: Any) -> VerifierFamily:
    """The record of a verifier section (a section without ``family`` is BLIP ITM's, as before families)."""
    return family(getattr(v, "family", "blip_itm"))


def isolated(v: Any) -> Isolated | None:
    """The section's backend when it runs in an environment of its own (None: in the job's)."""
    return of(v).isolated.get(v.backend) if v.enabled else None


def unread(v: Any) -> tuple[str, ...]:
    """The dotted verifier keys stage 2's identity leaves out for the section's family."""
    return tuple(f"verifier.{k}" for k in of(v).unread)


def refusal(v: Any) -> str | None:
    """One line naming the settings and what to do when the section's family cannot run as set (None: it
    can). Read by the configuration when it loads, before Ray or any feature pass."""
    if not v.enabled:
        return None
    f = of(v)
    if v.backend not in f.backends:
        runs = " or ".join(g.title.removesuffix(" verifier") for g in FAMILIES.values() if v.backend in g.backends)
        return (f"verifier.backend={v.backend} runs {runs} only; verifier.family={f.name} needs "
                f"verifier.backend={f.backends[0]}")
    other = next((g for g in FAMILIES.values() if g is not f and g.hub and v.model.startswith(g.hub)), None)
    if other is not None:
        return (f"verifier.family={f.name} but verifier.model is the {other.title.removesuffix(' verifier')} "
                f"checkpoint {v.model}; set verifier.model (e.g. {f.example})")
    for key, what in f.needs:
        if not getattr(v, key):
            return f"verifier.family={f.name} needs verifier.{key}: {what}"
    return None
