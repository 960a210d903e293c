"""Where the points of an exploration run: joblib on this machine, or an existing cluster engine
(Dask, Ray) behind joblib's backend interface.  No scheduling of our own: each engine's own
joblib backend distributes the calls, and results come back in submission order, so the table
is the same whatever the backend."""
from __future__ import annotations

import contextlib
import contextvars
import sys

from ..config.errors import ConfigError
from ..log import third_party_level

BACKENDS = ("joblib", "dask", "ray")


@contextlib.contextmanager
def backend_context(backend: str, jobs: int, address: str | None):
    """Yield (the joblib backend name to use inside, its keyword arguments, ``put(bytes) -> reference``
    into the engine's own store or None); set up and tear down the engine around it.

    ``put`` is called once per distinct file a run's points read.  Dask: the tasks and the scatter go
    through this run's own client, not distributed's default client, which may be another or a
    closed one (a CI run hung on a point waiting for a file that had gone elsewhere); the scatter is
    broadcast, so every worker holds the bytes before a point starts, and published as a dataset
    named after it, because Dask's active memory manager drops the extra copies within seconds and a
    worker without one fetches it by that name (``portable.Shared.fetch``); the datasets are
    unpublished when the run ends.  Ray: ``ray.put``; a worker that lacks the object pulls it through
    its object manager."""
    if backend == "joblib":
        if address:
            raise ConfigError("--address", address, "only with --backend dask or ray", show_value=False)
        yield "loky", {}, None
        return
    if backend == "dask":
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError("--backend", "dask", "dask installed: pip install 'dsim[dask]'", show_value=False) \
                from None
        cluster = None
        if address:
            _reachable(address, "Dask scheduler")
            try:
                client = Client(address)
            except (OSError, TimeoutError, ValueError) as e:   # refused, timed out, malformed address
                raise ConfigError("--address", address, f"cannot reach the Dask scheduler at {address} "
                                  f"({_first_line(e)})", show_value=False) from None
            except MemoryError:           # something else answered (an HTTP proxy): a garbage frame length
                raise ConfigError("--address", address, f"cannot reach the Dask scheduler at {address} (the "
                                  "port answered, but not as a Dask scheduler)", show_value=False) from None
        else:
            cluster = LocalCluster(n_workers=max(1, jobs), threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=third_party_level())
            client = Client(cluster)
        published: list = []

        def put(blob: bytes):
            fut = client.scatter(blob, broadcast=True)
            name = f"dsim-file-{fut.key}"
            if name not in published:
                client.publish_dataset(fut, name=name, override=True)
                published.append(name)
            return (fut, name)
        try:
            yield "dask", {"client": client}, put
        finally:
            for name in published:
                try:
                    client.unpublish_dataset(name)
                except Exception:               # a cluster that went away: nothing left to tidy
                    pass
            client.close()
            if cluster is not None:
                cluster.close()
        return
    if backend == "ray":
        try:
            import ray
            from ray.util.joblib import register_ray
        except ImportError:
            raise ConfigError("--backend", "ray", "ray installed: pip install 'dsim[ray]'", show_value=False) from None
        started = False
        if not ray.is_initialized():
            if address:
                _ray_connect(ray, address)
            else:
                ray.init(num_cpus=max(1, jobs), include_dashboard=False, log_to_driver=False,
                         logging_level=third_party_level())
            started = True
        register_ray()
        try:
            yield "ray", {}, ray.put
        finally:
            if started:
                ray.shutdown()
        return
    raise ConfigError("--backend", backend, "one of " + ", ".join(BACKENDS))


def _host_port(address: str):
    """(host, port) of ``HOST:PORT`` or ``tcp://HOST:PORT``; (None, None) for anything else ("auto",
    a scheduler file, ...), which the engine resolves itself."""
    from urllib.parse import urlsplit
    try:
        u = urlsplit(address if "://" in address else f"tcp://{address}")
        return u.hostname, u.port
    except ValueError:
        return None, None


def _reachable(address: str, what: str, timeout_s: float = 5.0) -> None:
    """A TCP connect to HOST:PORT first: Ray retries an unreachable head for minutes and Dask for
    30 s before failing; a refused or silent port is reported in seconds."""
    import socket
    host, port = _host_port(address)
    if not host or port is None:
        return
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError("--address", address, f"cannot reach the {what} at {address} ({e.strerror or e})",
                          show_value=False) from None


def _ray_auth_error(address: str, reason: str) -> ConfigError:
    return ConfigError("--address", address, f"cannot join the Ray cluster at {address} (token authentication: "
                       f"{reason}; set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH to the "
                       "cluster's token, as `ray get-auth-token` prints it on the head)", show_value=False)


def _ray_connect(ray, address: str) -> None:
    """``ray.init`` on an existing cluster, every failure a one-line error naming the address."""
    from ray.exceptions import AuthenticationError, RayError
    _reachable(address, "Ray cluster")
    _ray_handshake(address)
    try:
        ray.init(address=address, log_to_driver=False, logging_level=third_party_level())
    except AuthenticationError as e:
        raise _ray_auth_error(address, _first_sentence(e)) from None
    except (ConnectionError, OSError, RuntimeError, ValueError, RayError) as e:   # version mismatch, ...
        raise ConfigError("--address", address, f"cannot reach the Ray cluster at {address} "
                          f"({_first_line(e)})", show_value=False) from None


def _ray_handshake(address: str, timeout_s: float = 3.0) -> None:
    """Check the token, then ask the head's GCS for its cluster id once.  A missing or wrong token
    fails here in a second; ``ray.init`` would retry it for 20 s, printing a warning each second,
    then report a lost connection (and Ray's C++ client ends the process on a token file it cannot
    read, so that is checked first, as ``ray.init`` does).  Anything but a token problem is left
    to ``ray.init``, which knows the other cases."""
    host, port = _host_port(address)
    if not host or port is None:
        return
    try:                                            # Ray's own checks: it has no public handshake
        from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:                             # another Ray layout: ray.init decides alone
        return
    try:
        ensure_token_if_auth_enabled(None, create_token_if_missing=False)
    except AuthenticationError as e:
        raise _ray_auth_error(address, _first_sentence(e)) from None
    import threading
    outcome: list = []

    def ask():
        try:
            GcsClient(address=f"{host}:{port}")
            outcome.append("ok")
        except AuthenticationError:
            outcome.append("refused")
        except Exception:                           # noqa: BLE001 - not a token problem: ray.init reports it
            outcome.append("other")

    asking = threading.Thread(target=ask, daemon=True)
    with _quiet_fd2():                              # the C++ client logs each refusal to fd 2
        asking.start()
        asking.join(timeout_s)
    if not outcome:                                 # a Ray head answers in well under a second
        raise ConfigError("--address", address, f"cannot reach the Ray cluster at {address} (the port answered, "
                          f"but no Ray head replied within {timeout_s:g} s)", show_value=False)
    if outcome[0] == "refused":
        raise _ray_auth_error(address, "the cluster refused this process's token, or it sent none")


def _first_sentence(e: BaseException) -> str:
    text = getattr(e, "message", None) or str(e)
    return text.split(". ")[0].strip().rstrip(".")


@contextlib.contextmanager
def _quiet_fd2():
    """File descriptor 2 to /dev/null inside (C++ libraries write there, not to ``sys.stderr``)."""
    import os
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


_BAR = contextvars.ContextVar("dsim_progress_bar", default=None)


@contextlib.contextmanager
def progress(unit: str, enabled: bool):
    """A tqdm counter on stderr of the simulations ``run_calls`` finishes inside (capacity probes,
    plan candidates: their number is not known in advance); off when not a terminal or disabled."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm
    bar = tqdm(unit=unit, file=sys.stderr, dynamic_ncols=True)
    token = _BAR.set(bar)
    try:
        yield bar
    finally:
        _BAR.reset(token)
        bar.close()


def fn_ships(fn) -> bool:
    """Does ``fn`` take ``(scenario source, overrides, ...)`` (and so accept a packed point)?"""
    return getattr(fn, "dsim_point", False)


def run_calls(fn, calls, jobs: int = 1, backend: str = "joblib", address: str | None = None):
    """Yield ``fn(*args)`` for each args tuple of ``calls``, in order, as they finish in order
    (ticking the ``progress`` bar around it, if any)."""
    calls = list(calls)
    if not calls:
        return
    bar = _BAR.get()
    for out in _run_calls(fn, calls, jobs, backend, address):
        if bar is not None:
            bar.update(1)
        yield out


def _run_calls(fn, calls, jobs, backend, address):
    if jobs < 1:
        raise ConfigError("--jobs", jobs, "an integer >= 1")
    if backend == "joblib" and (jobs == 1 or len(calls) == 1):
        for args in calls:                      # in process: no worker start-up for small runs
            yield fn(*args)
        return
    import joblib
    from joblib import Parallel, delayed
    with backend_context(backend, jobs, address) as (name, kwargs, put):
        if name == "loky":
            par = Parallel(n_jobs=jobs, return_as="generator", backend="loky")
            yield from par(delayed(fn)(*args) for args in calls)
            return
        # a point travels as data (its scenario and the files it reads), never as a path the worker
        # would open in its own working directory (dsim.explore.portable)
        from .portable import share, ship
        if fn_ships(fn):           # each file's bytes go to the cluster once, the points carry references
            calls = share([ship(c) for c in calls], name, put)
        # Dask's and Ray's joblib backends return whole batches: submit in chunks so finished
        # points reach the caller (and a sweep's store) while the rest still run.  The backend is
        # joblib's thread-wide default only around each chunk, never across a yield: a caller that
        # stops early (or a generator collected later) must not leave it set for every Parallel()
        # of the process (calibrate's loky pool found a closed Dask client there)
        chunk = 4 * jobs
        for i in range(0, len(calls), chunk):
            with joblib.parallel_backend(name, **kwargs):
                out = Parallel(n_jobs=-1)(delayed(fn)(*args) for args in calls[i:i + chunk])
            yield from out
