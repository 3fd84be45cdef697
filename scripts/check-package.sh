#!/usr/bin/env bash
# The Debian package (issue 43; ctest package_deb): `cpack -G DEB` in the build directory, `apt-get install
# ./mixtune_*.deb`, then from PATH: `mixtune --help`, every library of the installed files resolved, the Python
# module imported by the system python3; the package is removed at the end. Needs root (or sudo without a
# password): skipped (exit 77) otherwise, and when a mixtune package is already installed (not ours to replace).
#   scripts/check-package.sh BUILD_DIR
set -euo pipefail
build=$(realpath "$1")
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  sudo -n true 2>/dev/null || { echo "check-package: needs root or passwordless sudo: skipped"; exit 77; }
  SUDO="sudo -n"
fi
if dpkg -s mixtune > /dev/null 2>&1; then echo "check-package: a mixtune package is installed already: skipped"; exit 77; fi
work=$(mktemp -d)
cleanup() { $SUDO dpkg -r mixtune > /dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" > cpack.log) || { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/mixtune_*.deb)
dpkg-deb -I "$deb" | grep -E 'Package|Version|Depends'
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$deb" > "$work/apt.log" 2>&1 ||
  { cat "$work/apt.log"; exit 1; }

[[ $(command -v mixtune) == /usr/bin/mixtune ]] || { echo "check-package: mixtune is not /usr/bin/mixtune on PATH"; exit 1; }
(cd / && mixtune --help) | grep -q finetune
missing=$(dpkg -L mixtune | while read -r f; do
  [[ -f $f ]] && file -b "$f" | grep -q ELF && ldd "$f" | grep 'not found' | sed "s|^|$f: |"; done || true)
[[ -z $missing ]] || { echo "check-package: unresolved libraries:"; echo "$missing"; exit 1; }
if dpkg -L mixtune | grep -q 'dist-packages/mixtune/__init__.py'; then
  (cd / && python3 -c 'import mixtune; print("check-package: python module", mixtune.__version__)')
fi
echo "check-package: ok ($(basename "$deb"))"
