"""Counting what a forward or a training step asks of the device: dispatched aten ops and host synchronisations.

On an accelerator every dispatched op is (at least) one kernel launch, and an op whose output shape or value the
host must know before it can go on (``.item()``, ``nonzero``, coalescing a sparse tensor, boolean-mask indexing)
stalls the host until the device has caught up. Neither needs a GPU to be counted: the dispatcher sees the same
ops on CPU, so :class:`DispatchAudit` measures both on any machine (``bench/train_step.py`` prints them, tests
assert the step has no synchronisation).

Reads of tensors that live on the host by design are not synchronisations and are left out: Adam keeps its step
counters on the CPU unless it is ``capturable`` or ``fused``; pass them as ``host_tensors``
(:func:`optimizer_host_tensors`, which also sees the counters Adam creates during the audited step).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops whose result the host must wait for: a value read back, or an output size that depends on tensor data.
SYNCHRONISING_OPS = frozenset(
    {
        aten._local_scalar_dense,
        aten.item,
        aten.nonzero,
        aten.nonzero_static,
        aten.masked_select,
        aten._coalesce,
        aten._unique,
        aten._unique2,
        aten.unique_consecutive,
        aten.unique_dim,
        aten.is_nonzero,
        aten.equal,
        aten.allclose,
        aten.repeat_interleave,  # only with tensor repeats and no output_size; see _synchronises
        aten.index,  # only with a boolean mask; see _synchronises
    }
)


def _synchronises(packet, args: tuple, kwargs: dict) -> bool:
    if packet not in SYNCHRONISING_OPS:
        return False
    if packet is aten.repeat_interleave:
        return isinstance(args[0], torch.Tensor) and kwargs.get("output_size") is None and (
            len(args) < 2 or isinstance(args[1], torch.Tensor)
        )
    if packet is aten.index:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
    return True


class DispatchAudit(TorchDispatchMode):
    """Inside ``with DispatchAudit() as audit:``, ``audit.ops`` counts every dispatched aten op by name and
    ``audit.syncs`` the host synchronisations (see the module docstring); ``kernel_count`` leaves out views
    (``view``, ``transpose``, ``detach``...), which only make a new tensor header and launch nothing."""

    def __init__(self, host_tensors: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.views: Counter[str] = Counter()
        self._host_tensors = host_tensors  # iterated at each synchronising op: it may be a live view

    @property
    def op_count(self) -> int:
        return sum(self.ops.values())

    @property
    def kernel_count(self) -> int:
        return self.op_count - sum(self.views.values())

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())

    def _on_host(self, args: tuple) -> bool:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return bool(tensors) and all(any(t is h for h in self._host_tensors) for t in tensors)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)  # "aten._local_scalar_dense"
        self.ops[name] += 1
        if func.is_view or func.overloadpacket is aten._unsafe_view:
            self.views[name] += 1
        if _synchronises(func.overloadpacket, args, kwargs) and not self._on_host(args):
            self.syncs[name] += 1
        return func(*args, **kwargs)


def optimizer_host_tensors(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    """The optimizer's per-parameter ``step`` counters that torch keeps on the CPU (see the module docstring), read
    afresh at each use: Adam creates a parameter's counter at its first update, which may come in a later step (a
    parameter whose gradient was cleared is skipped until then)."""
    return _OptimizerHostSteps(optimizer)


class _OptimizerHostSteps:
    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def __iter__(self):
        for state in self.optimizer.state.values():
            step = state.get("step")
            if isinstance(step, torch.Tensor) and step.device.type == "cpu":
                yield step
