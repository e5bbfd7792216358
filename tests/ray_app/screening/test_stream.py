"""ray_app.screening.stream's model stage on the session's cluster: Ray Data keys an actor-pool stage by repr() of its
constructor arguments, so the stage is given a reference to its arguments, not the model's tensors."""

from __future__ import annotations

import torch

from kermt.checkpoint import read_checkpoint
from ray_app.screening.stream import EmbedStage, StageFromObjectStore, stage_arguments
from tests.conftest import FIXTURE_DIR


def test_a_model_stages_constructor_arguments_are_a_reference_whose_stage_holds_the_same_model(ray_cluster):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    kwargs = {"checkpoint": checkpoint, "batch_size": 8, "use_gpu": False, "fingerprint_source": None}
    arguments = stage_arguments(EmbedStage, kwargs)
    assert "tensor(" in repr(kwargs)  # what Ray Data printed before: every weight of the model
    assert "tensor(" not in repr(arguments) and len(repr(arguments)) < 300
    built = StageFromObjectStore(**arguments).stage  # as an actor of the pool builds it
    assert type(built) is EmbedStage
    direct = EmbedStage(**kwargs).embedder.encoder.state_dict()
    weights = built.embedder.encoder.state_dict()
    assert weights.keys() == direct.keys() and all(torch.equal(weights[k], direct[k]) for k in direct)
