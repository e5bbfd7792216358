"""Typed settings for every `kermt` subcommand: flags, a YAML file and defaults resolved into one pydantic model.

Each subcommand declares a pydantic model (``extra="forbid"``) whose field names are its flag names (upstream's,
where upstream has the flag). :func:`resolve` builds the argparse parser from the model, reads ``--config
FILE.yaml``, lets flags override the file, validates, and remembers where each value came from (user, config,
default) so ``run.json`` can say so. Unknown keys are errors that suggest the closest name.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from kermt.cli import ArgumentParser
from kermt.errors import UserError
from kermt.names import did_you_mean  # also imported from here by the commands' own checks

# The choices of the commands' settings (metrics, split types, feature generators, ...): kermt.registry.
# Upstream flags that are refused, and why. A config file may still hold the key at its only working value
# (null/false: replay files written before the removal do), which is dropped.
REMOVED_SETTINGS = {
    "undirected": "undirected message passing is not supported: upstream KERMT crashes with it at the first forward "
                  "(its node blocks index atom messages with reverse-bond indices), so no working model uses it; "
                  "remove the setting",
}


Source = Literal["user", "config", "default"]


def _base_type(annotation: Any) -> Any:
    """The non-None type inside Optional[...]."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def ordered_fields(schema: type[BaseModel]) -> list[str]:
    """Field names, the command's own first and shared bases' (schedule, Ray) after them: pydantic lists inherited
    fields first, which would open ``--help`` and config.yaml with the least specific settings."""
    names: list[str] = []
    for cls in schema.__mro__:
        names += [n for n in getattr(cls, "__annotations__", {}) if n in schema.model_fields and n not in names]
    return names


def _help_text(field: FieldInfo) -> str:
    """The field's description plus its default, as argparse's "(default: %(default)s)" would show it; the
    parser's own defaults are SUPPRESS (see :func:`build_parser`), so the default comes from the field. Unset
    (None) and off (False) defaults are left out, as is what the description already says."""
    text = field.description or ""
    if field.is_required():
        shown = "" if "required" in text.lower() else "required"
    elif field.default is None or field.default is False or "default" in text.lower():
        shown = ""
    elif isinstance(field.default, (list, tuple)):
        shown = "default: " + " ".join(str(v) for v in field.default)
    else:
        shown = f"default: {field.default}"
    text = f"{text} ({shown})".strip() if shown else text
    return text.replace("%", "%%")  # argparse %-formats help strings


def _other_default(schema: type[BaseModel], name: str) -> str:
    """``; without a checkpoint: 60`` where the schema fills ``name`` differently in some case (its
    ``OTHER_DEFAULTS``: (case, {setting: value}), e.g. `kermt finetune`'s from-scratch recipe), else ""."""
    case, values = getattr(schema, "OTHER_DEFAULTS", ("", {}))
    if name not in values:
        return ""
    value = values[name]
    shown = " ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    return f"{case}: {shown}".replace("%", "%%")


def build_parser(prog: str, schema: type[BaseModel]) -> argparse.ArgumentParser:
    """One flag per field of ``schema``. Defaults are argparse.SUPPRESS so we can tell what the user typed."""
    parser = ArgumentParser(prog=prog, argument_default=argparse.SUPPRESS, allow_abbrev=False)
    parser.add_argument("--config", help="YAML file with the same keys as the flags; flags override it")
    for name in ordered_fields(schema):
        field = schema.model_fields[name]
        base = _base_type(field.annotation)
        help_text, other = _help_text(field), _other_default(schema, name)
        if other:
            help_text = f"{help_text[:-1]}; {other})" if help_text.endswith(")") else f"{help_text} ({other})"
        origin = typing.get_origin(base)
        if base is bool:
            parser.add_argument(f"--{name}", action="store_true", help=help_text)
            parser.add_argument(f"--no-{name}", dest=name, action="store_false", help=argparse.SUPPRESS)
        elif origin is list:
            parser.add_argument(f"--{name}", nargs="*", help=help_text)
        elif origin is tuple:
            parser.add_argument(f"--{name}", nargs=len(typing.get_args(base)), type=float, help=help_text)
        elif origin is Literal:
            parser.add_argument(f"--{name}", choices=typing.get_args(base), help=help_text)
        else:
            parser.add_argument(f"--{name}", type=base, help=help_text)
    return parser


def load_yaml(path: str | Path, schema: type[BaseModel]) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as error:
        raise UserError(f"--config {path}: cannot read it ({error.strerror or error})") from error
    except yaml.YAMLError as error:
        raise UserError(f"--config {path}: not valid YAML ({' '.join(str(error).split())})") from error
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of setting -> value, got {type(data).__name__}")
    for key in [k for k in data if k in REMOVED_SETTINGS and k not in schema.model_fields]:
        if data[key] not in (None, False):
            raise UserError(f"{path}: {key}: {data[key]!r}: {REMOVED_SETTINGS[key]}")
        del data[key]
    unknown = [k for k in data if k not in schema.model_fields]
    if unknown:
        key = unknown[0]
        raise UserError(f"{path}: unknown key {key!r}{did_you_mean(key, schema.model_fields)}")
    return data


def resolve(argv: list[str] | None, schema: type[BaseModel], prog: str) -> tuple[Any, dict[str, Source]]:
    """Parse flags (+ optional YAML) into a validated ``schema`` and each value's source."""
    parser = build_parser(prog, schema)
    namespace, unknown = parser.parse_known_args(argv)
    flags = [u for u in unknown if u.startswith("--")]
    if unknown:
        flag = (flags or unknown)[0]
        if flag.lstrip("-").partition("=")[0] in REMOVED_SETTINGS:
            raise UserError(f"{flag}: {REMOVED_SETTINGS[flag.lstrip('-').partition('=')[0]]}")
        valid = [f"--{name}" for name in schema.model_fields] + ["--config"]
        raise UserError(f"unknown argument {flag!r}{did_you_mean(flag, valid)}")
    args = vars(namespace)
    config_path = args.pop("config", None)
    from_file = load_yaml(config_path, schema) if config_path else {}
    values = {**from_file, **args}
    try:
        config = schema(**values)
    except ValidationError as exc:
        raise UserError(_explain(exc, config_path, prog)) from None
    sources: dict[str, Source] = {}
    for name in schema.model_fields:
        sources[name] = "user" if name in args else "config" if name in from_file else "default"
    return config, sources


def _explain(exc: ValidationError, config_path: str | None, prog: str) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        origin = f" (from {config_path} or the command line)" if config_path else ""
        message = err["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
        lines.append(f"setting {where!r}{origin}: {message}" if where else message)
    return f"invalid {prog.removeprefix('kermt ')} configuration: " + "; ".join(lines)


def to_yaml(config: BaseModel) -> str:
    """A YAML file that replays the run with ``--config``."""
    data = config.model_dump(mode="json", exclude_defaults=False)
    return yaml.safe_dump({name: data[name] for name in ordered_fields(type(config))}, sort_keys=False)
