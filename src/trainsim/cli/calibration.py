"""``--kernel-models`` / ``--comm-models``: use artifacts a user fitted on their own cluster.

``trainsim fit`` and ``trainsim fit-comm`` write them; ``predict`` and ``search`` take them.
They answer before the shipped models for the device / system they were measured on (the
registries read ``$TRAINSIM_KERNEL_MODELS`` / ``$TRAINSIM_COMM_MODELS``, so that screening
worker processes see them too); predictions name them in their provenance
(``calibrated:<dataset>``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from trainsim.envvars import joined_paths, restored_environ
from trainsim.errors import ConfigError
from trainsim.hardware import SystemSpec, get_device


@contextmanager
def use_artifacts(kernel_models: Sequence[Path] | None, comm_models: Sequence[Path] | None, *,
                  system: SystemSpec) -> Iterator[None]:  # fmt: skip
    """Check each artifact loads and was measured on ``system`` (or its device), register them
    for the duration of the block (the variables are restored after it; caches that depend on
    them are keyed on their values)."""
    from trainsim.comm import registry as comm_registry
    from trainsim.kernels import registry as kernel_registry

    with restored_environ((kernel_registry.USER_MODELS_ENV, comm_registry.USER_MODELS_ENV)):
        _register(kernel_models, comm_models, system=system)
        yield


def _register(kernel_models: Sequence[Path] | None, comm_models: Sequence[Path] | None, *,
              system: SystemSpec) -> None:  # fmt: skip
    """Set the variables, then check what the registries load from them (each file read once:
    the registries cache by the variable's value)."""
    from trainsim.comm import registry as comm_registry
    from trainsim.kernels import registry as kernel_registry

    if kernel_models:
        os.environ[kernel_registry.USER_MODELS_ENV] = _joined(kernel_models)
        device = get_device(system.device).name  # the system may name its device by an alias
        for p, m in zip(kernel_models, kernel_registry.user_models(), strict=True):
            if m.device != device:
                raise ConfigError(f"--kernel-models {p}: fitted on device {m.device}, but {system.name} "
                                  f"has {device}; if the data were measured on that device, refit them with "
                                  f"`trainsim fit … --device {device}`")  # fmt: skip
    if comm_models:
        os.environ[comm_registry.USER_MODELS_ENV] = _joined(comm_models)
        for p, c in zip(comm_models, comm_registry.user_models(), strict=True):  # calibrated, or refused
            name = c.system.name if c.system is not None else None
            if name != system.name:
                raise ConfigError(f"--comm-models {p}: measured on system {name or '(none)'}, not {system.name}; "
                                  "refit it with `trainsim fit-comm … --system NAME`")  # fmt: skip


def _joined(paths: Sequence[Path]) -> str:
    """Absolute paths in one variable; a path holding ':' makes it a JSON list (envvars.joined_paths)."""
    return joined_paths(str(Path(p).resolve()) for p in paths)
