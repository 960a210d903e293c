"""Names the declared schema and the builders below it share: one list, read by both (this module
stays free of the schema so a builder imports it for nothing)."""

# the routing policies dsim.cluster.routers implements
ROUTERS = ("random", "round_robin", "least_outstanding", "jsq", "jiq", "power_of_two", "weighted_power_of_two",
           "least_kv", "prefix_affinity", "semi_clairvoyant", "slack", "spec_aware")

# the signed-error columns of an error band (the validation table's, dsim.latency.credibility)
BAND_COLUMNS = ("e2e_mean_err", "e2e_p99_err", "ttft_p50_err", "ttft_p99_err", "tpot_p50_err", "tpot_p99_err",
                "throughput_err")

# the physics model's coefficient counts (dsim.latency.physics: 11 alphas, 16 betas)
N_ALPHA, N_BETA = 11, 16

# engine.kv_offload.policy: copy every new block to the CPU tier, or only blocks the GPU evicts
OFFLOAD_POLICIES = ("write_through", "on_evict")
PREEMPTION_MODES = ("recompute", "swap")
# engine.scheduling_policy (dsim.serving.policies implements them)
SCHEDULING_POLICIES = ("fcfs", "priority", "edf", "age_weighted")
# vLLM's worker executors (--distributed-executor-backend; V0 before 0.5: --worker-use-ray):
# ray = workers are Ray actors (also at TP 1), mp = multiprocessing workers, uniproc = the worker
# runs in the engine's process (TP 1 only)
EXECUTORS = ("ray", "mp", "uniproc")
