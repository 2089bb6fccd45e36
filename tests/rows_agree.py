"""Two feature rows of one image, computed with other batch compositions, agree.

Batches of another size change float sums in the last bits, so two captions whose cosines (or ITM
probabilities) tie to ~1e-6 may swap. The demo corpus, as COCO's, also holds the same sentence under
several ids, and which id of a duplicate comes first, or makes the cut at L, follows such a near-tie:
captions therefore compare as text, and where the text differs the scores must tie."""

import math


def assert_rows_agree(g: dict, e: dict) -> None:
    image_id = e["image_id"]
    assert g["error"] == e["error"], image_id
    assert sorted(r["text"] for r in g["retrieved"]) == sorted(r["text"] for r in e["retrieved"]), image_id
    for gr, er in zip(g["retrieved"], e["retrieved"]):
        assert gr["text"] == er["text"] or math.isclose(gr["cosine"], er["cosine"], abs_tol=1e-4), (image_id, gr, er)
    assert len(g["verified"]) == len(e["verified"]), image_id
    for gv, ev in zip(g["verified"], e["verified"]):
        assert gv["text"] == ev["text"] or math.isclose(gv["verifier"], ev["verifier"], abs_tol=1e-4), (image_id, gv, ev)
    assert g["entities"] == e["entities"] and g["prompt"] == e["prompt"], image_id
    assert [c["text"] for c in g["candidates"]] == [c["text"] for c in e["candidates"]], image_id
    for gc, ec in zip(g["candidates"], e["candidates"]):
        for key in ("lm_logprob_sum", "lm_logprob_mean", "retrieval_cosine", "verifier"):
            assert math.isclose(gc[key], ec[key], rel_tol=1e-3, abs_tol=1e-4), (image_id, key)
