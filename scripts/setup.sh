#!/usr/bin/env bash
# Installs, with apt-get, exactly the Debian 12 packages Lockstep needs to build and train that are
# missing. Idempotent and non-interactive; does nothing when everything is present.
#   scripts/setup.sh [EXTRA_PACKAGE...]   (what needs more names it: scripts/test.sh and
#                                          compare_pytorch.sh add python3-torch)
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libmpfr-dev libgmp-dev libboost-dev
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libtomlplusplus-dev nlohmann-json3-dev libxxhash-dev
  python3 python3-numpy python3-matplotlib
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
