"""Why speculative decoding stops paying at large batch: EAGLE-3 on Llama-3.1-8B, one RTX 4090,
step times from dsim's roofline model, acceptance from the shipped EAGLE-3 MT-bench curve.

    python experiments/eagle3_batch_crossover.py      # < 1 s; writes docs/eagle3-crossover.{md,png}

Per decoding round of a batch of B sequences (context C tokens each):
  plain:       one decode step, B tokens               -> B tokens
  speculative: gamma EAGLE-3 draft steps (one decoder layer + the LM head of the target, costed as
               (1 + lm_head share) / L of a target decode step: dsim.specdec.eagle.head_fraction,
               which speculation.framework: eagle charges in the loop) + one verify step of B x (gamma + 1)
               tokens, each sequence a chunk of gamma + 1 after its C-token context
                                                        -> B x tau(gamma) tokens
Speed-up = tokens per second speculative / plain.  The target's step time is memory-bound at small B
(reading 16 GB of weights dominates, so verifying gamma + 1 tokens costs about as much as decoding 1)
and compute-bound at large B (the cost grows with tokens), where the gamma extra tokens per sequence,
most of them rejected, cost real FLOPs.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from dsim.config.hardware import load_device  # noqa: E402
from dsim.config.model import load_model  # noqa: E402
from dsim.latency.base import BatchShape  # noqa: E402
from dsim.latency.roofline import RooflineModel  # noqa: E402
from dsim.config.generations import by_name  # noqa: E402
from dsim.latency.host import HostStepModel, resolve_host  # noqa: E402
from dsim.specdec.acceptance import geometric_rate_for_tau, load_curves, tokens_per_step  # noqa: E402
from dsim.specdec.eagle import head_fraction  # noqa: E402

CTX = 1024
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GAMMAS = range(1, 9)


def decode(model, B):
    return model.step_time(BatchShape(decode_tokens=B, decode_ctx_sum=B * (CTX + 1), num_sampled=B, running=B))


def verify(model, B, g):
    c = g + 1
    return model.step_time(BatchShape(prefill_tokens=B * c, num_prefill=B, prefill_attn_pairs=B * (c * CTX + c * (c + 1) // 2),
                                      prefill_ctx_tokens=B * CTX, num_sampled=B, prefill_chunk_sq=B * c * c, running=B))


# the paper's vLLM figures (EAGLE-3 paper, "small GPU"): speed-up over plain decoding by batch
PAPER = {2: 1.30, 32: 0.93}
VLLM_CHAIN = (3.53, 7)   # vLLM V1 chain, MT-bench: tokens per step at k = 7 (dsim/data/acceptance/tree_vs_chain.csv)


def recheck(m, dev, draft_frac) -> list:
    """The crossover again with the engine's host costs and vLLM's own chain acceptance.

    Per round of B sequences: gamma draft forwards (GPU time of the head; in V0 each is an engine
    step of its own and pays the generation's host time too) + one verify step (GPU + host); plain
    decoding: one decode step (GPU + host).  Returns markdown lines: best speed-up per batch and
    generation, and the extra time per round that would bring it to the paper's figure."""
    a = geometric_rate_for_tau(*VLLM_CHAIN)
    gpu = RooflineModel(m, dev, 1)
    lines = ["", "## Re-check with engine host costs and vLLM's chain acceptance", "",
             f"Acceptance: vLLM's own EAGLE-3 chain on MT-bench ({VLLM_CHAIN[0]} tokens per step at k = "
             f"{VLLM_CHAIN[1]}, geometric rate {a:.3f}), not the tree figure above. Host costs: "
             "`dsim/config/data/engine_generations.yaml` (v1: 800 us per step; v0-async-output: 294 us per step + "
             "150 us per sequence, paid by every draft step too, as V0's proposer ran each draft step as a "
             "model-runner call). Best gamma in 1..8.", "",
             "| batch | generation | plain step (ms) | best gamma | speed-up | paper | extra ms per round to match the paper |",
             "|---|---|---|---|---|---|---|"]
    for gen in ("v1", "v0-async-output"):
        host = HostStepModel(gpu, resolve_host(by_name(gen), {}, "roofline", False), m.num_layers, 1)
        for B in (2, 8, 32):
            t_dec = decode(host, B)
            h_draft = 0.0 if gen == "v1" else host.host_time(BatchShape(decode_tokens=B, num_sampled=B, running=B))
            best = None
            for g in GAMMAS:
                tau = tokens_per_step((a,) * g)
                t = verify(host, B, g) + g * (draft_frac * decode(gpu, B) + h_draft)
                if best is None or tau * t_dec / t > best[1]:
                    best = (g, tau * t_dec / t, t, tau)
            g, sp, t, tau = best
            paper = PAPER.get(B)
            # the speed-up is tau t_dec / t: the paper's figure needs t' = tau t_dec / paper
            extra = f"{(tau * t_dec / paper - t) * 1e3:.1f}" if paper else ""
            lines.append(f"| {B} | {gen} | {t_dec * 1e3:.2f} | {g} | {sp:.2f}x | {f'{paper:.2f}x' if paper else ''} | "
                         f"{extra} |")
    return lines


def main():
    m = load_model("meta-llama/Llama-3.1-8B")
    dev = load_device("RTX4090")
    step = RooflineModel(m, dev, 1)
    curve = load_curves(ROOT / "dsim" / "data" / "acceptance" / "published_curves.yaml")["eagle-3-llama-3.1-8b-mt-bench-t0"]
    draft_frac = head_fraction(m)     # one decoder layer + the LM head, as a share of a decode step
    rows = []
    for B in BATCHES:
        t_dec = decode(step, B)
        best = None
        per_g = {}
        for g in GAMMAS:
            tau = tokens_per_step(curve.probabilities(CTX, g, 0))
            t = verify(step, B, g) + g * draft_frac * t_dec
            sp = (tau / t) / (1 / t_dec)
            per_g[g] = sp
            if best is None or sp > best[1]:
                best = (g, sp)
        rows.append((B, t_dec * 1e3, per_g, best))
    lines = ["# EAGLE-3 speed-up vs batch size (roofline, Llama-3.1-8B, RTX 4090, context 1024)", "",
             "Generated by `python experiments/eagle3_batch_crossover.py`. Speed-up of decoding throughput over plain "
             "decoding; acceptance from `dsim/data/acceptance/published_curves.yaml` (EAGLE-3, MT-bench, T=0).", "",
             "| batch | plain decode step (ms) | " + " | ".join(f"gamma={g}" for g in GAMMAS) + " | best gamma |",
             "|---|---|" + "---|" * len(GAMMAS) + "---|"]
    for B, td, per_g, (g, sp) in rows:
        lines.append(f"| {B} | {td:.2f} | " + " | ".join(f"{per_g[x]:.2f}x" for x in GAMMAS) + f" | {g} ({sp:.2f}x) |")
    cross = next((B for B, _, per_g, _ in rows if per_g[3] < 1), None)
    where = f"falls below 1x from batch {cross}" if cross else f"stays above 1x up to batch {rows[-1][0]}"
    lines += ["", f"With gamma = 3 the speed-up {where}; the best gamma shrinks from {rows[0][3][0]} to "
              f"{rows[-1][3][0]} and its speed-up from {rows[0][3][1]:.2f}x to {rows[-1][3][1]:.2f}x at batch "
              f"{rows[-1][0]}.",
              "The EAGLE-3 paper reports the same shape in vLLM on a small GPU (1.30x at batch 2, 0.93x at 32). At small "
              "batch a step is bound by reading the weights, so checking gamma + 1 tokens per sequence is nearly free and "
              "the accepted tokens are pure gain; as the batch grows the step becomes compute-bound, each verified "
              "token costs FLOPs, and the drafted tokens that are rejected (1 - tau / (gamma + 1) of them) are paid for "
              "without return. This roofline-only study reproduces the direction (the gain shrinks, the best gamma "
              "falls) but reverses later than the paper: it charges no framework overhead per draft step, and the "
              "curve's tree-decoding acceptance (tau 6.13 at depth 8) is higher than vLLM's chain drafting reaches. "
              "Issue 7's verification inside the replica loop will redo this with queueing and real batch dynamics."]
    lines += recheck(m, dev, draft_frac)
    per_seq = by_name("v0-async-output").host.per_seq_us
    expand = {B: B * (3 + 1) * per_seq / 1e3 for B in (2, 32)}      # ms, gamma = 3
    lines += ["", "What is reproduced and what is not:",
              "- Reproduced: the speed-up shrinks with the batch and the best gamma falls, and host costs lower it "
              "further. V0's costs are paid per draft step, so they tax a speculative round more than a plain step.",
              "- Not reproduced: the level. dsim gives more than the paper at batch 2 and stays well above 1x at "
              "batch 32.",
              "- The missing time per round (last column) has two parts:",
              "  - A fixed part of ~13 ms, present already at batch 2. The paper names neither the GPU nor the "
              "vLLM version, so this part is not attributed.",
              f"  - A part that grows by ~16 ms from batch 2 to 32 (V0 rows). That is the size of V0's batch "
              f"expansion: its scorer turned every sequence into gamma + 1 single-token sequences, and at "
              f"{per_seq:.0f} us per sequence that costs {expand[2]:.1f} ms at batch 2 and {expand[32]:.1f} ms at "
              f"batch 32 (gamma = 3).",
              "- dsim verifies as V1 does, one chunk per sequence, and does not model batch expansion. The "
              "paper's reversal looks like a property of that older implementation, not of speculative decoding "
              "on the GPU.",
              "- The roofline GPU times were not checked against an RTX 4090 run, since the shared data has none."]
    (ROOT / "docs" / "eagle3-crossover.md").write_text("\n".join(lines) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for g in (1, 3, 5, 8):
        ax.plot([r[0] for r in rows], [r[2][g] for r in rows], marker="o", label=f"gamma={g}")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("speed-up over plain decoding")
    ax.set_title("EAGLE-3, Llama-3.1-8B, RTX 4090 (roofline)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "eagle3-crossover.png", dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
