"""Storage, failure and GPU defaults on the single-machine test cluster (the multi-node side is tests/multinode/)."""

from __future__ import annotations

import pytest

from kermt.errors import UserError
from ray_app.common.cluster import ClusterLayout
from ray_app.common.storage import check_gpus, check_reachable, resolve_max_failures, resolve_storage


def test_layout_counts_a_cpu_less_head_as_multi_node():
    assert not ClusterLayout(alive_nodes=1, head_cpus=4).multi_node
    assert ClusterLayout(alive_nodes=1, head_cpus=0).multi_node  # an autoscaling cluster before it grows
    assert ClusterLayout(alive_nodes=3, head_cpus=8).multi_node


def test_one_machine_keeps_local_defaults(ray_cluster, tmp_path):
    assert not ClusterLayout.current().multi_node
    assert resolve_storage(None, tmp_path / "ray_results") == str(tmp_path / "ray_results")
    assert resolve_storage("relative/dir", tmp_path) == str((tmp_path.cwd() / "relative/dir").resolve())
    assert resolve_storage(f"file://{tmp_path}", tmp_path) == f"file://{tmp_path}"
    assert resolve_max_failures(None) == 0 and resolve_max_failures(2) == 2


def test_use_gpu_without_gpus_is_a_one_line_error_on_one_machine(ray_cluster):
    check_gpus(False)
    with pytest.raises(UserError, match="--use_gpu was given but this Ray cluster has no GPU"):
        check_gpus(True)


def test_unreachable_or_wrong_storage_is_named(tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UserError, match="is a file; give a directory"):
        check_reachable(f"file://{tmp_path / 'a_file'}")
    with pytest.raises(UserError, match="directory '/no/such' does not exist"):
        check_reachable("file:///no/such/dir")
    with pytest.raises(UserError, match=r"cannot be reached \(.*\); check the URI, the credentials"):
        check_reachable("s3://kermt-missing/x?endpoint_override=127.0.0.1:9&scheme=http&connect_timeout=1")
