"""Borda-consensus targets, the tie rule and the listwise loss, against hand-computed values."""

import math

import numpy as np
import pytest
import torch

from adjcap.rerank import average_ranks, borda_targets, listwise_loss


def _softmax(xs):
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def test_borda_hand_computed_example():
    # image 0: three candidates (+ one padded slot). Scorers: LM, retrieval cosine, verifier.
    #   LM   [-1.0, -2.0, -0.5] -> ranks c2=0, c0=1, c1=2
    #   cos  [ 0.3,  0.5,  0.1] -> ranks c1=0, c0=1, c2=2
    #   ver  [ 0.9,  0.2,  0.4] -> ranks c0=0, c2=1, c1=2
    #   K=3, K-1=2: q_c0 = ((2-1)+(2-1)+(2-0))/3 = 4/3
    #               q_c1 = ((2-2)+(2-0)+(2-2))/3 = 2/3
    #               q_c2 = ((2-0)+(2-2)+(2-1))/3 = 1
    # image 1: four candidates, all three scorers agree: c3 > c2 > c1 > c0
    #   K=4: q = [0, 1, 2, 3]
    scores = np.array(
        [
            [[-1.0, 0.3, 0.9], [-2.0, 0.5, 0.2], [-0.5, 0.1, 0.4], [99.0, 99.0, 99.0]],
            [[-4.0, 0.1, 0.1], [-3.0, 0.2, 0.2], [-2.0, 0.3, 0.3], [-1.0, 0.4, 0.4]],
        ],
        dtype=np.float32,
    )
    mask = np.array([[True, True, True, False], [True, True, True, True]])
    q, target = borda_targets(scores, mask)
    np.testing.assert_allclose(q[0, :3].numpy(), [4 / 3, 2 / 3, 1.0], rtol=1e-6)
    assert float(q[0, 3]) == 0.0 and float(target[0, 3]) == 0.0  # the padded slot
    np.testing.assert_allclose(target[0, :3].numpy(), _softmax([4 / 3, 2 / 3, 1.0]), rtol=1e-6)
    np.testing.assert_allclose(q[1].numpy(), [0, 1, 2, 3], rtol=1e-6)
    np.testing.assert_allclose(target[1].numpy(), _softmax([0, 1, 2, 3]), rtol=1e-6)
    np.testing.assert_allclose(target.sum(dim=1).numpy(), [1.0, 1.0], rtol=1e-6)
    # the padded value (99, best under every scorer) did not take a rank from the valid ones
    ranks = average_ranks(scores, mask)
    np.testing.assert_array_equal(ranks[0, :3].numpy(), [[1, 1, 0], [2, 0, 2], [0, 2, 1]])


def test_tie_rule_is_average_ranks():
    # LM ties c0 and c1 for ranks {0, 1} -> both 0.5; c2 rank 2. cos and ver tie everywhere -> rank 1.
    scores = torch.tensor([[[-1.0, 0.2, 0.5], [-1.0, 0.2, 0.5], [-2.0, 0.2, 0.5]]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    r = average_ranks(scores, mask)
    np.testing.assert_array_equal(r[0].numpy(), [[0.5, 1, 1], [0.5, 1, 1], [2, 1, 1]])
    q, target = borda_targets(scores, mask)
    np.testing.assert_allclose(q[0].numpy(), [(1.5 + 1 + 1) / 3, (1.5 + 1 + 1) / 3, (0 + 1 + 1) / 3], rtol=1e-6)
    assert float(target[0, 0]) == float(target[0, 1])  # tied candidates get identical targets
    # a scorer constant over the image does not change the target
    _, t_lm_only = borda_targets(scores[..., :1], mask)
    q_lm_only = torch.tensor([1.5, 1.5, 0.0])
    np.testing.assert_allclose(t_lm_only[0].numpy(), torch.softmax(q_lm_only, 0).numpy(), rtol=1e-6)


def test_nan_scores_rank_last_and_tie():
    scores = torch.tensor([[[0.1], [float("nan")], [0.3], [float("nan")]]])
    r = average_ranks(scores, torch.ones(1, 4, dtype=torch.bool))
    np.testing.assert_array_equal(r[0, :, 0].numpy(), [1, 2.5, 0, 2.5])


def test_borda_shape_errors_are_clear():
    with pytest.raises(ValueError, match="mask"):
        borda_targets(np.zeros((2, 3, 3)), np.ones((2, 4), dtype=bool))


def test_listwise_loss_hand_values():
    # equal logits over 3 valid candidates: -sum t log(1/3) = ln 3 for any target
    logits = torch.tensor([[0.0, 0.0, 0.0, 50.0]])
    mask = torch.tensor([[True, True, True, False]])
    target = torch.tensor([[0.2, 0.3, 0.5, 0.0]])
    assert math.isclose(float(listwise_loss(logits, target, mask)), math.log(3), rel_tol=1e-6)
    # one-hot target on candidate 0, logits [1, 0]: loss = -log(e/(e+1))
    l2 = listwise_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[True, True]]))
    assert math.isclose(float(l2), -math.log(math.e / (math.e + 1)), rel_tol=1e-6)
    # mean over images
    both = listwise_loss(
        torch.tensor([[0.0, 0.0, 0.0, 50.0], [1.0, 0.0, -7.0, -7.0]]),
        torch.tensor([[0.2, 0.3, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]),
        torch.tensor([[True, True, True, False], [True, True, False, False]]),
    )
    assert math.isclose(float(both), (math.log(3) + float(l2)) / 2, rel_tol=1e-6)


def test_listwise_loss_gradient_ignores_masked_entries():
    logits = torch.tensor([[0.5, -0.2, 3.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    listwise_loss(logits, torch.tensor([[0.7, 0.3, 0.0]]), mask).backward()
    assert float(logits.grad[0, 2]) == 0.0
    assert torch.isfinite(logits.grad).all()
