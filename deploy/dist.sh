#!/usr/bin/env bash
# deploy/dist.sh BUILD_DIR OUT_DIR: packs a built tree into a release tarball that runs
# on another Linux host of the same architecture without installing anything but the
# base system (`make dist` runs it with $(BUILD) and $(DISTDIR)). Writes
#   OUT_DIR/bloomery-VERSION-linux-ARCH[-cuda].tar.gz
# and prints its path on the last line. Inside, one folder of the same name:
#   bin/      every bloomery-* program of BUILD_DIR/bin, tools/bloomery-load and deploy/bloomery-launch.
#             bloomery-serve starts bloomery-worker and bloomery-hosttier from its own
#             folder (/proc/self/exe), so the three stay together here.
#   lib/      the shared libraries the programs need, less the base system's (below)
#   share/doc/bloomery/   README.md, docs/*.md (as docs/, so README's links hold),
#             LICENSE when there is one, and third-party/: the Debian copyright file
#             of each library in lib/ and a list of where each came from
#   examples/ bloomery.service, bloomery.env and bloomery-wait-ready from
#             deploy/systemd, their paths rewritten for the tarball unpacked (or
#             linked) at /opt/bloomery, as `make install` rewrites them for PREFIX
# The programs find lib/ through their run path ($ORIGIN/../lib), and each library its
# neighbours through its own ($ORIGIN): no LD_LIBRARY_PATH, no ldconfig. The run paths
# are set with patchelf on the copies; the build tree is never modified.
#
# VERSION is BL_VERSION of BUILD_DIR/bl_config.h, i.e. meson.build's project()
# version as the build was configured: the version the programs themselves report.
# Not `git describe`: the name must match what the programs say, and a tree exported
# without .git must still pack. -cuda is added when that header says BL_HAVE_CUDA 1.
set -euo pipefail
shopt -s nullglob

die() {
    echo "dist: $*" >&2
    exit 1
}

[ $# -eq 2 ] || die "usage: deploy/dist.sh BUILD_DIR OUT_DIR"
build=$1
out=$2
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the source tree: README, docs, tools

# --- what is packed ---------------------------------------------------------------

# The programs every build makes (meson.build's executable()s); a build folder that
# lacks one is refused rather than packed into a tarball that lacks it. Any other
# bloomery-* of BUILD_DIR/bin is packed too.
REQUIRED=(bloomery-serve bloomery-worker bloomery-hosttier bloomery-node bloomery-cli bloomery-bench
          bloomery-gguf bloomery-mkmodel bloomery-tokenize bloomery-template
          bloomery-stepbench bloomery-ringbench)

# Libraries taken from the host that runs the tarball, never bundled:
#   glibc's own (the loader, libc, libm, libmvec, libpthread, libdl, librt, libresolv,
#     libutil, libanl): they must all be of the one glibc that runs them, as they call
#     each other through GLIBC_PRIVATE symbols, and every Linux system has them;
#   libgcc_s and libstdc++: GCC's runtime, present on every Debian and Ubuntu system
#     (apt itself needs them), and backward compatible;
#   the NVIDIA driver's libcuda and libnvidia-*: they must match the kernel module.
# Everything else a program links (libjansson, libzmq, libcurl, their dependencies)
# is copied into lib/, also what a fresh Debian 12 or Ubuntu 24.04 happens to have.
is_system_lib() {
    case $1 in
        linux-vdso.so.* | ld-linux*.so.* | libc.so.6 | libm.so.6 | libmvec.so.1 | \
        libpthread.so.0 | libdl.so.2 | librt.so.1 | libresolv.so.2 | libutil.so.1 | \
        libanl.so.1 | libgcc_s.so.1 | libstdc++.so.6 | libcuda.so.1 | libnvidia-*.so*)
            return 0 ;;
    esac
    return 1
}

# --- the build folder -------------------------------------------------------------

[ -d "$build" ] || die "$build is not a folder (run make build)"
config=$build/bl_config.h
[ -f "$config" ] || die "$config is missing: $build is not a configured build folder (run make build)"
version=$(sed -n 's/^#define BL_VERSION "\(.*\)"$/\1/p' "$config")
[ -n "$version" ] || die "$config has no BL_VERSION"
cuda=
if grep -qx '#define BL_HAVE_CUDA 1' "$config"; then cuda=-cuda; fi
name=bloomery-$version-linux-$(uname -m)$cuda

missing=()
for p in "${REQUIRED[@]}"; do
    [ -x "$build/bin/$p" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || die "$build/bin lacks ${missing[*]}: refusing to pack an incomplete build (run make build)"
[ -x "$src/tools/bloomery-load" ] || die "$src/tools/bloomery-load is missing"
command -v patchelf >/dev/null || die "patchelf is not installed (Debian package patchelf; make deps installs it)"
for tool in ldd objdump; do
    command -v $tool >/dev/null || die "$tool is not installed"
done

is_elf() {
    [ "$(head -c 4 "$1" | od -An -c | tr -d ' \n')" = '177ELF' ]
}

# --- staging ----------------------------------------------------------------------

mkdir -p "$out"
stage=$(readlink -f "$(mktemp -d "$out/.dist.XXXXXX")")
trap 'rm -rf "$stage"' EXIT
top=$stage/$name
mkdir -p "$top/bin" "$top/lib" "$top/share/doc/bloomery/docs" "$top/share/doc/bloomery/third-party" \
    "$top/examples"

# Copies, never links: patchelf below rewrites them in place (build/bin holds hard
# links to the build's own files).
for f in "$build"/bin/bloomery-* "$src/tools/bloomery-load" "$src/deploy/bloomery-launch"; do
    cp "$f" "$top/bin/"
    chmod 755 "$top/bin/${f##*/}"
done

# The libraries: every one ldd resolves for a program (ldd lists the dependencies of
# dependencies too), less the system's. They are looked up as the program finds them
# itself (its run path, the loader's cache), without LD_LIBRARY_PATH, which the
# target host will not have set for it.
declare -A bundled=()  # soname -> the path it was copied from
for f in "$top"/bin/*; do
    is_elf "$f" || continue
    while read -r soname arrow path _; do
        [ "$arrow" = "=>" ] || continue  # the vdso and the loader's own line
        [ "$path" != "not" ] || die "${f##*/} needs $soname, which does not resolve here without LD_LIBRARY_PATH"
        is_system_lib "$soname" && continue
        [ -n "${bundled[$soname]:-}" ] && continue
        cp -L "$path" "$top/lib/$soname"
        chmod 644 "$top/lib/$soname"
        bundled[$soname]=$path
    done < <(env -u LD_LIBRARY_PATH ldd "$f")
done

# $ORIGIN is the loader's (the folder of the file being loaded), not the shell's.
# shellcheck disable=SC2016
origin='$ORIGIN'
for f in "$top"/bin/*; do
    if is_elf "$f"; then patchelf --set-rpath "$origin/../lib" "$f"; fi
done
for f in "$top"/lib/*; do
    patchelf --set-rpath "$origin" "$f"
done

# The check a target host would make: with no LD_LIBRARY_PATH, every library of every
# program and bundled library comes from lib/ or is one of the system's.
for f in "$top"/bin/* "$top"/lib/*; do
    is_elf "$f" || continue
    while read -r soname arrow path _; do
        [ "$arrow" = "=>" ] || continue
        [ "$path" != "not" ] || die "after patchelf, ${f#"$top"/} cannot find $soname"
        is_system_lib "$soname" && continue
        [ "$(readlink -f "$path")" = "$top/lib/$soname" ] || die "${f#"$top"/} takes $soname from $path, not from lib/"
    done < <(env -u LD_LIBRARY_PATH ldd "$f")
done

# The newest glibc and libstdc++ symbol versions that anything here asks for: what the
# host must have at least (the glibc of the build machine sets the floor).
versions=$(for f in "$top"/bin/* "$top"/lib/*; do
    if is_elf "$f"; then objdump -T "$f"; fi
done | grep -oE '\bGLIBC(XX)?_[0-9][0-9.]*' | sort -u -V)
needs="$(grep '^GLIBC_' <<<"$versions" | tail -n 1) $(grep '^GLIBCXX_' <<<"$versions" | tail -n 1 || true)"

# --- docs and examples ------------------------------------------------------------

install -m 644 "$src/README.md" "$top/share/doc/bloomery/README.md"
install -m 644 "$src"/docs/*.md "$top/share/doc/bloomery/docs/"
if [ -f "$src/LICENSE" ]; then install -m 644 "$src/LICENSE" "$top/share/doc/bloomery/LICENSE"; fi

# Where each bundled library came from (its Debian package and version), and that
# package's copyright file, which its license asks to ship with the binary. dpkg knows
# a file by the path its package ships it at, /lib/... or /usr/lib/... (one folder on
# a merged-/usr system), by its real name or its soname's link: every spelling is
# asked, in one dpkg-query call (each call reads the whole database).
declare -A pkg_of=()  # path -> package
if command -v dpkg-query >/dev/null; then
    paths=()
    for soname in "${!bundled[@]}"; do
        for p in "${bundled[$soname]}" "$(readlink -f "${bundled[$soname]}")"; do
            paths+=("$p" "/usr${p#/usr}" "${p#/usr}")
        done
    done
    # "pkg:arch: /path", or "pkg1, pkg2: /path" for a path two packages share
    while IFS= read -r line; do
        pkg=${line%%: /*}
        pkg=${pkg%%,*}
        pkg_of[${line#*: }]=${pkg%%:*}
    done < <(dpkg-query -S "${paths[@]}" 2>/dev/null || true)
fi
{
    echo "# The libraries in lib/: soname, Debian package (version), the file it was copied from."
    echo "# Each package's copyright file is in the folder of its name beside this list."
    echo "# The host must provide glibc and libstdc++ with at least: $needs"
    for soname in $(printf '%s\n' "${!bundled[@]}" | sort); do
        path=${bundled[$soname]}
        real=$(readlink -f "$path")
        pkg=
        for p in "$path" "/usr${path#/usr}" "${path#/usr}" "$real" "/usr${real#/usr}" "${real#/usr}"; do
            pkg=${pkg_of[$p]:-}
            [ -z "$pkg" ] || break
        done
        if [ -z "$pkg" ]; then
            echo "$soname (not from a Debian package) $path"
            continue
        fi
        echo "$soname $pkg ($(dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null | head -n 1)) $path"
        if [ -f "/usr/share/doc/$pkg/copyright" ]; then
            install -D -m 644 "/usr/share/doc/$pkg/copyright" \
                "$top/share/doc/bloomery/third-party/$pkg/copyright"
        fi
    done
} > "$top/share/doc/bloomery/third-party/LIBRARIES"

# deploy/systemd's files name the default install layout (/usr/local); here they name
# the tarball's own layout under /opt/bloomery, with the readiness check and the
# example env files in examples/ (the router's unit, and the node units of a
# cluster's other hosts).
units=(bloomery.service bloomery.env bloomery-node.service bloomery-node@.service bloomery-node.env)
for u in "${units[@]}"; do
    install -m 644 "$src/deploy/systemd/$u" "$top/examples/"
done
install -m 755 "$src/deploy/systemd/bloomery-wait-ready" "$top/examples/"
sed -i -e 's|/usr/local/bin/|/opt/bloomery/bin/|g' \
    -e 's|/usr/local/libexec/bloomery/|/opt/bloomery/examples/|g' \
    -e 's|/usr/local/share/doc/bloomery/examples/|/opt/bloomery/examples/|g' \
    -e 's|/usr/local/share/doc/bloomery|/opt/bloomery/share/doc/bloomery|g' \
    "${units[@]/#/$top/examples/}"

# --- the tarball ------------------------------------------------------------------

# Owned by root in the archive whoever builds it, entries in a fixed order.
tarball=$out/$name.tar.gz
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -cf - "$name" | gzip -n > "$stage/$name.tar.gz"
mv -f "$stage/$name.tar.gz" "$tarball"
progs=("$top"/bin/*)
libs=("$top"/lib/*)
echo "dist: ${#progs[@]} programs, ${#libs[@]} libraries, $(du -h "$tarball" | cut -f1);" \
    "the host needs $needs"
echo "$tarball"
