#!/usr/bin/python3
"""Plots a training run's JSONL metrics: training and validation loss against step, with the data
source's entropy rate (the best achievable loss) when the run's data directory has source.json.

usage: scripts/plot_metrics.py METRICS.jsonl OUT.png [--source data/markov/source.json]
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics")
    ap.add_argument("out")
    ap.add_argument("--source", help="source.json of a synthetic data set (entropy rate line)")
    args = ap.parse_args()

    train, val = [], []
    with open(args.metrics) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"error: {args.metrics}:{n}: not JSON ({e})", file=sys.stderr)
                return 2
            if "loss" in r:
                train.append((r["step"], r["loss"]))
            if "val_loss" in r:
                val.append((r["step"], r["val_loss"]))
    if not train:
        print(f"error: {args.metrics}: no step records with a 'loss' field", file=sys.stderr)
        return 2

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(*zip(*train), label="train loss", linewidth=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss")
    if args.source:
        with open(args.source) as f:
            h = json.load(f)["entropy_rate_nats"]
        ax.axhline(h, color="k", linestyle="--", linewidth=1, label=f"entropy rate {h:.4f}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
