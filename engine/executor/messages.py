"""What rank 0 broadcasts to the tensor-parallel workers (engine/executor/), msgspec-encoded
by engine/serial_utils.py and sent on the gloo CPU group (never pickled).

Start-up, in the order of the engine core's own steps (each rank's collectives must pair
up): WorkerInit (rank 0's ResolvedConfig) once the runner's sizes are known (a worker on
CUDA then runs the same profile pass), the KV block count once the cache is sized (then
every rank captures its CUDA graphs); then one StepMessage per step, `scheduler_output`
None meaning shut down.
"""

from __future__ import annotations

from dataclasses import dataclass

from libvllm.engine.core.sched_output import GrammarOutput, SchedulerOutput
from libvllm.engine.distributed.communication_op import broadcast_bytes
from libvllm.engine.resolved_config import ResolvedConfig
from libvllm.engine.serial_utils import MsgpackDecoder, MsgpackEncoder

_INLINE = 1 << 62  # every buffer inline: the message is one byte string


@dataclass
class WorkerInit:
    config: ResolvedConfig  # rank 0's (the workers resolve nothing)
    profile: bool  # CUDA without kv_cache_memory_bytes: run determine_available_memory


@dataclass
class StepMessage:
    scheduler_output: SchedulerOutput | None  # None: shut down
    grammar_output: GrammarOutput | None = None


def send(obj: object) -> None:
    """Rank 0: broadcast `obj` to the group."""
    broadcast_bytes(MsgpackEncoder(size_threshold=_INLINE).encode(obj)[0])


def recv(t: type) -> object:
    """A worker: the next broadcast, decoded as `t`."""
    return MsgpackDecoder(t).decode(broadcast_bytes(None))
