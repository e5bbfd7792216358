"""A user error raised inside Ray (a task, a Ray Data map function, a Train worker) still comes out as one line."""

from __future__ import annotations

import pyarrow as pa
import pytest
import ray.exceptions
from ray.train import WorkerGroupError

from kermt.errors import UserError, find_user_error, run_reporting_user_errors
from ray_app.common.errors import ray_causes

MESSAGE = "lib.csv: row 3, column 'y': label 'abc' is not a number"


def _raise(error: BaseException):
    def run() -> int:
        raise error

    return run


def test_wrapped_user_errors_are_found_without_a_cluster(capsys):
    task_error = ray.exceptions.RayTaskError("f", "remote traceback text", UserError(MESSAGE)).as_instanceof_cause()
    assert isinstance(task_error, UserError) and MESSAGE != str(task_error)  # Ray's dual class: the text differs
    train_error = WorkerGroupError("worker 1 failed", {0: RuntimeError("peer died"), 1: UserError(MESSAGE)})
    for error in (task_error, train_error):
        assert str(find_user_error(error, ray_causes)) == MESSAGE
        assert run_reporting_user_errors("kermt finetune", _raise(error), ray_causes) == 2
        assert capsys.readouterr().err == f"kermt finetune: error: {MESSAGE}\n"
    try:  # a wrapper that replaced the original (`raise ... from None`, as finetune's member loop does)
        try:
            raise task_error
        except UserError:
            raise RuntimeError("fold 0 model 1 failed") from None
    except RuntimeError as wrapper:
        assert str(find_user_error(wrapper, ray_causes)) == MESSAGE
    try:  # but an error raised while handling a user error is a new failure (a bug): no user error is found
        try:
            raise UserError(MESSAGE)
        except UserError:
            raise KeyError("bug")  # noqa: B904 - the case tested: raised while handling, so only its __context__
    except KeyError as bug:
        assert find_user_error(bug, ray_causes) is None
        with pytest.raises(KeyError):
            run_reporting_user_errors("kermt finetune", _raise(bug), ray_causes)


def _fails_in_a_task(batch: pa.Table) -> pa.Table:
    raise UserError(MESSAGE)


@ray.remote
def _remote_task() -> None:
    raise UserError(MESSAGE)


def test_user_error_raised_on_the_cluster_is_one_line(ray_cluster, capfd):
    def data_pipeline() -> int:
        ds = ray.data.from_arrow(pa.table({"x": [1, 2, 3]})).map_batches(_fails_in_a_task, batch_format="pyarrow")
        for _ in ds.iter_batches():
            pass
        return 0

    for run in (data_pipeline, lambda: ray.get(_remote_task.remote())):
        capfd.readouterr()
        assert run_reporting_user_errors("kermt predict", run, ray_causes) == 2
        err = capfd.readouterr().err
        assert "Traceback" not in err
        assert [line for line in err.splitlines() if "error: " in line] == [f"kermt predict: error: {MESSAGE}"]
