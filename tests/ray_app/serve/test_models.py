"""What `kermt serve` reads beside the members, on the driver and without Ray: the applicability domain (or why a
model has none) and the run's recorded scores."""

from __future__ import annotations

from kermt.inference import find_checkpoints, read_members
from ray_app.serve.models import load_domain_index
from ray_app.serve.run_metrics import training_metrics
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import ensemble_dir
from tests.ray_app.serve.conftest import save_fold_domain


def test_a_model_without_a_usable_domain_says_why(tmp_path):
    run = ensemble_dir(tmp_path / "run", "ckpt_ft_reg.pt")
    members = read_members(find_checkpoints(run))
    index, why = load_domain_index(run, members)
    assert index is None and "no domain.json beside its first member" in why and "kermt finetune" in why
    save_fold_domain(run / "fold_0", FIXTURE_DIR / "ckpt_ft_cls.pt")  # another model's embedding: a stale file
    index, why = load_domain_index(run, members)
    assert index is None and "built from another model" in why, why
    save_fold_domain(run / "fold_0", run / "fold_0" / "model_0" / "model.pt")
    index, why = load_domain_index(run, members)
    assert why is None and index.training.shape[0] == 60
    one_file = run / "fold_0" / "model_0" / "model.pt"
    index, why = load_domain_index(one_file, members[:1])
    assert index is None and "one checkpoint" in why
    assert training_metrics(run) is None and training_metrics(one_file) is None  # no run.json
