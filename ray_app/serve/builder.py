"""The Serve config file's entry point: ``import_path: ray_app.serve.builder:build`` in ``serve_config.yaml``
(``serve run`` / ``serve deploy``) and in the KubeRay RayService's ``serveConfigV2``.

``args`` are `kermt serve`'s own settings (:class:`ServeConfig`, the flag names as keys), so the command and the
config file build the same application from one definition: the models are read and checked here (URIs fetched,
where Serve runs the builder: the driver of ``serve run``, a task on the cluster for ``serve deploy``), the API
key read from this process's environment. Where to listen and the application's name belong to the config
file's own sections (``http_options``, ``applications[].name`` / ``route_prefix``), so they are refused in
``args`` rather than silently ignored.
"""

# no `from __future__ import annotations`: Serve validates ``args`` into the builder's parameter type, which it
# reads from the live annotation (a string annotation would hand the builder a plain dict)
from ray.serve import Application

from kermt.errors import UserError
from ray_app.common.ray_internals import SERVE_HAPROXY_VARIABLE, SERVE_THROUGHPUT_VARIABLE
from ray_app.serve.application import serving_app
from ray_app.serve.command import load_models
from ray_app.serve.config import ServeConfig

# settings of `kermt serve` a Serve config file sets in its own sections, each with where
CONFIG_FILE_PLACE = {"host": "http_options.host", "port": "http_options.port",
                     "address": "the cluster `serve run`/`serve deploy` is pointed at (--address)",
                     "app_name": "applications[].name",
                     "ingress": f"the environment the cluster's nodes start with ({SERVE_HAPROXY_VARIABLE}=1 "
                                f"{SERVE_THROUGHPUT_VARIABLE}=1 for haproxy)"}


def build(args: ServeConfig) -> Application:
    """The `kermt serve` application ``args`` describe (a UserError names a misplaced setting or a bad model)."""
    misplaced = sorted(set(args.model_fields_set) & set(CONFIG_FILE_PLACE))
    if misplaced:
        raise UserError(f"args: {', '.join(misplaced)} set in the application's args; a Serve config file sets "
                        + "; ".join(f"{key} in {CONFIG_FILE_PLACE[key]}" for key in misplaced))
    return serving_app(args, load_models(args))


__all__ = ["CONFIG_FILE_PLACE", "build"]
