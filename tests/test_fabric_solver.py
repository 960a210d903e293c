"""The fabric's fair-share solver: the remembered shares of a component's shape (``Network._shares_for``)
and the general water filling (``Network._fill``) give, bit for bit, the rates of a straightforward
textbook max-min filling kept here, on randomised flow sets (shared, disjoint and down links, ties
in bandwidth, repeated and reordered shapes); and a P/D run over a leaf-spine fabric with an outage
gives the same requests and link counters as the same run re-solved by a plain reference solver."""
import struct

import numpy as np
import simpy

import dsim
from dsim.network import fabric
from dsim.network.fabric import Link, Network, _Flow
from dsim.network.topology import Topology


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def textbook_rates(paths: list) -> list:
    """Max-min fair rates of flows on ``paths`` (tuples of links, in flow order), by the definition:
    repeatedly saturate the link whose remaining capacity per unfixed flow is smallest (ties: the
    link met first in flow order), fix its flows at that share and take the share off every link
    each of them crosses.  A flow crossing a down link gets 0 and takes no part."""
    n = len(paths)
    rate = [0.0 if any(not lk.up for lk in p) else None for p in paths]
    cap, order = {}, []
    for i, p in enumerate(paths):
        if rate[i] is None:
            for lk in p:
                if lk not in cap:
                    cap[lk] = lk.bw
                    order.append(lk)
    unfixed = [i for i in range(n) if rate[i] is None]
    while unfixed:
        best = None
        for lk in order:
            users = [i for i in unfixed if lk in paths[i]]
            if users and (best is None or cap[lk] / len(users) < best[0]):
                best = (cap[lk] / len(users), users)
        share, users = best
        for i in users:
            rate[i] = share
            for lk in paths[i]:
                cap[lk] -= share
        unfixed = [i for i in unfixed if rate[i] is None]
    return rate


def random_links(rng, n_links):
    links = []
    for k in range(n_links):
        # a few bandwidths only, so that shares tie; some links down
        lk = Link(f"u{k}", f"v{k}", float(rng.choice([10.0, 20.0, 30.0, 7.0, 1e9 / 3])), 0.0)
        lk.up = bool(rng.random() > 0.1)
        links.append(lk)
    return links


def random_flows(rng, paths, n_flows, seq0=0):
    flows = []
    for i in range(n_flows):
        f = _Flow()
        f.fid = seq0 + i
        f.seq = seq0 + i
        f.links = paths[int(rng.integers(len(paths)))]
        flows.append(f)
    return flows


def bare_network():
    env = simpy.Environment()
    return Network(env, Topology(None, "links", "network"), np.random.default_rng(0))


def test_fill_and_remembered_shares_equal_the_textbook_filling_bit_for_bit():
    rng = np.random.default_rng(40)
    net = bare_network()
    hits = 0
    for case in range(400):
        links = random_links(rng, int(rng.integers(1, 9)))
        paths = []
        for _ in range(int(rng.integers(1, 6))):
            k = int(rng.integers(1, min(4, len(links)) + 1))
            paths.append(tuple(links[j] for j in rng.choice(len(links), size=k, replace=False)))
        flows = random_flows(rng, paths, int(rng.integers(1, 13)))
        want = [bits(r) for r in textbook_rates([f.links for f in flows])]
        Network._fill(flows)                                     # the general solver
        assert [bits(f.rate) for f in flows] == want, f"case {case}: _fill differs from the textbook"
        # the same shape again, then reordered (another first-appearance order), then one flow fewer:
        # each answer from the remembered shares must still be the textbook's for that order
        for variant in (flows, flows, list(reversed(flows)), flows[1:] or flows):
            for f in variant:
                f.rate = -1.0
            before = len(net._shares)
            shares = net._shares_for(variant)
            hits += len(net._shares) == before
            want = [bits(r) for r in textbook_rates([f.links for f in variant])]
            assert [bits(shares[f.links]) for f in variant] == want, f"case {case}: remembered shares differ"
    assert hits > 400                                            # the remembered path was exercised


def test_the_shape_key_tells_apart_orders_and_counts_that_change_the_shares():
    """Links a (0.1), b (0.7) and c (0.2) with flows on (a, c), (b, c), (a,) and (b,): a and c tie at
    a share of 0.05, and which of them saturates first (the path that first appears) changes the
    last bit of the (b, c) flows' share; the counts change the shares too."""
    a, b, c = Link("a", "x", 0.1, 0.0), Link("b", "x", 0.7, 0.0), Link("c", "x", 0.2, 0.0)
    ac, bc, aa, bb = (a, c), (b, c), (a,), (b,)
    net = bare_network()
    got = {}
    for name, order in (("ac first", [ac, bc, bc, bc, aa, bb, bb]), ("bc first", [bc, bc, bc, ac, aa, bb, bb]),
                        ("fewer", [ac, bc, aa, bb]), ("ac first again", [ac, bc, bc, bc, aa, bb, bb])):
        flows = random_flows(np.random.default_rng(0), [None], len(order))
        for f, path in zip(flows, order):
            f.links = path
        shares = net._shares_for(flows)
        assert [bits(shares[f.links]) for f in flows] == [bits(r) for r in textbook_rates(order)], name
        got[name] = shares[bc]
    assert got["ac first"] == got["ac first again"] == 0.05000000000000001 and got["bc first"] == 0.05
    assert got["fewer"] != got["ac first"]


def reference_component(links) -> list:
    """Every flow reachable from ``links`` through shared links, walked flow by flow, in start order."""
    comp, stack, seen = {}, list(links), set()
    while stack:
        lk = stack.pop()
        if lk in seen:
            continue
        seen.add(lk)
        for fid, f in lk.flows.items():
            if fid not in comp:
                comp[fid] = f
                stack.extend(f.links)
    return sorted(comp.values(), key=lambda f: f.seq)


def test_the_component_walk_finds_the_flows_a_flow_by_flow_walk_finds():
    """Random flows on random paths (some through one link all of them cross, some not); the component
    of random touched links, by path-wise walk or by the every-flow shortcut, is the plain walk's."""
    rng = np.random.default_rng(7)
    shortcut = 0
    for case in range(300):
        links = random_links(rng, int(rng.integers(2, 9)))
        hub = links[0] if rng.random() < 0.5 else None
        paths = []
        for _ in range(int(rng.integers(1, 6))):
            k = int(rng.integers(1, min(3, len(links) - 1) + 1))
            p = tuple(links[1 + j] for j in rng.choice(len(links) - 1, size=k, replace=False))
            paths.append(p + (hub,) if hub is not None else p)
        net = bare_network()
        flows = random_flows(rng, paths, int(rng.integers(0, 10)))
        rng.shuffle(flows)                                       # dict order is not start order
        for f in flows:
            net.active[f.fid] = f
            for lk in f.links:
                lk.flows[f.fid] = f
        touched = [links[int(j)] for j in rng.integers(len(links), size=int(rng.integers(1, 4)))]
        got = net._component(touched)
        assert [f.fid for f in got] == [f.fid for f in reference_component(touched)], f"case {case}"
        shortcut += any(len(lk.flows) == len(flows) > 1 for lk in touched)
    assert shortcut > 30


def reference_resolve(self, links):
    """The plain re-solve: every flow reachable from ``links`` through shared links (walked flow by
    flow), settled in start order, given the textbook rates, its completion projected."""
    flows = reference_component(links)
    self.work += len(flows)
    now = self.env.now
    for f in flows:
        self._settle(f, now)
    for f, r in zip(flows, textbook_rates([f.links for f in flows])):
        f.rate = r
        f.ver += 1
        if r > 0:
            fabric.heapq.heappush(self.heap, (f.t + f.remaining / r, f.seq, f.ver, f))
    self._schedule_next()


PD_NETWORK = ["workload.num_requests=250", "network.failures=[{link: [leaf0, spine0], start_s: 1.5, end_s: 4}]"]


def run_pd(tmp_path, name):
    res = dsim.run(str(dsim_root() / "scenarios" / "pd_network.yaml"), tmp_path / name, overrides=PD_NETWORK,
                   plots=False)
    return (tmp_path / name / "requests.csv").read_bytes(), res.summary["network"]


def dsim_root():
    from pathlib import Path
    return Path(__file__).resolve().parents[1]


def test_a_pd_run_over_the_fabric_is_the_reference_solvers_run(tmp_path, monkeypatch):
    calls = {"resolve": 0, "fill": 0}
    resolve, fill = Network._resolve, Network._fill

    def counted_resolve(self, links):
        calls["resolve"] += 1
        return resolve(self, links)

    def counted_fill(flows):
        calls["fill"] += 1
        return fill(flows)
    monkeypatch.setattr(Network, "_resolve", counted_resolve)
    monkeypatch.setattr(Network, "_fill", staticmethod(counted_fill))
    fast_rows, fast_net = run_pd(tmp_path, "fast")
    assert fast_net["transfers"] > 200 and fast_net["links"]["leaf0->spine1"]["bytes"] > 0   # detours taken
    assert calls["resolve"] > 2 * calls["fill"] > 0              # remembered shares, mostly
    monkeypatch.setattr(Network, "_resolve", reference_resolve)
    ref_rows, ref_net = run_pd(tmp_path, "ref")
    assert fast_rows == ref_rows
    assert fast_net == ref_net                                   # link bytes, busy time, mean transfer time
