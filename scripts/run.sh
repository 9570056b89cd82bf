#!/usr/bin/env bash
# The main job: installs what is missing, builds, makes the synthetic data set (a Markov source
# with a known entropy rate), and trains the tiny GPT on it, printing progress and a summary.
# Re-running resumes from the newest checkpoint in runs/tiny/ckpt (delete runs/tiny to start over).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
bin=build/bin/lockstep
if [ ! -f data/markov/train.bin ]; then
  "$bin" data synth --out data/markov --order 2 --alphabet 16 --branch 4 --tokens 2000000 --seed 1234
  "$bin" data build --input data/markov/corpus.txt --out data/markov --val-fraction 0.05
fi
"$bin" train --config scripts/configs/tiny.toml "$@"
/usr/bin/python3 scripts/plot_metrics.py runs/tiny/metrics.jsonl runs/tiny/loss.png --source data/markov/source.json
