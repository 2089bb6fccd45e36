"""Ray actor classes, one per pool. Thin: load models once in __init__, call adjcap.stages in __call__.

Batches travel between pools as ``{"image_id": str[], "state": bytes[]}``: each state is a pickled
:class:`adjcap.image_state.ImageState` (the image rides inside it as encoded bytes until the last stage; each pool decodes it once)."""
