#!/usr/bin/env bash
# The main job: installs what is missing, builds, makes the synthetic data set (a Markov source
# with a known entropy rate), and trains the tiny GPT on it with four MPI ranks: two data-parallel
# replicas, each split over two tensor-parallel ranks (Megatron style), ZeRO-1, with the detectors
# of [verify] on (docs/tools.md): every step the replicas must hold bitwise equal parameters
# (canonical mode with exact collectives: the model is bit for bit the one a single process would
# train), the parameters and optimizer state must not change between steps, every linear layer's
# products must meet their checksums ([verify] abft), and the loss and gradient norm must stay
# finite and free of spikes. Prints progress, any finding and a summary,
# and plots the loss curve to runs/tiny/loss.png.
# Re-running resumes from the newest checkpoint in runs/tiny/ckpt (delete runs/tiny to start over).
# Extra arguments are passed to `lockstep train` (e.g. --train.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
bin=build/bin/lockstep
if [ ! -f data/markov/train.bin ]; then
  "$bin" data synth --out data/markov --order 2 --alphabet 16 --branch 4 --tokens 2000000 --seed 1234
  "$bin" data build --input data/markov/corpus.txt --out data/markov --val-fraction 0.05
fi
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpirun --oversubscribe -np 4 "$bin" train --config scripts/configs/tiny.toml \
  --parallel.dp=2 --parallel.tp=2 --parallel.zero=1 --verify.replicas=true --verify.abft=true --train.threads=1 "$@"
/usr/bin/python3 scripts/plot_metrics.py runs/tiny/metrics.jsonl runs/tiny/loss.png \
  --source data/markov/source.json
