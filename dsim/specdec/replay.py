"""The reproducibility log of speculative decoding (seed 002 section 2, "Reproducibility Log";
section 3.2: "append structured traces (acceptance samples drawn from calibration curves, mode
decisions) to reproducibility logs for regression comparison").

``output.repro_log: true`` writes ``repro_log.jsonl``: a header line, then one line per event in
the order the run made them:

    {"ev": "mode", "t": 0.0123, "rid": 7, "n": 0, "mode": "distributed", "k": 4, "kv": 4}
    {"ev": "accept", "t": 0.0456, "rid": 7, "n": 0, "k": 4, "a": 2, "rb": 1}

``mode``: round n of request rid drafts ``mode`` (fused | distributed) with k drafts (a tree's
depth), kv of them holding KV (partial verification); ``accept``: verification n of rid accepted
a of k drafts and charged rb rollbacks.  ``speculation.replay_log: FILE`` replays a log: each
conversation's n-th decision and n-th verification are taken from it instead of being chosen
and drawn, so the run is the recorded one whatever the acceptance stream's seed, and an edited
line changes exactly what it says.  A conversation that asks for more than the log holds (the
run went another way, or a line was edited to accept less) falls back to choosing and drawing
itself, counted in summary.json ``speculation.replay``.  Why the mode decisions too: the gamma
policy and the mode selector read the acceptance, and the partial-verification draw is random.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..config.errors import ConfigError

VERSION = 1
MODES = ("fused", "distributed")


class ReproLog:
    """Records a run's decisions and acceptance outcomes, and/or replays a recorded run's."""

    def __init__(self, replay: dict | None = None, record: bool = False):
        self.replay = replay                  # rid -> ([mode records], [accept records]) or None
        self.lines: list | None = [] if record else None
        self.n_mode: dict = {}                # rid -> decisions made so far
        self.n_acc: dict = {}                 # rid -> verifications so far
        self.replayed = self.fallbacks = 0

    # ---- reading ------------------------------------------------------------------------------
    @staticmethod
    def read(path: Path, where: str) -> dict:
        """A log to replay as rid -> ([(mode, k, kv)], [(k, a, rb)]) (path-qualified ConfigError for
        a missing or malformed file); ``ReproLog(replay=...)`` replays it, one per run."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(where, str(path), f"a readable repro_log.jsonl ({e.strerror})") from None
        by_rid: dict = {}
        lines = text.splitlines()
        try:
            head = json.loads(lines[0]) if lines else None
        except ValueError:
            head = None
        if not isinstance(head, dict) or head.get("repro_log") != VERSION:
            raise ConfigError(where, str(path), f"a repro_log.jsonl written by output.repro_log (header "
                              f'{{"repro_log": {VERSION}, ...}})')
        for i, line in enumerate(lines[1:], 2):
            if not line.strip():
                continue
            w = f"{path}:{i}"
            try:
                rec = json.loads(line)
            except ValueError:
                raise ConfigError(w, line[:60], "a JSON object") from None
            ev = rec.get("ev") if isinstance(rec, dict) else None
            if ev not in ("mode", "accept") or not all(_count(rec.get(f)) for f in ("rid", "n", "k")):
                raise ConfigError(w, line[:60], 'an event {"ev": "mode" | "accept", "rid", "n", "k", ...} '
                                  "with counts >= 0")
            if ev == "mode":
                if rec.get("mode") not in MODES or not _count(rec.get("kv")) or rec["kv"] > rec["k"] + 1024:
                    raise ConfigError(f"{w}.mode", rec.get("mode"), "fused or distributed, with a kv count")
                item = (rec["mode"], rec["k"], rec["kv"])
            else:
                if not (_count(rec.get("a")) and _count(rec.get("rb"))) or rec["a"] > rec["k"]:
                    raise ConfigError(f"{w}.a", rec.get("a"), f"accepted drafts in [0, k={rec['k']}] and a "
                                      "rollback count rb >= 0")
                item = (rec["k"], rec["a"], rec["rb"])
            lst = by_rid.setdefault(rec["rid"], ([], []))[0 if ev == "mode" else 1]
            if rec["n"] != len(lst):
                raise ConfigError(f"{w}.n", rec["n"], f"{len(lst)} (request {rec['rid']}'s {ev} events in order)")
            lst.append(item)
        return by_rid

    # ---- the runtime's hooks ----------------------------------------------------------------------
    def decide(self, rid: int, mode: str, k: int):
        """A round's (mode, k) as chosen, or as the replayed log says; and the replayed kv (or None)."""
        n = self.n_mode.get(rid, 0)
        self.n_mode[rid] = n + 1
        rep = self.replay
        if rep is not None:
            got = rep.get(rid)
            if got is not None and n < len(got[0]):
                self.replayed += 1
                return got[0][n]
            self.fallbacks += 1
        return mode, k, None

    def decided(self, now: float, rid: int, mode: str, k: int, kv: int) -> None:
        if self.lines is not None:
            self.lines.append(("mode", now, rid, self.n_mode[rid] - 1, mode, k, kv))

    def accept(self, rt, st, r, k: int):
        """``SpecRuntime.accept`` through the log: the replayed outcome, else the drawn one; recorded."""
        rid = r.rid
        n = self.n_acc.get(rid, 0)
        self.n_acc[rid] = n + 1
        got = self.replay.get(rid) if self.replay is not None else None
        if got is not None and n < len(got[1]) and got[1][n][0] == k:
            self.replayed += 1
            _, a, rb = got[1][n]
            st.rollbacks += rb
            extra = rb * rt.cfg.partial["rollback_penalty_ms"] * 1e-3
        else:
            if self.replay is not None:
                self.fallbacks += 1
            before = st.rollbacks
            a, extra = rt.draw(st, r, k)
            rb = st.rollbacks - before
        if self.lines is not None:
            self.lines.append(("accept", rt.env.now, rid, n, k, a, rb))
        return a, extra

    # ---- writing ----------------------------------------------------------------------------------
    def text(self, header: dict) -> str:
        out = [json.dumps({"repro_log": VERSION, **header}, separators=(",", ":"), sort_keys=True)]
        for ev in self.lines or ():
            if ev[0] == "mode":
                _, t, rid, n, mode, k, kv = ev
                out.append(f'{{"ev":"mode","t":{t!r},"rid":{rid},"n":{n},"mode":"{mode}","k":{k},"kv":{kv}}}')
            else:
                _, t, rid, n, k, a, rb = ev
                out.append(f'{{"ev":"accept","t":{t!r},"rid":{rid},"n":{n},"k":{k},"a":{a},"rb":{rb}}}')
        return "\n".join(out) + "\n"

    def summary(self) -> dict:
        return {"replayed": self.replayed, "fallbacks": self.fallbacks}


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
