# bench/gpu/env.sh — sourced by bench/gpu/run.sh (and bench/gpu/kit_dryrun.sh):
# shellcheck shell=bash
# the build environment of a bare GPU machine, from the device kit that
# bench/gpu/kit.sh puts in .gpu-kit and the CUDA libraries the image has.
#
# With .gpu-kit present (CAIRN_KIT=... names another folder):
#   - pkg-config is the kit's pkgconf (PKG_CONFIG, which CMake's FindPkgConfig
#     reads), looking ONLY at the kit's .pc files (PKG_CONFIG_LIBDIR) and
#     prefixing every -I/-L they give with the kit (PKG_CONFIG_SYSROOT_DIR);
#   - CMAKE_PREFIX_PATH starts with the kit's /usr, for what CMakeLists.txt
#     finds without pkg-config (http_parser.h, libhttp_parser);
#   - the kit's bin/ (ninja, pkg-config) goes at the END of PATH: it fills
#     gaps and never shadows the image's tools; with no `make` on the machine
#     CMAKE_GENERATOR becomes Ninja;
#   - a Python module of the kit (gguf, yaml, tqdm, msgpack) joins PYTHONPATH
#     only when the image's python3 cannot import its own.
# The kit's shared libraries are deliberately NOT put on LD_LIBRARY_PATH:
# cmake and ctest may themselves link the image's libuv (a newer one than
# bookworm's), and must keep it. The binaries cairn builds reach the kit's
# libraries through the RUNPATH CMake gives build-tree binaries for
# libraries linked by full path (run.sh checks with ldd before any test).
#
# Then, kit or not: the folders holding libcudart.so.13 and libcublas.so.13
# (the backend dlopens cuBLAS) are found — the dynamic linker's cache,
# beside nvcc, /usr/local/cuda*, /opt, python's site-packages/nvidia — and
# put at the front of LD_LIBRARY_PATH when the linker would not find them.
#
# Sets CAIRN_ENV_NOTES (one line per fact, for run.sh's report) and
# CAIRN_KIT_SYSROOT (empty without a kit). Needs ROOT (the repository).

CAIRN_ENV_NOTES=""
cairn_env_note() { CAIRN_ENV_NOTES="${CAIRN_ENV_NOTES}$*"$'\n'; echo "env: $*"; }

CAIRN_KIT="${CAIRN_KIT:-$ROOT/.gpu-kit}"
CAIRN_KIT_SYSROOT=""
cairn_kit_ma=x86_64-linux-gnu

# Decide the generator before the kit's ninja joins PATH: `make` is only
# missing if the image lacks it.
if [ -z "${CMAKE_GENERATOR:-}" ] && ! command -v make >/dev/null 2>&1; then
    export CMAKE_GENERATOR=Ninja
fi

if [ -d "$CAIRN_KIT/sysroot" ]; then
    CAIRN_KIT_SYSROOT="$CAIRN_KIT/sysroot"
    export PKG_CONFIG="$CAIRN_KIT/bin/pkg-config"
    export PKG_CONFIG_LIBDIR="$CAIRN_KIT_SYSROOT/usr/lib/$cairn_kit_ma/pkgconfig:$CAIRN_KIT_SYSROOT/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$CAIRN_KIT_SYSROOT"
    # PKG_CONFIG_PATH would be searched before LIBDIR: an outside .pc file
    # prefixed with the kit's sysroot would point nowhere
    unset PKG_CONFIG_PATH
    export CMAKE_PREFIX_PATH="$CAIRN_KIT_SYSROOT/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export PATH="$PATH:$CAIRN_KIT/bin"
    cairn_env_note "kit $CAIRN_KIT ($(du -sh "$CAIRN_KIT" 2>/dev/null | cut -f1);" \
        "$(grep -c '^deb ' "$CAIRN_KIT/MANIFEST" 2>/dev/null) Debian packages)"

    cairn_env_py=()
    for cairn_env_mod in yaml tqdm msgpack gguf $(ls "$CAIRN_KIT/python" 2>/dev/null); do
        [ -d "$CAIRN_KIT/python/$cairn_env_mod" ] || continue
        case " ${cairn_env_py[*]-} " in *" $cairn_env_mod "*) continue ;; esac
        # from / : in the repository root, cairn's own gguf/ folder would
        # import as an (empty) namespace package
        if ! (cd / && python3 -c "import $cairn_env_mod") >/dev/null 2>&1; then
            export PYTHONPATH="$CAIRN_KIT/python/$cairn_env_mod${PYTHONPATH:+:$PYTHONPATH}"
            cairn_env_py+=("$cairn_env_mod")
        fi
    done
    cairn_env_note "python modules from the kit: ${cairn_env_py[*]:-none (the image has them all)}"
    unset cairn_env_py cairn_env_mod
else
    cairn_env_note "no kit at $CAIRN_KIT: building against the machine's own -dev packages"
fi
command -v pkg-config >/dev/null 2>&1 || [ -n "${PKG_CONFIG:-}" ] ||
    cairn_env_note "WARNING: no pkg-config (run bench/gpu/kit.sh and carry .gpu-kit)"
cairn_env_note "generator ${CMAKE_GENERATOR:-Unix Makefiles (make $(command -v make))}"

# ---- CUDA runtime and cuBLAS ---------------------------------------------------
# cairn_cuda_lib_dir SONAME: prints "linker" when the dynamic linker finds
# SONAME by itself, else the first folder holding it, else nothing.
cairn_cuda_lib_dir() {
    local so="$1" d nvcc_bin sp
    if { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } |
        grep -q "[[:space:]]${so}[[:space:]]"; then
        echo linker
        return
    fi
    nvcc_bin="$(command -v "${CUDACXX:-nvcc}" 2>/dev/null || echo /usr/local/cuda/bin/nvcc)"
    nvcc_bin="$(readlink -f "$nvcc_bin" 2>/dev/null || echo "$nvcc_bin")"
    for d in "$(dirname "$nvcc_bin")/../lib64" "$(dirname "$nvcc_bin")/../targets/x86_64-linux/lib" \
             /usr/local/cuda/lib64 /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib \
             $(echo "${LD_LIBRARY_PATH:-}" | tr : " "); do
        [ -e "$d/$so" ] && { (cd "$d" && pwd -P); return; }
    done
    # pip's CUDA wheels: site-packages/nvidia/<part>/lib (cu13: nvidia/cu13/lib)
    for sp in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null); do
        [ -d "$sp/nvidia" ] || continue
        d="$(find "$sp/nvidia" -maxdepth 4 -name "$so" 2>/dev/null | head -1)"
        [ -n "$d" ] && { dirname "$d"; return; }
    done
    d="$(timeout 30 find /usr/local /opt /usr/lib -maxdepth 7 -name "$so" 2>/dev/null | head -1)"
    [ -n "$d" ] && dirname "$d"
}
for cairn_env_so in libcudart.so.13 libcublas.so.13; do
    cairn_env_d="$(cairn_cuda_lib_dir "$cairn_env_so")"
    case "$cairn_env_d" in
        "") cairn_env_note "$cairn_env_so: NOT FOUND" ;;
        linker) cairn_env_note "$cairn_env_so: found by the dynamic linker" ;;
        *)
            case ":${LD_LIBRARY_PATH:-}:" in
                *":$cairn_env_d:"*) ;;
                *) export LD_LIBRARY_PATH="$cairn_env_d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
            esac
            cairn_env_note "$cairn_env_so: $cairn_env_d (on LD_LIBRARY_PATH)" ;;
    esac
done
unset cairn_env_so cairn_env_d
# The driver's libcuda.so.1 belongs to the machine: reported, never moved
# (a toolkit's compat/ or stubs/ copy in front of the real one breaks it).
if { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep -q "[[:space:]]libcuda.so.1[[:space:]]"; then
    cairn_env_note "libcuda.so.1 (driver): found by the dynamic linker"
else
    cairn_env_d=""
    for cairn_env_so in $(echo "${LD_LIBRARY_PATH:-}" | tr : " "); do
        [ -e "$cairn_env_so/libcuda.so.1" ] && { cairn_env_d="$cairn_env_so"; break; }
    done
    cairn_env_note "libcuda.so.1 (driver): ${cairn_env_d:-not found by the linker nor on LD_LIBRARY_PATH (no CUDA device will start)}"
    unset cairn_env_so cairn_env_d
fi
