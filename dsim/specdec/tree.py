"""EAGLE-style tree drafts: which draft tokens a round verifies, what verifying them costs, and how
many of them a verification accepts.

A chain drafts one candidate per position; a tree keeps the drafter's ``topk`` candidates at each
level and verifies them all in one target step with a tree attention mask (SGLang's
``--speculative-eagle-topk / --speculative-num-steps / --speculative-num-draft-tokens``, the EAGLE
repository's ``top_k / depth / total_token``).  Verification walks down from the root: at each
level the target's own token either equals one of the current node's children (descend) or not
(stop); the accepted length is the depth reached.

The acceptance of a tree follows from two quantities:

* ``a_i``: the acceptance model's conditional rate at position i (the drafter's first choice is the
  target's token, given the path so far was accepted), as for chains;
* ``sibling`` (beta): the drafter's j-th choice is right, given choices 0..j-1 were wrong, with
  probability ``a_i * beta**j``.  So the target's token is the rank-j candidate with probability

      h_i(j) = a_i beta^j prod_{m<j} (1 - a_i beta^m)

  beta = 0 makes every tree a chain; beta = 1 treats every sibling as a fresh draw.

Which nodes to keep (EAGLE-2's re-ranking): a node's value is the product of h along its path,
the probability that verification reaches it.  Values only shrink going down, so the ``tokens``
nodes of largest value form a tree, and the expected tokens per verify step is exactly
``1 + sum of the kept values`` (each node adds one token when the walk reaches it).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class TreeSpec:
    """``speculation.tree``: topk candidates per node, at most ``tokens`` drafted nodes, the sibling
    acceptance beta; the depth is the gamma policy's k."""
    topk: int
    tokens: int
    sibling: float


def rank_hits(a: float, topk: int, beta: float) -> tuple:
    """h(j), j < topk: the probability that the target's token is the drafter's rank-j candidate."""
    out, miss = [], 1.0
    for j in range(topk):
        c = a * beta ** j
        out.append(miss * c)
        miss *= 1.0 - c
    return tuple(out)


class DraftTree:
    """The kept nodes of one tree, in order of decreasing value (ties: shallower, then lower rank,
    then earlier parent).  Any prefix of that order is itself a tree, so a step that can verify only
    the first n nodes (token budget, remaining output) keeps a connected subtree."""

    __slots__ = ("parent", "rank", "level", "value", "hits", "_children", "_depth", "_pairs", "_steps")

    def __init__(self, probs, topk: int, tokens: int, beta: float):
        self.hits = [rank_hits(a, topk, beta) for a in probs]
        depth = len(probs)
        parent, rank, level, value = [], [], [], []
        # best-first expansion: a heap of candidate nodes (-value, level, rank, parent index)
        heap = [(-h, 1, j, -1) for j, h in enumerate(self.hits[0]) if h > 0] if depth else []
        heapq.heapify(heap)
        while heap and len(parent) < tokens:
            v, lv, j, par = heapq.heappop(heap)
            idx = len(parent)
            parent.append(par)
            rank.append(j)
            level.append(lv)
            value.append(-v)
            if lv < depth:
                for jj, h in enumerate(self.hits[lv]):
                    if h > 0:
                        heapq.heappush(heap, (v * h, lv + 1, jj, idx))
        self.parent, self.rank, self.level, self.value = parent, rank, level, value
        self._children: dict = {}
        self._steps: dict = {}
        # per prefix of n nodes (what the replica asks every round): depth and masked pairs
        self._depth, self._pairs = [0], [1]
        for lv in level:
            self._depth.append(max(self._depth[-1], lv))
            self._pairs.append(self._pairs[-1] + lv + 1)

    def __len__(self) -> int:
        return len(self.parent)

    def expected_tokens(self, n: int | None = None) -> float:
        """Mean tokens a verify step of the first n nodes emits (accepted + the target's own)."""
        return 1.0 + sum(self.value[:n])

    def depth(self, n: int | None = None) -> int:
        """Levels among the first n nodes (all of them by default)."""
        return self._depth[len(self.level) if n is None else min(n, len(self.level))]

    def widths(self, n: int | None = None) -> list:
        """Nodes per level 1..depth among the first n: the drafter's forward at level j runs the
        nodes it expands at level j - 1 (1 for the root), which is what drafting costs."""
        out = [0] * self.depth(n)
        for lv in self.level[:n]:
            out[lv - 1] += 1
        return out

    def draft_steps(self, n: int) -> list:
        """Tokens the drafter runs at each of its forward passes for the first n nodes: the root,
        then at level j the nodes of level j - 1 it expands (at most topk, as EAGLE-2 does)."""
        out = self._steps.get(n)
        if out is None:
            topk = len(self.hits[0])
            out = self._steps[n] = [1] + [min(topk, x) for x in self.widths(n)[:-1]]
        return out

    def attention_pairs(self, n: int) -> int:
        """Query-key pairs of the n + 1 verify tokens among themselves under the tree mask: each
        token sees its ancestors and itself (a chain of c tokens has c (c + 1) / 2)."""
        return self._pairs[n]

    def children(self, n: int) -> dict:
        """{(parent index, rank): node index} over the first n nodes (memoised per n)."""
        ch = self._children.get(n)
        if ch is None:
            ch = {(self.parent[i], self.rank[i]): i for i in range(n)}
            self._children[n] = ch
        return ch

    def sample(self, rng, n: int) -> int:
        """Accepted draft tokens of one verification of the first n nodes: one uniform per level
        picks the target's token's rank (or none of the top-k); the walk descends while that
        candidate was drafted."""
        depth = len(self.hits)
        u = rng.random(depth)
        ch = self.children(n)
        node, acc = -1, 0
        for lv in range(depth):
            x = float(u[lv])
            hit = -1
            for j, h in enumerate(self.hits[lv]):
                if x < h:
                    hit = j
                    break
                x -= h
            nxt = ch.get((node, hit)) if hit >= 0 else None
            if nxt is None:
                break
            node, acc = nxt, acc + 1
        return acc


@lru_cache(maxsize=512)
def draft_tree(probs: tuple, topk: int, tokens: int, beta: float) -> DraftTree:
    """The tree for one set of per-level rates (memoised: acceptance lookups are binned)."""
    return DraftTree(probs, topk, tokens, beta)
