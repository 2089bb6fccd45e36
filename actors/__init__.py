"""The Ray actors: the one pool actor (actors/pool.py, a class name per pool; it also runs the ``lavis``
verifier backend's pools in LAVIS's environment), the decode tasks, the index task, the corpus encoder,
the metrics. Thin: load models once in __init__, call adjcap.engine.stages in __call__.

Batches travel between pools as one Arrow table of declared columns (:mod:`adjcap.engine.transport`:
the image's own columns, the pixels its decode task prepared, each stage's declared outputs), never a
pickled state; each pool rebuilds its :class:`adjcap.engine.image_state.ImageState` objects from the table."""
