"""Real-time front ends: ``dsim serve``, an OpenAI-compatible stand-in for vLLM whose tokens come out at
the times a wall-clock-driven simulation of the scenario gives, with vLLM's Prometheus metrics; and
``dsim observe`` (``observe.py``, ``capture.py``), a load generator that drives any OpenAI-compatible
server with a scenario's workload and captures its timings in the folder ``dsim cosim`` reads
(aiohttp, ``pip install 'dsim[observe]'``, imported only by ``observe.py``).

The web stack (starlette, uvicorn, prometheus-client: ``pip install 'dsim[serve]'``) is imported only
by ``dsim.serve.app``; ``dsim.serve.text`` and ``dsim.serve.realtime`` need nothing beyond dsim.
"""


def serve_cli(args) -> int:
    """``dsim serve SCENARIO``: build the simulation, bind the ports, serve until ^C / SIGTERM."""
    import asyncio
    import signal
    import sys

    from ..config.errors import ConfigError
    from ..config.limits import check_flag
    try:
        from .app import Limits, Server
    except ImportError as e:
        raise ConfigError("dsim serve", None, f"the web stack ({e.name} is missing): pip install 'dsim[serve]'",
                          show_value=False) from None
    from .realtime import build
    check_flag("--port", args.port, 0, 65535)
    check_flag("--max-concurrency", args.max_concurrency, 1, 1_000_000)
    check_flag("--max-prompt-tokens", args.max_prompt_tokens, 1, 10_000_000)
    check_flag("--max-body-bytes", args.max_body_bytes, 64, 1 << 31)
    check_flag("--default-max-tokens", args.default_max_tokens, 1, 10_000_000)
    rt = build(args.scenario, args.overrides, args.speed)
    server = Server(rt, args.host, args.port, args.replica_ports,
                    Limits(args.max_concurrency, args.max_prompt_tokens, args.max_body_bytes, args.default_max_tokens))

    def started():
        scn = rt.scn
        print(f"dsim serve: {scn.name} ({', '.join(rt.model_names())}; {len(rt.replicas())} replica(s); "
              f"speed x{rt.speed:g})", flush=True)
        for port, rep in server.endpoints():
            what = "the fleet (the scenario's router)" if rep is None else f"replica {rep}"
            print(f"  http://{args.host}:{port}/v1  {what}", flush=True)
        print("  ^C to stop", flush=True)

    server.started = started

    async def main():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.shutdown)
        await server.serve()

    asyncio.run(main())
    print("dsim serve: stopped", file=sys.stderr)
    return 0
