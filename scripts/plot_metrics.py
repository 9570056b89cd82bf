#!/usr/bin/python3
"""Plots training runs' JSONL metrics: training and validation loss against step, with the data
source's entropy rate (the best achievable loss) when the run's data directory has source.json.
Several runs (the same data in fp32 and bf16, say) share one plot, each under its label.

usage: scripts/plot_metrics.py METRICS.jsonl [METRICS.jsonl ...] OUT.png [--labels fp32,bf16]
                               [--source data/markov/source.json]
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("out")
    ap.add_argument("--labels", help="comma-separated, one per metrics file (default: the file names)")
    ap.add_argument("--source", help="source.json of a synthetic data set (entropy rate line)")
    args = ap.parse_args()

    labels = args.labels.split(",") if args.labels else args.metrics
    if len(labels) != len(args.metrics):
        print(f"error: --labels has {len(labels)} names for {len(args.metrics)} metrics files", file=sys.stderr)
        return 2
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path, label in zip(args.metrics, labels):
        train, val = [], []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    print(f"error: {path}:{n}: not JSON ({e})", file=sys.stderr)
                    return 2
                if "loss" in r:
                    train.append((r["step"], r["loss"]))
                if "val_loss" in r:
                    val.append((r["step"], r["val_loss"]))
        if not train:
            print(f"error: {path}: no step records with a 'loss' field", file=sys.stderr)
            return 2
        prefix = f"{label} " if len(args.metrics) > 1 else ""
        line, = ax.plot(*zip(*train), label=f"{prefix}train loss", linewidth=1)
        if val:
            ax.plot(*zip(*val), "o-", color=line.get_color(), label=f"{prefix}val loss")
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
