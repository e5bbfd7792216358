"""Search spaces for `kermt tune`: a small YAML schema, upstream's two presets, and trial settings from samples.

A space maps setting names to how they are sampled (this module never imports Ray; tune.py hands the space to
Optuna as a define-by-run function, which makes conditional parameters real conditionals)::

    max_lr: {loguniform: [1.0e-4, 2.0e-3]}   # log-uniform float in [low, high]
    dropout: {uniform: [0.0, 0.3]}           # uniform float in [low, high]
    batch_size: {choice: [32, 64, 128]}      # one of the listed values (any type)
    self_attention: {choice: [false, true]}
    attn_out: {choice: [4, 8], when: {self_attention: true}}   # only sampled when the condition holds
    ffn_num_layers: 1                        # a plain value: fixed for every trial
    final_lr_factor: {choice: [2, 10]}       # derived: final_lr = max_lr / final_lr_factor
    init_lr_factor: 10                       # derived: init_lr = max_lr / init_lr_factor

Keys are finetune settings (training schedule and model) or the two derived factors. ``when`` names earlier
parameters of the space, or settings of the sweep (then it is decided once, before any trial). Every value is
checked against the setting's type and bounds when the space is read, so a typo fails before a trial starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import TypeAdapter, ValidationError

from kermt.errors import UserError
from ray_app.common.settings import REMOVED_SETTINGS, did_you_mean
from ray_app.finetune.config import FinetuneConfig

Kind = Literal["fixed", "choice", "uniform", "loguniform"]
SAMPLERS = ("choice", "uniform", "loguniform")
# Derived learning rates, as upstream's HPO: <target> = max_lr / <factor>.
DERIVED = {"final_lr_factor": "final_lr", "init_lr_factor": "init_lr"}
TUNABLE = (
    "epochs", "batch_size", "warmup_epochs", "init_lr", "max_lr", "final_lr", "weight_decay", "fine_tune_coff",
    "early_stop_epoch", "use_mtl_loss", "hidden_size", "depth", "num_attn_head", "num_mt_block", "activation",
    "bias", "dropout", "self_attention", "attn_hidden", "attn_out", "ffn_hidden_size",
    "ffn_num_layers", "ffn_num_task_specific_layers", "ffn_task_specific_hidden_size", "dist_coff",
    "bond_drop_rate",
)  # fmt: skip


class SearchSpaceError(UserError):
    """A search space that cannot be used; the message names the offending key."""


@dataclass(frozen=True)
class Parameter:
    """One dimension. ``values``: (value,) for fixed, the options for choice, (low, high) for (log)uniform.
    ``when``: (name, value) pairs that must all hold for the parameter to be sampled."""

    name: str
    kind: Kind
    values: tuple[Any, ...]
    when: tuple[tuple[str, Any], ...] = ()

    def active(self, sampled: Mapping[str, Any]) -> bool:
        return all(name in sampled and sampled[name] == value for name, value in self.when)


@dataclass(frozen=True)
class SearchSpace:
    """Parameters in sampling order (a condition only refers to parameters before it)."""

    parameters: tuple[Parameter, ...]

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def __call__(self, trial: Any) -> dict[str, Any]:
        """Optuna define-by-run: suggest every active parameter on ``trial``; fixed values are returned as
        constants (Optuna does not record them). A module-level object, so Tune can pickle the searcher."""
        sampled: dict[str, Any] = {}
        constants: dict[str, Any] = {}
        for p in self.parameters:
            if not p.active(sampled):
                continue
            if p.kind == "fixed":
                sampled[p.name] = constants[p.name] = p.values[0]
            elif p.kind == "choice":
                sampled[p.name] = trial.suggest_categorical(p.name, list(p.values))
            else:
                low, high = p.values
                sampled[p.name] = trial.suggest_float(p.name, low, high, log=p.kind == "loguniform")
        return constants

    def describe(self) -> str:
        """One line per parameter, e.g. ``attn_out: choice [4, 8] when self_attention=True``."""
        lines = []
        for p in self.parameters:
            how = repr(p.values[0]) if p.kind == "fixed" else f"{p.kind} {list(p.values)}"
            when = " when " + ", ".join(f"{k}={v!r}" for k, v in p.when) if p.when else ""
            derived = f" ({DERIVED[p.name]} = max_lr / {p.name})" if p.name in DERIVED else ""
            lines.append(f"{p.name}: {how}{when}{derived}")
        return "\n".join(lines)

    def resolved(self, base: FinetuneConfig) -> "SearchSpace":
        """Conditions on settings outside the space are decided against the sweep's ``base`` settings."""
        kept: list[Parameter] = []
        for p in self.parameters:
            inner = tuple((name, value) for name, value in p.when if name in self.names)
            outer = [(name, value) for name, value in p.when if name not in self.names]
            if all(getattr(base, name) == value for name, value in outer):
                kept.append(Parameter(p.name, p.kind, p.values, inner))
        return SearchSpace(tuple(kept))


def trial_settings(params: Mapping[str, Any], base: FinetuneConfig) -> dict[str, Any]:
    """Finetune settings of one trial: the sampled values, with derived learning rates computed from max_lr."""
    settings = {k: v for k, v in params.items() if k not in DERIVED}
    max_lr = settings.get("max_lr", base.max_lr)
    for factor, target in DERIVED.items():
        if factor in params:
            settings[target] = max_lr / params[factor]
    return settings


def parse_space(data: Any, origin: str = "search space") -> SearchSpace:
    """Validate a mapping (read from YAML) into a SearchSpace; errors name ``origin`` and the key."""
    if not isinstance(data, dict) or not data:
        raise SearchSpaceError(f"{origin}: expected a non-empty mapping of setting -> sampler")
    parameters: list[Parameter] = []
    for name, spec in data.items():
        where = f"{origin}: {name}"
        _check_name(name, where)
        parameter = _parse_parameter(str(name), spec, where, {p.name: p for p in parameters})
        parameters.append(parameter)
    names = {p.name for p in parameters}
    for factor, target in DERIVED.items():
        if factor in names and target in names:
            raise SearchSpaceError(f"{origin}: give {target} or {factor} (= max_lr / {target}), not both")
    return SearchSpace(tuple(parameters))


def load_space(path: str | Path) -> SearchSpace:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as error:
        raise SearchSpaceError(f"cannot read search space {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SearchSpaceError(f"search space {path} is not valid YAML: {' '.join(str(error).split())}") from None
    return parse_space(data, str(path))


def _check_name(name: Any, where: str) -> None:
    if name in DERIVED:
        return
    if name in REMOVED_SETTINGS:
        raise SearchSpaceError(f"{where}: {REMOVED_SETTINGS[name]}")
    if name not in FinetuneConfig.model_fields:
        valid = list(TUNABLE) + list(DERIVED)
        raise SearchSpaceError(f"{where}: unknown setting{did_you_mean(str(name), valid)}")
    if name not in TUNABLE:
        raise SearchSpaceError(f"{where}: not a tunable setting (data, split, output and cluster settings are "
                               f"fixed for a sweep; give them as flags)")


def _parse_parameter(name: str, spec: Any, where: str, earlier: dict[str, Parameter]) -> Parameter:
    if not isinstance(spec, dict):
        return Parameter(name, "fixed", (_checked(name, spec, where),))
    unknown = [k for k in spec if k not in (*SAMPLERS, "when")]
    if unknown:
        hint = did_you_mean(str(unknown[0]), [*SAMPLERS, "when"])
        raise SearchSpaceError(f"{where}: unknown key {unknown[0]!r}{hint} (expected one of {', '.join(SAMPLERS)} "
                               f"and optionally 'when')")
    kinds = [k for k in SAMPLERS if k in spec]
    if len(kinds) != 1:
        raise SearchSpaceError(f"{where}: give exactly one of {', '.join(SAMPLERS)}")
    kind = kinds[0]
    values = spec[kind]
    if kind == "choice":
        if not isinstance(values, list) or not values:
            raise SearchSpaceError(f"{where}: choice needs a non-empty list of values")
        values = [_checked(name, v, where) for v in values]
    else:
        values = _bounds(name, kind, values, where)
    return Parameter(name, kind, tuple(values), _parse_when(spec.get("when"), where, earlier))


def _bounds(name: str, kind: str, values: Any, where: str) -> list[float]:
    if name in DERIVED or _field_type(name) is float:
        if (not isinstance(values, list) or len(values) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
            raise SearchSpaceError(f"{where}: {kind} needs [low, high] numbers, got {values!r}")
        low, high = (float(v) for v in values)
        if not low < high:
            raise SearchSpaceError(f"{where}: {kind} needs low < high, got [{low}, {high}]")
        if kind == "loguniform" and low <= 0:
            raise SearchSpaceError(f"{where}: loguniform needs low > 0, got {low}")
        return [_checked(name, low, where), _checked(name, high, where)]
    raise SearchSpaceError(f"{where}: {kind} samples floats, but {name} is not a float setting: use choice")


def _parse_when(when: Any, where: str, earlier: dict[str, Parameter]) -> tuple[tuple[str, Any], ...]:
    if when is None:
        return ()
    if not isinstance(when, dict) or not when:
        raise SearchSpaceError(f"{where}: when needs a mapping of setting -> required value")
    pairs = []
    for key, value in when.items():
        if key in earlier:
            options = earlier[key].values if earlier[key].kind in ("choice", "fixed") else None
            if options is not None and value not in options:
                raise SearchSpaceError(f"{where}: when {key}: {value!r} can never hold ({key} is one of "
                                       f"{list(options)})")
        elif key in FinetuneConfig.model_fields:
            _checked(key, value, f"{where}: when {key}")
        else:
            hint = did_you_mean(str(key), list(earlier) + list(FinetuneConfig.model_fields))
            raise SearchSpaceError(f"{where}: when refers to {key!r}, which is neither an earlier parameter nor a "
                                   f"setting{hint}")
        pairs.append((str(key), value))
    return tuple(pairs)


def _field_type(name: str) -> Any:
    annotation = FinetuneConfig.model_fields[name].annotation
    return float if annotation in (float, "float") else annotation


def _checked(name: str, value: Any, where: str) -> Any:
    """``value`` validated against the setting's type and bounds (factors: positive numbers)."""
    if name in DERIVED:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise SearchSpaceError(f"{where}: {value!r} is not a positive number")
        return value
    field = FinetuneConfig.model_fields[name]
    try:
        return TypeAdapter(Annotated[field.annotation, field]).validate_python(value)
    except ValidationError as error:
        raise SearchSpaceError(f"{where}: {value!r} is invalid: {error.errors()[0]['msg']}") from None


# Upstream main_hpo.py's spaces (docs/upstream-compatibility.md#hyperparameter-search), the choices of --hpo_mode.
# Upstream samples attn_out even without a self-attention readout, where it changes nothing; here it is sampled only
# when the readout is on.
PRESETS: dict[str, dict[str, Any]] = {
    "all": {
        "max_lr": {"choice": [1e-4, 3e-4, 5e-4, 7e-4, 9e-4]},
        "final_lr_factor": {"choice": [2, 4, 6, 8, 10]},
        "init_lr_factor": 10,
        "dropout": {"choice": [0.0, 0.05, 0.1, 0.2]},
        "attn_out": {"choice": [4, 8], "when": {"self_attention": True}},
        "dist_coff": {"choice": [0.05, 0.10, 0.15]},
        "bond_drop_rate": {"choice": [0.0, 0.2]},
        "ffn_num_layers": {"choice": [2, 3]},
        "ffn_hidden_size": {"choice": [700, 1300]},
    },
    "openadmet": {
        "max_lr": {"choice": [5e-4, 1e-3, 1.5e-3, 2e-3]},
        "final_lr_factor": {"choice": [10, 50, 100]},
        "init_lr_factor": 10,
        "dropout": {"choice": [0.0, 0.1, 0.2, 0.3]},
        "self_attention": {"choice": [False, True]},
        "attn_out": {"choice": [4, 8], "when": {"self_attention": True}},
        "fine_tune_coff": {"choice": [0.0, 0.01, 0.1]},
        "batch_size": {"choice": [32, 64, 128]},
        "ffn_num_layers": 1,
    },
}
HpoMode = Literal[tuple(PRESETS)]  # type: ignore[valid-type]  # built from PRESETS: a type checker cannot see it


def preset(name: str) -> SearchSpace:
    return parse_space(PRESETS[name], f"--hpo_mode {name}")
