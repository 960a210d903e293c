"""Upper (and lower) bounds on inputs that size memory or set the pace of the clock.

A typo such as ``num_requests: 1e12`` or ``interval_s: 1e-300`` must be a one-line error, not a
terabyte allocation or a simulation that never advances.  The bounds are far beyond any real
deployment; raise them here (one place) if a study needs more.
"""
MAX_REQUESTS = 10**8          # arrivals of one workload (held as arrays)
MAX_TOKENS = 10**8            # one request's prompt or output length
MAX_SEQS = 1 << 20            # sequences in one batch (max_num_seqs, a LUT microbatch): far past any engine
MAX_BLOCKS = 10**9            # KV blocks of one replica (num_gpu_blocks)
MAX_REPLICAS = 10_000         # replicas of one pool
MAX_DEVICES = 10**6           # draft devices of one kind
MAX_NODES = 100_000           # nodes of a generated topology
MAX_GROUPS = 10**8            # shared-prefix groups / users
MAX_SPEC_K = 64               # speculation length
MIN_TIMER_S = 1e-6            # controller intervals, router staleness
MAX_TIME_S = 1e9              # durations, RTTs, think times (~30 years)
MIN_BW_MBPS = 1e-3            # 1 kbit/s
MIN_CV = 1e-3                 # gamma arrivals: shape = 1 / cv^2
MAX_CV = 1e3
MAX_FILE_BYTES = 2 * 1024**3  # data files read whole (LUTs, bundles)
MAX_SCENARIO_BYTES = 4 * 1024**2  # scenario/space files: a few KB; PyYAML parses ~1 MB/s
MAX_POINTS = 100_000          # runs of one sweep (points x seeds): each is a simulation
MAX_SEEDS = 10_000            # seeds per sweep point
MAX_CONCURRENCY = 100_000     # requests dsim observe keeps open at once (one connection each)
MAX_JOBS = 1_024              # parallel simulations of one command
MAX_GPUS = 4_096              # a plan's GPU budget (candidates grow with it)
MAX_FLOW_WORK = 1_000_000     # flows the network re-solves in one run (~15 s) before it must be
FLOW_WORK_PER_MSG = 200       # explained by its messages: shipped scenarios re-solve 1.5-7 per message
MAX_TOP = 100_000             # rows of a plan's top table, rounds of its search
MAX_EVALS = 10_000            # simulations of one calibrate/fit search
MAX_DEPTH = 1_000             # trees of an acceptance bundle
MAX_UNITS = 4_096             # hidden units of a latency head
MAX_SEED = 2**32 - 1          # numpy's seed range
MAX_YAML_VALUES = 10**6       # values of a YAML file once its aliases are expanded ("billion laughs")


def check_flag(flag: str, value, lo, hi) -> None:
    """A numeric CLI flag within [lo, hi] before anything runs (1e30 jobs or evaluations overflowed a
    C int or ran forever)."""
    from .errors import ConfigError
    if value is not None and not lo <= value <= hi:
        raise ConfigError(flag, value, f"a number in [{lo}, {hi}]")


def expected_count(path: str, rate: float, duration: float, n) -> None:
    """Refuse a rate x duration that would generate more than MAX_REQUESTS arrivals (unless
    num_requests caps them first)."""
    from .errors import ConfigError
    if n is None and rate * duration > MAX_REQUESTS:
        raise ConfigError(path, None, f"at most {MAX_REQUESTS:.0e} arrivals: rate x duration_s asks for "
                          f"~{rate * duration:.3g} (set num_requests, or a shorter duration)", show_value=False)
