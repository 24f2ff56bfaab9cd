"""How many bytes a collective model is asked about: the nccl-tests convention.

Every comm model in trainsim takes the message size that nccl-tests prints in its ``size``
column, so that fitted curves, benchmark rows and predictions agree:

=================  ====================================================================
all_reduce         the buffer (every rank holds and receives all of it)
all_gather         the gathered output (group size x each rank's input)
reduce_scatter     the input (group size x each rank's output)
broadcast, reduce  the buffer
all_to_all(v)      000 §III-C: the maximum over devices of max(bytes sent, bytes received)
send, recv         the message
=================  ====================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainsim.errors import ModelError
from trainsim.ir.graph import Collective
from trainsim.ir.kinds import CollectiveKind

_ALL_TO_ALL = (CollectiveKind.ALL_TO_ALL, CollectiveKind.ALL_TO_ALLV)


def all_to_all_size_bytes(send_bytes: Sequence[Sequence[float]]) -> float:
    """000 §III-C sizing rule from a send matrix: ``send_bytes[i][j]`` = bytes rank i sends to j.

    The model size is max over devices of max(total sent, total received): the exchange is
    bound by the busiest device.
    """
    n = len(send_bytes)
    if n == 0 or any(len(row) != n for row in send_bytes):
        raise ModelError(f"all_to_all send matrix must be square and non-empty, got {n} rows")
    sent = [sum(row) for row in send_bytes]
    received = [sum(send_bytes[i][j] for i in range(n)) for j in range(n)]
    return float(max(*sent, *received))


def model_size_bytes(c: Collective, members: Mapping[int, Collective] | None = None) -> float:
    """Model size of one collective instance, seen from one member ``c``.

    ``members`` maps each global rank of the group to its own ``Collective`` of the same
    instance; all_to_allv needs it to count what every device receives. Without it (or with
    members that lack ``peer_bytes``) all_to_all(v) falls back to max(sent, bytes) of ``c``,
    which is exact when the exchange is balanced.
    """
    n = c.group_size or 1
    if c.kind in _ALL_TO_ALL:
        rows = [members.get(r) for r in c.group_ranks] if members else []
        if rows and all(
            m is not None and m.peer_bytes is not None and len(m.peer_bytes) == n for m in rows
        ):
            return all_to_all_size_bytes([list(m.peer_bytes or ()) for m in rows if m is not None])
        return float(max(c.bytes, sum(c.peer_bytes or ())))
    if c.kind is CollectiveKind.ALL_GATHER:
        return float(c.out_bytes if c.out_bytes else c.bytes * n)
    return float(c.bytes)
