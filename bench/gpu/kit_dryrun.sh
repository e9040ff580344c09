#!/usr/bin/env bash
# bench/gpu/kit_dryrun.sh — prove the device kit on THIS machine: build cairn
# and run its C tests in a Debian chroot that has a compiler, cmake and
# python3 with numpy but none of cairn's -dev packages and no pkg-config,
# with only what travels to the GPU machine copied in (the files the device
# tool copies: tracked and untracked-but-not-ignored, plus .gpu-kit), and
# with `make` hidden so that the build goes through the kit's ninja. Inside,
# it runs bench/gpu/run.sh itself with CUDA=OFF (the chroot has no nvcc):
# the same env.sh, configure, build, library check, ctest and summary.
#
#   bench/gpu/kit_dryrun.sh                        # all but the http_ tests (their clients: openai...) and realmodel
#   CTEST_ARGS="-L kernels" bench/gpu/kit_dryrun.sh
#   KEEP_MAKE=1 bench/gpu/kit_dryrun.sh            # the Unix Makefiles path instead
#
# Needs root (chroot, mount) and debootstrap; makes the chroot at CHROOT
# (default /work/kit-chroot, outside the repository) when it is missing, with
# the Debian mirror apt here uses. The tree goes to $CHROOT/src (replaced
# each time); the logs and the summary come back in OUT (default
# /tmp/kit-dryrun). Exit status: run.sh's.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CHROOT="${CHROOT:-/work/kit-chroot}"
OUT_HOST="${OUT:-/tmp/kit-dryrun}"
case "$CHROOT" in "$ROOT"|"$ROOT"/*) echo "kit_dryrun: CHROOT must be outside the repository" >&2; exit 1 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "kit_dryrun: needs root (chroot)" >&2; exit 1; }
[ -d "$ROOT/.gpu-kit/sysroot" ] || { echo "kit_dryrun: no kit: run bench/gpu/kit.sh first" >&2; exit 1; }

if [ ! -x "$CHROOT/usr/bin/cmake" ]; then
    # (a machine may have only one of the two files: grep's status 2 for the
    # missing one must not end the script under set -e and pipefail)
    mirror="$(grep -h -m1 -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
              grep -o 'https\?://[^ ]*debian[^ ]*' | grep -v security | head -1 || true)"
    echo "kit_dryrun: debootstrap bookworm into $CHROOT from ${mirror:=http://deb.debian.org/debian}"
    debootstrap --variant=minbase --include=build-essential,cmake,python3,python3-numpy \
        bookworm "$CHROOT" "$mirror"
fi

# What the chroot must NOT have: otherwise the dry run proves nothing.
have=$(chroot "$CHROOT" dpkg-query -W -f='${Package}\n' 2>/dev/null |
       grep -E '^(pkg-config|pkgconf|ninja-build|lib(pcre2|xxhash|lmdb|uv1|msgpack|jansson|http-parser|hiredis|cmocka)-dev)$' || true)
[ -z "$have" ] || { echo "kit_dryrun: the chroot has $have: use a fresh one" >&2; exit 1; }
for h in pcre2.h xxhash.h lmdb.h uv.h msgpack.h jansson.h http_parser.h hiredis/hiredis.h cmocka.h; do
    [ ! -e "$CHROOT/usr/include/$h" ] || { echo "kit_dryrun: the chroot has /usr/include/$h" >&2; exit 1; }
done

echo "kit_dryrun: copying what travels into $CHROOT/src"
rm -rf "$CHROOT/src" && mkdir -p "$CHROOT/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
     tar --null -T - --ignore-failed-read -cf - .gpu-kit) | tar -xf - -C "$CHROOT/src"
du -sh "$CHROOT/src" | sed 's/^/kit_dryrun: /'

cleanup() {
    [ -e "$CHROOT/usr/bin/make.kit-dryrun" ] && mv "$CHROOT/usr/bin/make.kit-dryrun" "$CHROOT/usr/bin/make"
    umount "$CHROOT/dev/shm" 2>/dev/null || true
    umount "$CHROOT/dev/pts" 2>/dev/null || true
    umount "$CHROOT/dev" 2>/dev/null || true
    umount "$CHROOT/proc" 2>/dev/null || true
}
trap cleanup EXIT
mount -t proc proc "$CHROOT/proc"
mount --bind /dev "$CHROOT/dev"
mount --bind /dev/pts "$CHROOT/dev/pts" 2>/dev/null || true
mount -t tmpfs tmpfs "$CHROOT/dev/shm" 2>/dev/null || true
if [ "${KEEP_MAKE:-0}" != 1 ] && [ -e "$CHROOT/usr/bin/make" ]; then
    mv "$CHROOT/usr/bin/make" "$CHROOT/usr/bin/make.kit-dryrun"
fi

rc=0
chroot "$CHROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    CUDA=OFF BUILD_DIR=/src/build-kit OUT=/out JOBS="${JOBS:-2}" DEADLINE="${DEADLINE:-7200}" \
    CTEST_ARGS="${CTEST_ARGS:--LE realmodel -E ^http_}" ${CTEST_JOBS:+CTEST_JOBS=$CTEST_JOBS} \
    bash -c 'rm -rf /out && mkdir -p /out && cd /src && bash bench/gpu/run.sh' || rc=$?
rm -rf "$OUT_HOST" && mkdir -p "$OUT_HOST" && cp -a "$CHROOT/out/." "$OUT_HOST/"
echo "kit_dryrun: run.sh exit $rc; logs in $OUT_HOST"
exit $rc
