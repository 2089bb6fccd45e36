"""Ray actor classes, one per pool. Thin: load models once in __init__, call adjcap.stages in __call__.

Batches travel between pools as one Arrow table of declared columns (:mod:`adjcap.engine.transport`:
the image's own columns, the pixels its decode task prepared, each stage's declared outputs), never a
pickled state; each pool rebuilds its :class:`adjcap.image_state.ImageState` objects from the table."""
