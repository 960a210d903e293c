"""One vLLM replica: ``Instance``, the engine core's busy loop as a single SimPy process (scheduler
mirror: token budget, max_num_seqs, chunked prefill, paged KV blocks with prefix caching,
preemption, scheduling policies, CPU offload, pipeline and data parallelism, the speculative
verify step).  It knows nothing of routers; step times come from a dsim.latency model."""
