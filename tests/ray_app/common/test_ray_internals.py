"""Each assumption in ray_app/common/ray_internals.py, checked against the installed Ray: after a Ray upgrade the
test named after the assumption that broke fails here, saying what changed. The last test keeps these assumptions
in that one module."""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import ray
import ray.exceptions

from kermt.errors import UserError, find_cause
from ray_app.common import ray_internals as internals
from ray_app.common.errors import ray_causes

ROOT = Path(__file__).resolve().parents[3]
UPGRADED = f"checked on Ray {internals.CHECKED_ON}, installed {ray.__version__}"


def _private(module: str, attribute: str):
    """``module.attribute`` of the installed Ray, or a failure naming what moved."""
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{module}.{attribute} is gone ({error}); {UPGRADED}")


# --- Cluster ----------------------------------------------------------------------------------------------------

@ray.remote(num_cpus=0)
def _node_and_address() -> tuple[str, str | None]:
    return ray.get_runtime_context().get_node_id(), os.environ.get("RAY_ADDRESS")


def test_the_head_node_carries_the_head_resource(ray_cluster):
    assert _private("ray._common.constants", "HEAD_NODE_RESOURCE_NAME") == internals.HEAD_NODE_RESOURCE, UPGRADED
    heads = [n for n in ray.nodes() if n["Alive"] and internals.HEAD_NODE_RESOURCE in n["Resources"]]
    assert [n["Resources"][internals.HEAD_NODE_RESOURCE] for n in heads] == [1.0], f"head nodes: {heads}; {UPGRADED}"
    # A fraction of it places work on the head (finetune's trial coordinators rely on this)
    on_head = _node_and_address.options(resources={internals.HEAD_NODE_RESOURCE: 0.001}).remote()
    assert ray.get(on_head, timeout=60)[0] == heads[0]["NodeID"]


def test_the_gcs_port_variable_sets_the_port_of_a_head_that_ray_init_starts(ray_cluster):
    assert _private("ray._private.ray_constants", "GCS_PORT_ENVIRONMENT_VARIABLE") == internals.GCS_PORT_VARIABLE, \
        UPGRADED
    if os.environ.get("RAY_ADDRESS"):
        pytest.skip("the session attached to an existing cluster: no head was started here")
    # connect() chose the port, named it in the workers' RAY_ADDRESS, and the GCS listens there
    gcs_address = ray.get_runtime_context().gcs_address
    assert ray.get(_node_and_address.remote(), timeout=60)[1] == gcs_address, UPGRADED


def test_the_state_api_without_an_address_takes_ray_address_first(monkeypatch):
    resolve = _private("ray._private.services", "canonicalize_bootstrap_address_or_die")
    monkeypatch.setenv("RAY_ADDRESS", "10.11.12.13:4321")  # no such cluster: only the variable can name it
    assert resolve(None) == "10.11.12.13:4321", UPGRADED


# --- Serve ------------------------------------------------------------------------------------------------------

def test_serves_global_client_gives_the_running_instances_http_options():
    get_client = _private(internals.SERVE_CONTEXT_MODULE, "_get_global_client")
    assert "raise_if_no_controller_running" in inspect.signature(get_client).parameters, UPGRADED
    client_class = _private("ray.serve._private.client", "ServeControllerClient")
    assert callable(getattr(client_class, "get_serve_details", None)), UPGRADED
    # what it returns on a running instance: tests/ray_app/serve/test_serve_command.py (a joining app's URL)


def test_a_placement_group_is_found_again_by_its_hex_id(ray_cluster):
    from ray.util.placement_group import placement_group, placement_group_table

    group = placement_group([{"CPU": 0.01}])
    ray.get(group.ready())
    again = internals.placement_group_by_hex(group.id.hex())
    assert again.id == group.id
    ray.util.remove_placement_group(again)
    deadline = time.monotonic() + 30
    while placement_group_table(group)["state"] != "REMOVED":
        assert time.monotonic() < deadline, f"not removed by its hex id; {UPGRADED}"
        time.sleep(0.1)



@ray.remote(num_cpus=0)
class _GroupMaker:
    def reserve(self) -> tuple[str, str]:
        from ray.util.placement_group import placement_group

        group = placement_group([{"CPU": 0.01}])
        ray.get(group.ready())
        return group.id.hex(), ray.get_runtime_context().get_actor_id()


def test_the_gcs_records_name_who_made_a_placement_group_and_whether_it_still_lives(ray_cluster):
    from ray.util.placement_group import placement_group

    job = ray.get_runtime_context().get_job_id()
    mine = placement_group([{"CPU": 0.01}])
    ray.get(mine.ready())
    maker = _GroupMaker.remote()
    theirs, maker_id = ray.get(maker.reserve.remote())
    try:
        records = {r.group_id: r for r in internals.placement_group_records()}
        expected = internals.PlacementGroupRecord(group_id=mine.id.hex(), creator_job_id=job, creator_actor_id=None,
                                                  state="CREATED", detached=False)
        assert records[mine.id.hex()] == expected, UPGRADED
        assert (records[theirs].creator_job_id, records[theirs].creator_actor_id) == (job, maker_id), UPGRADED
        assert job not in internals.ended_job_ids() and not internals.actor_ended(maker_id), UPGRADED
        assert internals.actor_ended("ab" * 16), UPGRADED  # unknown to the GCS
        ray.kill(maker)
        deadline = time.monotonic() + 30
        while not internals.actor_ended(maker_id):
            assert time.monotonic() < deadline, f"a killed actor is not seen as ended; {UPGRADED}"
            time.sleep(0.1)
    finally:
        ray.util.remove_placement_group(mine)
        ray.util.remove_placement_group(internals.placement_group_by_hex(theirs))  # this job lives: it would stay
    # an ended job in ended_job_ids(): tests/ray_app/common/test_orphans.py (a killed driver's)


# --- Logs -------------------------------------------------------------------------------------------------------

def test_serves_high_throughput_mode_is_the_variables_we_set():
    env = {**os.environ, internals.SERVE_HAPROXY_VARIABLE: "1", internals.SERVE_THROUGHPUT_VARIABLE: "1",
           internals.SERVE_HAPROXY_STATS_PORT_VARIABLE: "18404", internals.SERVE_HAPROXY_METRICS_PORT_VARIABLE: "19101",
           internals.SERVE_INGRESS_DRAINING_VARIABLE: "2.5"}
    read = ("from ray.serve._private import constants as c; print(c.RAY_SERVE_ENABLE_HA_PROXY, "
            "c.RAY_SERVE_THROUGHPUT_OPTIMIZED, c.RAY_SERVE_ENABLE_DIRECT_INGRESS, c.RAY_SERVE_HAPROXY_STATS_PORT, "
            "c.RAY_SERVE_HAPROXY_METRICS_PORT, c.RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S)")
    done = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "True", "True", "18404", "19101", "2.5"], (done.stderr[-2000:], UPGRADED)


def test_log_dedup_honours_the_allow_regex_read_when_ray_is_imported():
    from ray_app import PROGRESS_LINE

    env = {k: v for k, v in os.environ.items() if k != internals.DEDUP_ALLOW_REGEX_VARIABLE}
    code = "import ray_app, ray._private.ray_logging as l; print(l.stdout_deduplicator.allow_re.pattern)"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == PROGRESS_LINE, f"the driver's deduplicator allows {done.stdout!r}; {UPGRADED}"

    deduplicator = _private("ray._private.ray_logging", "LogDeduplicator")(5, PROGRESS_LINE, None)
    printed = []
    for pid in (101, 102):  # the same two lines from two processes within the window
        for line in ("[fold 0 model 1] epoch    3 loss 0.5", "loading shard 7 of 9"):
            for batch in deduplicator.deduplicate({"ip": "10.0.0.1", "pid": pid, "lines": [line]}):
                printed.extend(batch["lines"])
    assert printed.count("[fold 0 model 1] epoch    3 loss 0.5") == 2, f"progress lines folded: {printed}; {UPGRADED}"
    assert printed.count("loading shard 7 of 9") == 1, f"other lines no longer folded: {printed}; {UPGRADED}"


def test_train_reports_log_on_the_logger_named_after_the_context_module():
    logger = internals.train_report_logger()
    assert logger is not None, f"{internals.TRAIN_REPORT_MODULE} is gone; {UPGRADED}"
    module = importlib.import_module(internals.TRAIN_REPORT_MODULE)
    assert module.logger is logger, f"its logger is {module.logger.name!r}, not its file; {UPGRADED}"
    assert "Reporting training result" in inspect.getsource(module), UPGRADED


def test_the_quieted_loggers_are_the_ones_that_log_those_lines():
    storage = importlib.import_module(internals.CHECKPOINT_PERSIST_LOGGER)
    assert storage.logger.name == internals.CHECKPOINT_PERSIST_LOGGER, UPGRADED
    assert "Checkpoint successfully created" in inspect.getsource(storage), UPGRADED
    trainable = importlib.import_module("ray.tune.trainable.trainable")
    assert trainable.StorageContext.__module__ == internals.CHECKPOINT_PERSIST_LOGGER, \
        f"Tune's trainables persist checkpoints elsewhere now; {UPGRADED}"
    token_setup = importlib.import_module(internals.AUTH_TOKEN_SETUP_LOGGER)
    assert token_setup.logger.name == internals.AUTH_TOKEN_SETUP_LOGGER, UPGRADED
    assert "Token authentication is enabled for this Ray cluster" in inspect.getsource(token_setup), UPGRADED
    progress = importlib.import_module(internals.DATA_PROGRESS_LOGGER)
    assert progress.logger.name == internals.DATA_PROGRESS_LOGGER, UPGRADED
    assert "Progress bars disabled" in inspect.getsource(progress), UPGRADED


def test_the_legacy_tune_output_is_chosen_by_its_variable(monkeypatch):
    output = importlib.import_module("ray.tune.experimental.output")
    monkeypatch.setenv(internals.TUNE_NEW_OUTPUT_VARIABLE, "0")
    assert output.get_air_verbosity(0) is None, UPGRADED
    monkeypatch.setenv(internals.TUNE_NEW_OUTPUT_VARIABLE, "1")
    assert output.get_air_verbosity(0) is not None, UPGRADED


def test_the_train_settings_are_the_variables_ray_train_reads():
    constants = "ray.train.v2._internal.constants"
    assert _private(constants, "ENABLE_PRINT_PATCH_ENV_VAR") == internals.TRAIN_PRINT_PATCH_VARIABLE, UPGRADED
    assert _private(constants, "ENABLE_PREEMPTION_WATCHER_ENV_VAR") == internals.TRAIN_PREEMPTION_WATCHER_VARIABLE, \
        UPGRADED


def test_the_default_callbacks_start_a_dataset_manager_only_through_the_datasets_callback():
    from ray.train.torch import TorchTrainer

    callback = _private(internals.TRAIN_DATASETS_CALLBACK_MODULE, "DatasetsCallback")
    assert internals.train_datasets_callback() is callback
    assert callable(getattr(TorchTrainer, internals.DEFAULT_CALLBACKS_METHOD, None)), UPGRADED
    assert "DatasetsCallback(" in inspect.getsource(getattr(TorchTrainer, internals.DEFAULT_CALLBACKS_METHOD)), UPGRADED
    module = inspect.getsource(importlib.import_module(internals.TRAIN_DATASETS_CALLBACK_MODULE))
    assert "ray.remote(DatasetManager)" in module, f"the DatasetManager actor moved; {UPGRADED}"


# --- Ctrl-C -----------------------------------------------------------------------------------------------------

class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(str(record.msg))  # the filter in interrupt.py reads record.msg too


def test_the_elastic_policy_sizes_from_its_reserved_resources_and_reaches_the_controller_by_keyword():
    policy = _private(internals.ELASTIC_POLICY_MODULE, "ElasticScalingPolicy")
    assert internals.elastic_scaling_policy() is policy
    assert callable(getattr(policy, "_get_reserved_resources", None)), \
        f"ElasticScalingPolicy._get_reserved_resources is gone (elastic.py filters it); {UPGRADED}"
    from ray.train.torch import TorchTrainer

    fit = inspect.getsource(TorchTrainer.fit)
    assert callable(getattr(TorchTrainer, "_initialize_and_run_controller", None)), UPGRADED
    assert f"{internals.SCALING_POLICY_KEYWORD}=" in fit, \
        f"fit() no longer passes {internals.SCALING_POLICY_KEYWORD}= to the controller; {UPGRADED}"


def test_tune_leaves_sigint_alone_when_told_and_always_stops_gracefully_on_sigusr1(monkeypatch):
    setup = _private("ray.tune.tune", "_setup_signal_catching")
    tune_logger, records = logging.getLogger(internals.TUNE_LOGGER), _Records()
    assert _private("ray.tune.tune", "logger") is tune_logger, UPGRADED
    before = signal.getsignal(signal.SIGINT), signal.getsignal(internals.TUNE_STOP_SIGNAL)
    tune_logger.addHandler(records)
    try:
        monkeypatch.setenv(internals.TUNE_SIGINT_VARIABLE, "1")
        stopped = setup()
        assert signal.getsignal(signal.SIGINT) is before[0], f"Tune took SIGINT anyway; {UPGRADED}"
        os.kill(os.getpid(), internals.TUNE_STOP_SIGNAL)
        deadline = time.monotonic() + 5
        while not stopped.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stopped.is_set(), f"{internals.TUNE_STOP_SIGNAL!r} no longer stops a Tune run; {UPGRADED}"
        assert records.messages and records.messages[0].startswith(internals.TUNE_INTERRUPT_MESSAGES), \
            f"Tune's stop is logged as {records.messages}; {UPGRADED}"
        monkeypatch.delenv(internals.TUNE_SIGINT_VARIABLE)
        setup()
        assert signal.getsignal(signal.SIGINT) is not before[0], f"{internals.TUNE_SIGINT_VARIABLE} is not read"
    finally:
        tune_logger.removeHandler(records)
        signal.signal(signal.SIGINT, before[0])
        signal.signal(internals.TUNE_STOP_SIGNAL, before[1])


def test_tune_words_its_resume_advice_as_the_filter_expects():
    source = inspect.getsource(_private("ray.tune.tune", "run"))
    missing = [m for m in internals.TUNE_INTERRUPT_MESSAGES[:2] if f'"{m}' not in source]
    assert not missing, f"tune.run() no longer logs {missing}; {UPGRADED}"


@ray.remote(num_cpus=0)
class _ExitingController:
    """Stands in for Ray Train's controller only in what its abort() does (checked below): the actor exits."""

    def abort(self) -> None:
        ray.actor.exit_actor()


def test_ray_trains_sigint_handler_exits_the_process_after_the_abort(ray_cluster):
    trainer = _private("ray.train.v2.api.data_parallel_trainer", "DataParallelTrainer")
    controller = _private("ray.train.v2._internal.execution.controller.controller", "TrainController")
    assert "ray.actor.exit_actor()" in inspect.getsource(controller.abort), \
        f"the controller's abort no longer exits its actor; {UPGRADED}"
    before = signal.getsignal(signal.SIGINT)
    try:
        trainer._register_sigint_handler(None, _ExitingController.remote())
        with pytest.raises(internals.TRAIN_SIGINT_EXIT):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)  # the handler runs here, in the main thread
            pytest.fail(f"Ray Train's SIGINT handler did not exit; {UPGRADED}")
    finally:
        signal.signal(signal.SIGINT, before)


# --- Errors -----------------------------------------------------------------------------------------------------

def test_ray_datas_malformed_csv_message_names_the_file(ray_cluster, tmp_path):
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("smiles,name\nCCO,a\nCCC,b,extra\n")
    with pytest.raises(Exception) as caught:
        ray.data.read_csv(str(ragged)).materialize()
    found = find_cause(caught.value, lambda e: internals.malformed_csv_path(e) is not None, ray_causes)
    assert found is not None, f"no error starting {internals.DATA_MALFORMED_CSV!r}: {caught.value!r}; {UPGRADED}"
    assert internals.malformed_csv_path(found) == str(ragged)


def test_ray_errors_keep_what_they_wrap_on_the_expected_attributes():
    from ray.train import ControllerError, WorkerGroupError

    original = UserError("bad row")
    task_error = ray.exceptions.RayTaskError("f", "remote traceback", original)
    dual = task_error.as_instanceof_cause()
    peer = RuntimeError("peer died")
    assert internals.wrapped_exceptions(task_error)[0] is original, UPGRADED
    assert internals.wrapped_exceptions(dual)[0] is original and isinstance(dual, UserError), UPGRADED
    assert internals.wrapped_exceptions(ControllerError(original))[1] is original, UPGRADED
    assert internals.wrapped_exceptions(WorkerGroupError("failed", {0: peer, 1: original}))[2:] == [peer, original]


def _fails_in_a_map_function(batch: pa.Table) -> pa.Table:
    raise UserError("lib.csv: row 3: bad label")


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and everything it wraps, by Python's cause chain and by Ray's attributes."""
    found, queue = [], [error]
    while queue:
        current = queue.pop(0)
        if isinstance(current, BaseException) and all(current is not e for e in found):
            found.append(current)
            queue.extend([current.__cause__, current.__context__, *internals.wrapped_exceptions(current)])
    return found


def test_ray_data_leaves_a_map_functions_error_only_as_text_on_the_driver(ray_cluster):
    assert ray.exceptions.UserCodeException.__name__ == internals.DATA_USER_CODE_EXCEPTION, UPGRADED
    ds = ray.data.from_arrow(pa.table({"x": [1, 2]})).map_batches(_fails_in_a_map_function, batch_format="pyarrow")
    with pytest.raises(Exception) as caught:
        ds.materialize()
    wrapper = next((e for e in _chain(caught.value) if internals.lost_user_code_cause(e)), None)
    assert wrapper is not None, f"{caught.value!r} wraps no cause-less UserCodeException; {UPGRADED}"
    assert "kermt.errors.UserError: lib.csv: row 3: bad label" in str(wrapper), UPGRADED


# --- One place --------------------------------------------------------------------------------------------------

PRIVATE_PATH = re.compile(r"ray\.[\w.]*_(private|internal|raylet)\b|ray\._[a-z]|__internal_head__")


def _assumed_strings() -> list[str]:
    values = []
    for name, value in vars(internals).items():
        if name.isupper() and name != "CHECKED_ON":
            values.extend(value if isinstance(value, tuple) else [value])
    return [v for v in values if isinstance(v, str)]


def _string_literals(tree: ast.AST) -> list[str]:
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_no_other_module_names_a_ray_internal():
    assumed = _assumed_strings()
    assert len(assumed) > 8
    sources = [p for folder in ("ray_app", "jobs") for p in (ROOT / folder).rglob("*.py")]
    assert len(sources) > 20
    found = {}
    for path in sources:
        if path.name == "ray_internals.py":
            continue
        text = path.read_text()
        named = [m.group(0) for m in PRIVATE_PATH.finditer(text)]
        literals = _string_literals(ast.parse(text))
        named += [s for s in assumed for literal in literals if s == literal or (len(s) > 12 and s in literal)]
        if named:
            found[str(path.relative_to(ROOT))] = sorted(set(named))
    assert not found, f"Ray internals named outside ray_app/common/ray_internals.py: {found}"
