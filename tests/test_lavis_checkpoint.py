"""LAVIS checkpoints and LAVIS's eval image transform in adjcap's own environment (no LAVIS needed):
bad files fail in one line naming the file and the first offending keys; the image transform is
torchvision's LAVIS transform to the bit."""

from pathlib import Path

import pytest
import torch
from PIL import Image

from adjcap.models.blip import load_verifier
from adjcap.models.blip_lavis import LavisCheckpointError, LavisEvalTransform, read_lavis_state_dict

IMAGES = sorted((Path(__file__).parent / "fixtures" / "data" / "images").glob("*.jpg"))


def _one_line_error(path, match):
    with pytest.raises(LavisCheckpointError) as e:
        load_verifier(str(path), device="cpu", precision="fp32", tokenizer="unused")
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and match in msg, msg
    return msg


def test_corrupt_pth_names_the_file(tmp_path):
    p = tmp_path / "model_large_retrieval_coco.pth"
    p.write_bytes(b"PK\x03\x04 this is not a checkpoint" * 10)
    _one_line_error(p, "not a loadable weights-only checkpoint")


def test_pickled_objects_are_refused_not_run(tmp_path):
    p = tmp_path / "objects.pth"
    torch.save({"model": {"visual_encoder.cls_token": torch.zeros(1)}, "args": Path("/x")}, p)
    _one_line_error(p, "weights-only")


def test_foreign_state_dict_names_first_unexpected_keys(tmp_path):
    p = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(4, 3, 3, 3), "fc.bias": torch.zeros(2), "fc.weight": torch.zeros(2, 4)}, p)
    _one_line_error(p, "unexpected keys conv1.weight, fc.bias, fc.weight")
    q = tmp_path / "half.pth"  # LAVIS names, but no text side
    torch.save({"model": {"visual_encoder.cls_token": torch.zeros(1, 1, 64)}}, q)
    _one_line_error(q, "missing keys text_encoder.embeddings.position_embeddings.weight")


def test_non_tensor_entries_and_empty_files(tmp_path):
    p = tmp_path / "mixed.pth"
    torch.save({"model": {"itm_head.weight": torch.zeros(2, 4), "epoch": 3}}, p)
    assert "non-tensor entries" in _one_line_error(p, "epoch")
    q = tmp_path / "empty.pth"
    torch.save({"model": {}}, q)
    with pytest.raises(LavisCheckpointError, match="holds no state_dict"):
        read_lavis_state_dict(q)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        load_verifier(str(tmp_path / "nope.pth"), device="cpu")


@pytest.mark.parametrize("size", [384, 32])
def test_eval_transform_equals_lavis_torchvision_transform(size):
    from torchvision import transforms
    from torchvision.transforms import InterpolationMode

    lavis = transforms.Compose([  # LAVIS BlipImageEvalProcessor, as lavis/processors/blip_processors.py builds it
        transforms.Resize((size, size), interpolation=InterpolationMode.BICUBIC),
        transforms.ToTensor(),
        transforms.Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    ])
    ours = LavisEvalTransform(size)
    images = [Image.open(p).convert("RGB") for p in IMAGES]
    assert len(images) >= 2 and images[0].size != (size, size)
    got = ours(images=images, return_tensors="pt")["pixel_values"]
    want = torch.stack([lavis(im) for im in images])
    assert got.shape == (len(images), 3, size, size)
    assert torch.equal(got, want)
