"""Front end: real runs in, calibrated latency models and co-simulation reports out.  Readers of
real logs (vLLM trace streams, ``vllm bench`` and inference-perf outputs), decode windows,
coefficient fitting (``dsim fit``, ``dsim calibrate``) and ``dsim cosim``."""
