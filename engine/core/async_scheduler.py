"""AsyncScheduler: the scheduler of async scheduling, as vllm/v1/core/sched/async_scheduler.py.

With async scheduling the engine schedules step N+1 while step N runs on the device
(LLMEngine's batch queue), so the token step N samples is not known yet when N+1 is
built. After each schedule every request that samples this step gains one output
placeholder (Request.num_output_placeholders); Scheduler.schedule schedules past them and
update_from_output retires them. The model runner feeds the token in flight from the
device (ModelRunner._prepare_inputs). A step whose sampling reads the output so far
while a placeholder is unresolved is flagged pending_output_tokens: the engine takes the
step in flight's output first. That is a grammar's own request, or any request of a step
in which a row has bad words (the sampler matches every row's ids on the host then).
Penalties and a thinking budget read the token in flight on the device (vLLM's MRV2).
"""

from __future__ import annotations

from libvllm.engine.core.sched_output import SchedulerOutput
from libvllm.engine.core.scheduler import Scheduler
from libvllm.engine.sample.metadata import reads_output_token_ids


class AsyncScheduler(Scheduler):
    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        super()._update_after_schedule(out)
        in_flight = reads = False  # bad words read every sampled row's ids on the host
        for req_id in out.num_scheduled_tokens:
            request = self.requests[req_id]
            if request.is_prefill_chunk:
                continue
            waits = request.num_output_placeholders > 0
            in_flight |= waits
            reads |= reads_output_token_ids(request.sampling_params)
            out.pending_output_tokens |= waits and request.use_structured_output
            request.num_output_placeholders += 1
        out.pending_output_tokens |= in_flight and reads
