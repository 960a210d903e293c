"""What a run measured and how it is written: the per-request ledger, summaries (percentiles,
goodput, fairness, energy, cost, the error band), fleet sections, writers (JSON, CSV, atomic
output folders, vLLM's trace streams and bench format), timelines and plots."""
