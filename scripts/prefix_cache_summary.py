#!/usr/bin/env python3
"""Summarises scripts/prefix_cache_bench.sh's result files: per deployment, the median over
seeds of the baseline's median TTFT (random prompts of one turn's new tokens), turn 1's and the
later turns' median TTFT, their ratio to the baseline, the prefix-cache hit rate, and the KV
bytes the prefill node sent and the decode node did not need (multi-turn runs)."""
import glob
import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main(out):
    rows = []
    deployments = sorted({os.path.basename(p).split("-multiturn-")[0]
                          for p in glob.glob(os.path.join(out, "*-multiturn-*.json"))})
    for d in deployments:
        seeds = sorted(p.split("-multiturn-")[1][:-5]
                       for p in glob.glob(os.path.join(out, d + "-multiturn-*.json")))
        per_seed = []
        for s in seeds:
            mt = load(os.path.join(out, f"{d}-multiturn-{s}.json"))
            rnd = load(os.path.join(out, f"{d}-random-{s}.json"))
            base = rnd["median_ttft_ms"]
            later = mt["later_turns"]["median_ttft_ms"]
            per_seed.append({
                "seed": s,
                "base": base,
                "turn1": mt["ttft_by_turn"][0]["median_ttft_ms"],
                "later": later,
                "ratio": later / base,
                "hit": mt.get("prefix_cache_hit_rate"),
                "sent": mt.get("kv_bytes_sent"),
                "not_sent": mt.get("kv_bytes_not_transferred"),
                "failed": mt["failed"] + rnd["failed"],
                "by_turn": [t["median_ttft_ms"] for t in mt["ttft_by_turn"]],
            })
        med = lambda k: statistics.median(r[k] for r in per_seed) if all(
            r[k] is not None for r in per_seed) else None
        rows.append((d, per_seed, {k: med(k) for k in
                                   ("base", "turn1", "later", "ratio", "hit", "sent", "not_sent")}))
    fmt = lambda v, f="{:.0f}": "-" if v is None else f.format(v)
    print("| deployment | baseline TTFT (ms) | turn 1 TTFT | turns 2-4 TTFT | ratio to baseline "
          "| hit rate (%) | KV MB sent by P | KV MB not sent | per-seed ratios | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d, per_seed, m in rows:
        mb = lambda v: None if v is None else v / 1e6
        print(f"| {d} | {fmt(m['base'])} | {fmt(m['turn1'])} | {fmt(m['later'])} | "
              f"{fmt(m['ratio'], '{:.2f}')} | {fmt(m['hit'], '{:.1f}')} | "
              f"{fmt(mb(m['sent']), '{:.1f}')} | {fmt(mb(m['not_sent']), '{:.1f}')} | "
              f"{' / '.join('{:.2f}'.format(r['ratio']) for r in per_seed)} | "
              f"{sum(r['failed'] for r in per_seed)} |")
    print()
    print("median TTFT by turn (ms), per seed:")
    for d, per_seed, _ in rows:
        for r in per_seed:
            print(f"  {d} seed {r['seed']}: " + ", ".join(f"{v:.0f}" for v in r["by_turn"]))


if __name__ == "__main__":
    main(sys.argv[1])
