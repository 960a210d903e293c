"""``/metrics`` of dsim serve: the simulation's replicas under vLLM's Prometheus metric names.

A scrape first brings the simulation to the current time, then reads each replica: gauges from its
live state (``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:gpu_cache_usage_perc``
and its newer name ``vllm:kv_cache_usage_perc``), counters from its totals (prefix-cache queries and
hits in tokens, preemptions, finished requests, prompt and generated tokens) and histograms of the
requests of this server (TTFT, inter-token latency, end-to-end latency, queue time), in simulated
seconds.  Labels: ``model_name`` (as vLLM) and ``engine`` (the replica's name; vLLM numbers its engines),
plus ``pool``.  And one of dsim's own: ``dsim:token_release_lag_seconds``, how late the server sent
each token after its simulated time (if it grows, the server does not keep up with its load).
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

LABELS = ["model_name", "engine", "pool"]


class SimCollector:
    """A prometheus-client collector over some of a RealtimeSim's replicas (all, or one per port)."""

    def __init__(self, rt, replica_names=None):
        self.rt = rt
        self.only = None if replica_names is None else set(replica_names)

    def _replicas(self):
        return [rep for rep in self.rt.replicas() if self.only is None or rep.name in self.only]

    def collect(self):
        reps = self._replicas()
        g = {k: GaugeMetricFamily(f"vllm:{k}", h, labels=LABELS) for k, h in (
            ("num_requests_running", "Number of requests in model execution batches."),
            ("num_requests_waiting", "Number of requests waiting to be processed."),
            ("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."))}
        c = {k: CounterMetricFamily(f"vllm:{k}", h, labels=LABELS) for k, h in (
            ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
            ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
            ("num_preemptions", "Cumulative number of preemption from the engine."),
            ("prompt_tokens", "Number of prefill tokens processed."),
            ("generation_tokens", "Number of generation tokens processed."))}
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=LABELS + ["finished_reason"])
        h = {k: HistogramMetricFamily(f"vllm:{k}", doc, labels=LABELS) for k, doc in (
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds."),
            ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
            ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
            ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."))}
        for rep in reps:
            inst = rep.inst
            lab = [rep.pool.spec.model.name, rep.name, rep.pool.name]
            kv = inst.kv
            use = (kv.total - kv.free_count) / kv.total if kv.total else 0.0
            g["num_requests_running"].add_metric(lab, len(inst.running))
            g["num_requests_waiting"].add_metric(lab, len(inst.waiting) + len(inst.swapped))
            g["gpu_cache_usage_perc"].add_metric(lab, use)
            g["kv_cache_usage_perc"].add_metric(lab, use)
            c["prefix_cache_queries"].add_metric(lab, kv.queries)
            c["prefix_cache_hits"].add_metric(lab, kv.hits)
            c["num_preemptions"].add_metric(lab, inst.num_preemptions)
            st = self.rt._stats(rep.name)
            c["prompt_tokens"].add_metric(lab, st.prompt_tokens)
            c["generation_tokens"].add_metric(lab, st.generation_tokens)
            success.add_metric(lab + ["length"], st.success)
            for k, hist in (("time_to_first_token_seconds", st.ttft), ("inter_token_latency_seconds", st.itl),
                            ("e2e_request_latency_seconds", st.e2e), ("request_queue_time_seconds", st.queue)):
                h[k].add_metric(lab, [(_le(b), n) for b, n in hist.buckets()], hist.sum)
        lag = self.rt.lag
        yield HistogramMetricFamily("dsim:token_release_lag_seconds", "How late (wall seconds) this server sent "
                                    "tokens after their simulated time, over all ports: the real-time path's error.",
                                    [(_le(b), n) for b, n in lag.buckets()], lag.sum)
        yield from g.values()
        yield from c.values()
        yield success
        yield from h.values()


def _le(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(float(b))


def registry(rt, replica_names=None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SimCollector(rt, replica_names))
    return reg


def exposition(reg) -> bytes:
    return generate_latest(reg)
