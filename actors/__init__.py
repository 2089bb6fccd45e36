"""Ray actor classes, one per pool. Thin: load models once in __init__, call adjcap.stages in __call__.

Batches travel between pools as ``{"image_id": str[], "state": bytes[]}``: each state is a pickled
:class:`adjcap.stages.ImageState` (the decoded image rides inside it until the last stage)."""
