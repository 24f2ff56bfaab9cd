"""Kernel micro-benchmark suites: the one table of name → :class:`Suite`.

Each module is one family of ops (see its docstring for parameters and what FLOPs and bytes
count); :func:`get_suite` resolves names for ``trainsim bench``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from trainsim.bench.suites import (
    attention,
    conv,
    elementwise,
    embedding,
    gemm,
    index,
    memory,
    norm,
    optimizer,
    roofline,
    softmax,
)
from trainsim.bench.suites.base import DTYPE_LABEL, Case, Phase, Suite, SweepSpec
from trainsim.errors import ConfigError

SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        gemm.SUITE, attention.SUITE, norm.SUITE, softmax.SUITE, elementwise.SUITE,
        embedding.SUITE, memory.SUITE, index.SUITE, conv.SUITE, optimizer.SUITE, roofline.SUITE,
    )
}  # fmt: skip


def get_suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise ConfigError(
            f"unknown kernel benchmark suite {name!r}; available: {', '.join(SUITES)}"
        ) from None


def suite_cases(
    names: Sequence[str], spec: SweepSpec, *, ops: Sequence[str] = (), dtypes: Sequence[str] = ()
) -> Iterator[Case]:
    """The cases of the named suites under ``spec`` (only ``ops`` and only ``dtypes`` — torch
    names or kernel-model labels, ``float32`` or ``fp32`` — when given)."""
    want = {DTYPE_LABEL.get(d, d) for d in dtypes}
    for name in names:
        for case in get_suite(name).cases(spec):
            if (not ops or case.op in ops) and (not want or DTYPE_LABEL[case.dtype] in want):
                yield case


__all__ = ["SUITES", "Case", "Phase", "Suite", "SweepSpec", "get_suite", "suite_cases"]
