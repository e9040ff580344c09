#!/usr/bin/env bash
# bench/gpu/kit.sh — build the device kit: everything cairn's build and the
# GPU run need that a bare GPU machine lacks, in one folder that travels with
# the tree (`carry: [".gpu-kit"]`, bench/gpu/README.md).
#
# Run it HERE, on a Debian bookworm amd64 machine with apt and network
# (the GPU machine has neither a package registry nor network). It
#   1. `apt-get download`s the .deb files of the build and test libraries
#      CMakeLists.txt and tests/CMakeLists.txt look for (the -dev package for
#      headers, .pc and the unversioned .so; the runtime package for the
#      shared object), pkgconf (CMake's FindPkgConfig needs a pkg-config) and
#      ninja (the image may have no `make`);
#   2. unpacks each with `dpkg -x` into .gpu-kit/sysroot (never into /: the
#      image's own libraries must stay as they are), keeps only headers,
#      shared objects, .pc files and the two tools, and points the .pc files
#      whose libdir says /usr/lib at the multiarch directory the objects are
#      really in (msgpack's and hiredis's);
#   3. `pip download`s the Python packages the GPU tests and the benchmark
#      may import that a CUDA/torch image does not bring (gguf and PyYAML,
#      which gguf imports at once; tqdm; msgpack for the Python client) and
#      unpacks each wheel into .gpu-kit/python/<module>/<tag>; bench/gpu/env.sh
#      adds a module's folder to PYTHONPATH only when the image cannot
#      import that module itself;
#   4. writes .gpu-kit/bin/pkg-config (pkgconf with the kit's libpkgconf)
#      and .gpu-kit/bin/ninja, and .gpu-kit/MANIFEST.
# bench/gpu/env.sh (sourced by run.sh) points the build at the kit.
#
# Idempotent: when .gpu-kit/MANIFEST already lists the versions apt and this
# script would fetch, it does nothing (FORCE=1 rebuilds). The new kit is put
# together beside the old one and swapped in only when complete.
# Usage: bench/gpu/kit.sh        (KIT_DIR=... to build it elsewhere)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
KIT="${KIT_DIR:-$ROOT/.gpu-kit}"
MA=x86_64-linux-gnu

# Debian packages: -dev (headers, .pc, libX.so) + the runtime library.
DEBS=(
    libpcre2-dev libpcre2-8-0          # PCRE2 (libpcre2-8): grammar/regex
    libxxhash-dev libxxhash0           # xxHash: page and block hashes
    liblmdb-dev liblmdb0               # LMDB: the disk tier
    libuv1-dev libuv1                  # libuv: the servers' event loop
    libmsgpack-dev libmsgpackc2        # msgpack-c: the socket protocol
    libjansson-dev libjansson4         # jansson: JSON for the HTTP facade
    libhttp-parser-dev libhttp-parser2.9  # http-parser: HTTP/1.1
    libhiredis-dev libhiredis0.14      # hiredis: the shared Redis tier
    libcmocka-dev libcmocka0           # cmocka: the C tests
    pkgconf pkgconf-bin libpkgconf3    # pkg-config for FindPkgConfig
    ninja-build                        # a build program when there is no make
)
# Python wheels, pinned so that the kit is the same every time it is built;
# module:requirement (the module is what env.sh tries to import first).
# PyYAML and msgpack ship compiled accelerators in per-CPython wheels, and
# both fall back to their pure-Python code when the accelerator is absent
# (yaml.__with_libyaml__ / msgpack.fallback): the kit keeps only that code,
# which runs on whatever Python 3 the image has and is a tenth the size.
# Nothing here is hot: gguf reads metadata, msgpack frames a few requests.
WHEELS=(gguf:gguf==0.19.0 tqdm:tqdm==4.70.1 yaml:PyYAML==6.0.3 msgpack:msgpack==1.2.4)

command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
    { echo "kit.sh: needs apt-get and dpkg (a Debian bookworm machine)" >&2; exit 1; }
[ "$(dpkg --print-architecture)" = amd64 ] ||
    { echo "kit.sh: the GPU machine is amd64; run this on amd64" >&2; exit 1; }
PIP=(python3 -m pip)
"${PIP[@]}" --version >/dev/null 2>&1 || { echo "kit.sh: needs python3 -m pip" >&2; exit 1; }

# What this run would put in the kit: package versions from apt, the wheel
# pins, and this script itself (a changed recipe is a changed kit).
want_manifest() {
    echo "# cairn device kit, built by bench/gpu/kit.sh (sha256 $(sha256sum "$0" | cut -c1-16))"
    for p in "${DEBS[@]}"; do
        v=$(apt-cache policy "$p" | sed -n 's/^ *Candidate: //p')
        [ -n "$v" ] && [ "$v" != "(none)" ] ||
            { echo "kit.sh: apt knows no candidate for $p (apt-get update?)" >&2; return 1; }
        echo "deb $p $v"
    done
    for w in "${WHEELS[@]}"; do echo "wheel ${w#*:} pure-python"; done
}
want="$(want_manifest)"
if [ "${FORCE:-0}" != 1 ] && [ -f "$KIT/MANIFEST" ] && [ "$want" = "$(cat "$KIT/MANIFEST")" ]; then
    echo "kit.sh: $KIT is up to date ($(du -sb "$KIT" | cut -f1) bytes; FORCE=1 rebuilds)"
    exit 0
fi

NEW="$KIT.new.$$"
DL="$(mktemp -d)"
trap 'rm -rf "$NEW" "$DL"' EXIT
# apt drops root to _apt for downloads; let it write here (no warning)
chmod 0777 "$DL"
mkdir -p "$NEW/sysroot" "$NEW/bin" "$NEW/python"

echo "kit.sh: downloading ${#DEBS[@]} Debian packages"
(cd "$DL" && apt-get download -q "${DEBS[@]}" >/dev/null)
S="$NEW/sysroot"
for f in "$DL"/*.deb; do dpkg -x "$f" "$S"; done

# Keep what a build and a test run use: headers, shared objects and their
# symlinks, .pc files, pkgconf and ninja. Static archives (no target links
# them: pkg_check_modules finds the .so first), CMake package files (they
# name /usr paths, and no find_package uses them), documentation, locales,
# editor modes and pcre2-config go.
rm -rf "$S/usr/share/doc" "$S/usr/share/man" "$S/usr/share/info" "$S/usr/share/lintian" \
       "$S/usr/share/locale" "$S/usr/share/doc-base" "$S/usr/share/bash-completion" \
       "$S/usr/share/emacs" "$S/usr/share/vim" "$S/usr/share/zsh" "$S/usr/share/aclocal" \
       "$S/usr/share/pkgconfig/personality.d" "$S/usr/lib/$MA/cmake" "$S/usr/bin/pcre2-config"
find "$S" -name '*.a' -delete
# pkgconf's cross-tool names only select a personality file, which is gone
rm -f "$S/usr/bin/$MA-pkg-config" "$S/usr/bin/$MA-pkgconf"
# The -dev packages' links to the libraries left behind (pcre2's 16- and
# 32-bit and POSIX ones) dangle: drop them, with the .pc files that name them.
rm -f "$S/usr/lib/$MA/pkgconfig/libpcre2-16.pc" "$S/usr/lib/$MA/pkgconfig/libpcre2-32.pc" \
      "$S/usr/lib/$MA/pkgconfig/libpcre2-posix.pc" "$S"/usr/lib/$MA/pkgconfig/*-static.pc
find "$S" -xtype l -delete
find "$S" -depth -type d -empty -delete

# .pc files whose libdir is /usr/lib although Debian installed the objects
# in /usr/lib/$MA (msgpack.pc, hiredis.pc): pkg-config's -L would point at
# an empty folder, and only CMake's own search would still find the library.
for pc in "$S/usr/lib/$MA"/pkgconfig/*.pc "$S"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] || continue
    if grep -Eq '^libdir=(/usr/lib|\$\{(exec_)?prefix\}/lib)$' "$pc" &&
        ! ls "$S"/usr/lib/lib*.so >/dev/null 2>&1; then
        sed -i -E "s|^libdir=.*$|libdir=/usr/lib/$MA|" "$pc"
        echo "kit.sh: $(basename "$pc"): libdir -> /usr/lib/$MA"
    fi
done

# Every .pc module must resolve to headers and a shared object in the kit.
# (glibc's own -lm, -lpthread, -ldl, -lrt come from the image.)
for f in "$S/usr/lib/$MA"/pkgconfig/*.pc; do
    for lib in $(sed -n 's/^Libs:\(.*\)/\1/p' "$f" | tr ' ' '\n' | sed -n 's/^-l//p'); do
        case "$lib" in m|pthread|dl|rt|c) continue ;; esac
        [ -e "$S/usr/lib/$MA/lib$lib.so" ] ||
            { echo "kit.sh: $(basename "$f") names lib$lib.so, which the kit lacks" >&2; exit 1; }
    done
done
[ -e "$S/usr/lib/$MA/libhttp_parser.so" ] && [ -e "$S/usr/include/http_parser.h" ] ||
    { echo "kit.sh: http-parser (found without pkg-config) is missing" >&2; exit 1; }

# pkgconf's own library is not on the machine's library path: a wrapper
# hands it over to pkgconf alone (putting the kit's libraries on everyone's
# LD_LIBRARY_PATH would put bookworm's libuv in front of the image's for
# cmake itself).
cat > "$NEW/bin/pkg-config" <<'EOF'
#!/bin/sh
# pkgconf from the cairn device kit, loading the kit's libpkgconf
kit=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$kit/sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    exec "$kit/sysroot/usr/bin/pkgconf" "$@"
EOF
chmod 0755 "$NEW/bin/pkg-config"
ln -s ../sysroot/usr/bin/ninja "$NEW/bin/ninja"

echo "kit.sh: downloading Python wheels"
for w in "${WHEELS[@]}"; do
    mod=${w%%:*} req=${w#*:}
    rm -rf "$DL/w" && mkdir -p "$DL/w"
    # any CPython build will do: only its Python files are kept
    "${PIP[@]}" download -q --no-deps --only-binary=:all: -d "$DL/w" \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --implementation cp --python-version 3.12 --abi cp312 "$req"
    mkdir -p "$NEW/python/$mod"
    python3 -m zipfile -e "$DL"/w/*.whl "$NEW/python/$mod"
done
find "$NEW/python" \( -name '*.so' -o -name '*.pyx' -o -name '*.c' -o -name '*.h' \) -delete
find "$NEW/python" -name '__pycache__' -prune -exec rm -rf {} +
# the fallbacks must work without their accelerators (PYTHONPATH comes
# before site-packages, so these are the kit's copies, not this machine's)
PYTHONPATH="$(printf '%s:' "$NEW"/python/*)" python3 -c '
import yaml, msgpack, tqdm
assert not yaml.__with_libyaml__
assert msgpack.unpackb(msgpack.packb({"a": [1, 2]})) == {"a": [1, 2]}
import gguf
print("kit.sh: python: gguf", gguf.__file__.split("/python/")[1], "imports with pure-Python yaml and msgpack")
'

echo "$want" > "$NEW/MANIFEST"
rm -rf "$KIT.old"
[ -e "$KIT" ] && mv "$KIT" "$KIT.old"
mv "$NEW" "$KIT"
rm -rf "$KIT.old"

bytes=$(du -sb "$KIT" | cut -f1)
tree=$(cd "$ROOT" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "kit.sh: $KIT: $bytes bytes ($(du -sh "$KIT" | cut -f1)); tracked tree $tree bytes;" \
     "together $(( (bytes + tree) / 1048576 )) MiB of the 64 MiB that travel"
[ $(( bytes + tree )) -lt $(( 60 * 1048576 )) ] ||
    { echo "kit.sh: WARNING: kit + tree is near or over the 64 MiB carry limit" >&2; exit 1; }
