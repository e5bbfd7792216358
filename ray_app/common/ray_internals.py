"""What this app assumes about Ray beyond its public API, in one place: private module paths, a special resource
name, environment variables Ray reads but does not document as settings (or reads only at import), message strings
we match, and where Ray's exceptions keep the error they wrap.

Each assumption below was checked on Ray 2.60.0 (``CHECKED_ON``). tests/ray_app/common/test_ray_internals.py checks
every one against the installed Ray, so a Ray upgrade that changes one fails there, in a test named after it; the
same file checks that no other module of ray_app/ or jobs/ names a Ray private path or one of these strings.

No Ray import at module level: ``ray_app/__init__.py`` reads this module before anything imports Ray.
"""

from __future__ import annotations

import importlib
import logging
import signal
from dataclasses import dataclass

CHECKED_ON = "2.60.0"

# --- Cluster ----------------------------------------------------------------------------------------------------

# Every head node carries this resource, quantity 1 (ray._common.constants.HEAD_NODE_RESOURCE_NAME): asking for a
# fraction of it places a task or actor on the head (Ray Serve places its controller so), and ray.nodes() lists it
# among the head's "Resources".
HEAD_NODE_RESOURCE = "node:__internal_head__"

# The GCS port of a head node that ray.init starts is taken from this variable when set
# (ray._private.ray_constants.GCS_PORT_ENVIRONMENT_VARIABLE, read by ray._private.node), so the port can be chosen,
# and named in RAY_ADDRESS, before the cluster starts.
GCS_PORT_VARIABLE = "RAY_GCS_SERVER_PORT"

# Not a name we use, but what cluster.py's local cluster is built around: Ray's state API called without an address
# (ray.util.state; Ray Train's PlacementGroupCleaner and state actor, Ray Data's hang detector) resolves the cluster
# with ray._private.services.canonicalize_bootstrap_address_or_die, which takes RAY_ADDRESS first and otherwise
# looks for GCS processes on the machine ("Found multiple active Ray instances" with two of them).

# Who made a placement group is only in the GCS's own record of it (protobuf
# ray.core.generated.gcs_pb2.PlacementGroupTableData, read through ray._private.state's GlobalStateAccessor):
# creator_job_id and creator_actor_id (all 0xff bytes when a driver or a task made it). The state API lists the job
# only. Its creator_actor_dead flag is no guide: it stayed False for a group whose actor Ray had killed.
# ray_app/common/orphans.py reads the records, the GCS job table (ray._private.state.jobs(), "JobID" in hex and
# "IsDead") and the actor table (GlobalState.actor_table(hex): {} once Ray dropped the actor, else "State").
GLOBAL_STATE_MODULE = "ray._private.state"
GCS_PROTOBUF_MODULE = "ray.core.generated.gcs_pb2"
NO_ACTOR = "ff" * 16  # ray.ActorID.nil().hex()


@dataclass(frozen=True)
class PlacementGroupRecord:
    """The GCS's record of one placement group, ids in hex."""

    group_id: str
    creator_job_id: str
    creator_actor_id: str | None  # None when no actor made it (a driver or a task did)
    state: str  # PENDING, PREPARED, CREATED, RESCHEDULING or REMOVED
    detached: bool


def placement_group_records() -> list[PlacementGroupRecord]:
    """Every placement group the GCS knows of, removed ones included (needs ray.init)."""
    table = importlib.import_module(GCS_PROTOBUF_MODULE).PlacementGroupTableData
    accessor = importlib.import_module(GLOBAL_STATE_MODULE).state._connect_and_get_accessor()
    records = [table.FromString(raw) for raw in accessor.get_placement_group_table()]
    return [PlacementGroupRecord(group_id=r.placement_group_id.hex(), creator_job_id=r.creator_job_id.hex(),
                                 creator_actor_id=None if r.creator_actor_id.hex() == NO_ACTOR
                                 else r.creator_actor_id.hex(),
                                 state=table.PlacementGroupState.Name(r.state), detached=r.is_detached)
            for r in records]


def ended_job_ids() -> set[str]:
    """The hex ids of the jobs (drivers) the GCS has marked ended."""
    return {job["JobID"] for job in importlib.import_module(GLOBAL_STATE_MODULE).jobs() if job["IsDead"]}


def actor_ended(actor_id: str) -> bool:
    """Whether the actor with this hex id is dead or no longer known to the GCS."""
    actor = importlib.import_module(GLOBAL_STATE_MODULE).state.actor_table(actor_id)
    return actor.get("State", "DEAD") == "DEAD"


# Removing a group by id needs Ray's ID type to build the PlacementGroup that remove_placement_group takes.
PLACEMENT_GROUP_ID_MODULE = "ray._raylet"


def placement_group_by_hex(hex_id: str) -> object:
    """The ``ray.util.placement_group.PlacementGroup`` whose id is ``hex_id``."""
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(importlib.import_module(PLACEMENT_GROUP_ID_MODULE).PlacementGroupID.from_hex(hex_id))


# --- Logs -------------------------------------------------------------------------------------------------------

# The driver folds worker lines that differ only in words holding digits ("[repeated 8x across cluster]") unless they
# match this regex. ray._private.ray_constants reads it once, when ray is first imported.
DEDUP_ALLOW_REGEX_VARIABLE = "RAY_DEDUP_LOGS_ALLOW_REGEX"

# Ray Train V2 logs every ray.train.report() at INFO ("Reporting training result ...") on a logger named after this
# module's file path (logging.getLogger(__file__)), which is not under "ray.train", so LoggingConfig misses it.
TRAIN_REPORT_MODULE = "ray.train.v2._internal.execution.context"


def train_report_logger() -> logging.Logger | None:
    """The logger Ray Train's per-report lines go to; None once a later Ray moved the module (only noise is at stake,
    the test names the change)."""
    try:
        module = importlib.import_module(TRAIN_REPORT_MODULE)
    except ImportError:
        return None
    return logging.getLogger(module.__file__)


# Loggers of routine INFO/WARNING lines a user cannot act on (module ``logger = logging.getLogger(__name__)``):
# every checkpoint a trial reports through Tune ("Checkpoint successfully created at: ...", Ray Train's storage
# module, used by Tune's function trainables) and Ray Data's one-time "Progress bars disabled" notice (we disable
# them on purpose: bars are noise in job logs; our own progress lines say how far a step is).
CHECKPOINT_PERSIST_LOGGER = "ray.train._internal.storage"
# ...and, at every local cluster start, "Token authentication is enabled for this Ray cluster" (Ray's default for a
# cluster that ray.init starts; setting RAY_AUTH_MODE=token instead is read too late once ray is imported).
AUTH_TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"
DATA_PROGRESS_LOGGER = "ray.data._internal.progress"

# Ray Tune's "new output engine" prints an experiment table, "View detailed results here" and a TensorBoard hint
# at the start of every Tuner.fit even with verbose=0 (ray.tune.experimental.output, read at each fit); "0" selects
# the legacy engine, which at verbose=0 prints nothing. finetune's members run as a Tune experiment that users
# never asked to see.
TUNE_NEW_OUTPUT_VARIABLE = "RAY_AIR_NEW_OUTPUT"

# Ray Train V2 settings read from the environment (ray.train.v2._internal.constants), not among Ray's documented
# settings. "0" for the first: a worker's print reaches the driver once, not also as a log record. "0" for the
# second: no spot-preemption watcher actor (one machine has nothing to watch).
TRAIN_PRINT_PATCH_VARIABLE = "RAY_TRAIN_ENABLE_PRINT_PATCH"
TRAIN_PREEMPTION_WATCHER_VARIABLE = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"

# --- Serve ------------------------------------------------------------------------------------------------------

# Where a Serve instance already running on the cluster listens: serve.status() leaves out its HTTP options, and the
# public place that has them is the dashboard's REST API (GET /api/serve/applications/, "http_options"), which needs
# the dashboard's address. The controller's instance details, reached through Serve's own global client
# (ray.serve.context._get_global_client(raise_if_no_controller_running=False), None without a controller, then
# ServeControllerClient.get_serve_details()), hold the same dict.
SERVE_CONTEXT_MODULE = "ray.serve.context"


# Ray Serve's high-throughput mode (documented for KubeRay since Ray 2.55, "Enable High Throughput on Ray Serve"):
# HAProxy instead of the Python proxy actor, ingress replicas answering HTTP themselves, gRPC between deployments.
# ray.serve._private.constants reads the variables once, when the controller, proxies and replicas import it, so
# they must be in the environment the cluster's nodes start with.
SERVE_HAPROXY_VARIABLE = "RAY_SERVE_ENABLE_HA_PROXY"
SERVE_THROUGHPUT_VARIABLE = "RAY_SERVE_THROUGHPUT_OPTIMIZED"
# HAProxy also serves a stats page and a Prometheus exporter, on every interface at fixed ports (8404, 9101) unless
# these name others: a second HAProxy on the same machine (another app's local cluster) fails to start on them.
SERVE_HAPROXY_STATS_PORT_VARIABLE = "RAY_SERVE_HAPROXY_STATS_PORT"
SERVE_HAPROXY_METRICS_PORT_VARIABLE = "RAY_SERVE_HAPROXY_METRICS_PORT"
# An ingress replica that stops keeps answering this long (default 30 s), so that load balancers on other nodes
# notice first: every stop of a `kermt serve` app waited for it.
SERVE_INGRESS_DRAINING_VARIABLE = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"


def running_serve_http_options() -> dict | None:
    """The running Serve instance's ``http_options`` ({"host": ..., "port": ..., ...}); None when none runs."""
    context = importlib.import_module(SERVE_CONTEXT_MODULE)
    client = context._get_global_client(raise_if_no_controller_running=False)
    return None if client is None else client.get_serve_details().get("http_options")


# --- Elastic training ---------------------------------------------------------------------------------------------

# Ray Train V2's elastic scaling policy lives in this private module; it sizes a worker group from its
# ``_get_reserved_resources()`` ({node id hex, as in ray.nodes(): resources}, the autoscaling coordinator's
# reservation), and DataParallelTrainer.fit passes the policy it chose to ``_initialize_and_run_controller`` as the
# ``scaling_policy`` keyword (ray_app/common/elastic.py overrides both).
ELASTIC_POLICY_MODULE = "ray.train.v2._internal.execution.scaling_policy"
SCALING_POLICY_KEYWORD = "scaling_policy"


def elastic_scaling_policy() -> type:
    """Ray Train's ``ElasticScalingPolicy`` class (imported when asked: this module loads before Ray)."""
    return importlib.import_module(ELASTIC_POLICY_MODULE).ElasticScalingPolicy


# --- Trainer callbacks ------------------------------------------------------------------------------------------

# DataParallelTrainer._create_default_callbacks() lists the callbacks every run gets; among them this one starts a
# Ray Data DatasetManager actor for each worker group (one more process importing Ray Data: ~2 CPU-seconds per run)
# even when the trainer was given no datasets. Our workers read their own shard files and never ask for one.
TRAIN_DATASETS_CALLBACK_MODULE = "ray.train.v2._internal.callbacks.datasets"
DEFAULT_CALLBACKS_METHOD = "_create_default_callbacks"


def train_datasets_callback() -> type:
    """Ray Train's ``DatasetsCallback`` class (imported when asked: this module loads before Ray)."""
    return importlib.import_module(TRAIN_DATASETS_CALLBACK_MODULE).DatasetsCallback


# --- Ctrl-C -----------------------------------------------------------------------------------------------------

# Ray Tune's run (ray.tune.tune._setup_signal_catching) installs no SIGINT handler when this variable is "1", and
# always handles SIGUSR1 as the same graceful stop (save the experiment state, return from fit()).
TUNE_SIGINT_VARIABLE = "TUNE_DISABLE_SIGINT_HANDLER"
TUNE_STOP_SIGNAL = signal.SIGUSR1

# After a stop, Tune logs its own resume advice (Tuner.restore(...)) on this logger, starting with one of these.
TUNE_LOGGER = "ray.tune.tune"
TUNE_INTERRUPT_MESSAGES = ("Experiment has been interrupted", "Training has been interrupted", "Stop signal received")

# Around a Ray Train fit() in the main thread, DataParallelTrainer installs its own SIGINT handler: the first Ctrl-C
# aborts the controller, whose actor then exits, and the handler calls sys.exit(0). fit() therefore ends in this.
TRAIN_SIGINT_EXIT = SystemExit

# --- Errors -----------------------------------------------------------------------------------------------------

# Ray Data's CSV reader (ray.data._internal.datasource.csv_datasource) turns pyarrow's ArrowInvalid into a ValueError
# "Failed to read CSV file: <path>. Please check ..."; pyarrow's own detail does not reach the driver.
DATA_MALFORMED_CSV = "Failed to read CSV file: "


def malformed_csv_path(error: BaseException) -> str | None:
    """The path named by Ray Data's malformed-CSV error; None for any other error."""
    message = str(error)
    if not isinstance(error, ValueError) or not message.startswith(DATA_MALFORMED_CSV):
        return None
    return message[len(DATA_MALFORMED_CSV):].split(". ")[0]


# Where Ray keeps the exception it wraps: ``cause`` on RayTaskError / RayActorError (and on the dual classes
# as_instanceof_cause builds, which subclass the cause's class), ``controller_failure`` on Ray Train's
# ControllerError, ``worker_failures`` ({rank: exception}) on Ray Train's WorkerGroupError.
CAUSE_ATTRIBUTES = ("cause", "controller_failure")
WORKER_FAILURES_ATTRIBUTE = "worker_failures"


def wrapped_exceptions(error: BaseException) -> list[object]:
    """What a Ray error wraps, by the attributes above (Nones where it has none of them)."""
    found: list[object] = [getattr(error, name, None) for name in CAUSE_ATTRIBUTES]
    failures = getattr(error, WORKER_FAILURES_ATTRIBUTE, None)
    if isinstance(failures, dict):
        found.extend(failures.values())
    return found


# Ray Data wraps an exception raised in a map function in ray.exceptions.UserCodeException (as a task error's
# ``cause``); the original exception does not survive the trip to the driver as its __cause__, only the remote
# traceback text in the task error's message does.
DATA_USER_CODE_EXCEPTION = "UserCodeException"


def lost_user_code_cause(error: BaseException) -> bool:
    """Whether ``error`` wraps a Ray Data UserCodeException whose original exception is left only as text."""
    cause = getattr(error, CAUSE_ATTRIBUTES[0], None)
    return type(cause).__name__ == DATA_USER_CODE_EXCEPTION and cause.__cause__ is None
