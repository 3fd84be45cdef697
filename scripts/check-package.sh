#!/usr/bin/env bash
# The Debian package (issue 43; ctest package_deb): `cpack -G DEB` in the build directory, `apt-get install
# ./mixtune_*.deb`, then from PATH: `mixtune --help`, every library of the installed files resolved, the Python
# module imported by the system python3; the package is removed at the end. Needs root (or sudo without a
# password): skipped (exit 77) otherwise, and when a mixtune package is already installed (not ours to replace).
#   scripts/check-package.sh BUILD_DIR [PYTHON]
set -euo pipefail
build=$(realpath "$1")
py=${2:-/usr/bin/python3}
[[ -x $py ]] || py=python3
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
# The declared dependencies cover what dpkg-shlibdeps (Debian's own tool) finds the binaries need.
mkdir -p "$work/x/debian" && touch "$work/x/debian/control" && dpkg-deb -x "$deb" "$work/x/root"
elves=$(find "$work/x/root" -type f -exec sh -c 'file -b "$1" | grep -q ELF' _ {} \; -print)
# -l: libmixtune.so is the package's own; a CUDA build's cuBLASLt / NCCL come with the toolkit, not from Debian.
needed=$(cd "$work/x" && dpkg-shlibdeps -O --ignore-missing-info -l"$work/x/root/usr/lib" -l/usr/local/cuda/lib64 \
           $elves 2>"$work/shlibdeps.log" | sed -n 's/^shlibs:Depends=//p') || true
[[ -n $needed ]] || { cat "$work/shlibdeps.log"; echo "check-package: dpkg-shlibdeps found nothing"; exit 1; }
names() { tr ',|' '\n\n' | sed 's/(.*)//; s/ //g' | grep . | sort -u; }
declared=$(dpkg-deb -f "$deb" Depends | names)
undeclared=$(echo "$needed" | names | grep -vxF -f <(echo "$declared") || true)
[[ -z $undeclared ]] || { echo "check-package: needs" $undeclared "(dpkg-shlibdeps), not in Depends"; exit 1; }
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$deb" > "$work/apt.log" 2>&1 ||
  { cat "$work/apt.log"; exit 1; }

[[ $(command -v mixtune) == /usr/bin/mixtune ]] || { echo "check-package: mixtune is not /usr/bin/mixtune on PATH"; exit 1; }
(cd / && mixtune --help) | grep -q finetune
missing=$(dpkg -L mixtune | while read -r f; do
  [[ -f $f ]] && file -b "$f" | grep -q ELF && ldd "$f" | grep 'not found' | sed "s|^|$f: |"; done || true)
[[ -z $missing ]] || { echo "check-package: unresolved libraries:"; echo "$missing"; exit 1; }
if dpkg -L mixtune | grep -q 'dist-packages/mixtune/__init__.py'; then
  (cd / && "$py" -c 'import mixtune; print("check-package: python module", mixtune.__version__)')
fi
echo "check-package: ok ($(basename "$deb"))"
