#!/usr/bin/env bash
# deploy/check-fresh-root.sh TARBALL [bookworm|noble ...]: unpacks a release tarball
# (make dist) into a freshly bootstrapped minimal Debian 12 (bookworm) and Ubuntu 24.04
# (noble) root each and, chrooted there with an empty environment, makes the demo
# model with the tarball's bloomery-mkmodel, serves it with bloomery-serve (a worker
# and the hosttier), asks for a completion from outside and runs bloomery-cli. Checks
# that no program of the tarball misses a library (ldd) in those roots. Needs root,
# debootstrap and the distributions' mirrors (DEBIAN_MIRROR, UBUNTU_MIRROR); a root is
# kept in ROOTS_DIR (default /var/tmp/bloomery-roots) for the next run. Exit 0 when
# every root passed. A release check, not part of make test (it downloads about
# 100 MB a root).
set -euo pipefail

TARBALL=${1:?usage: check-fresh-root.sh TARBALL [bookworm|noble ...]}
shift
SUITES=("${@:-bookworm noble}")
read -r -a SUITES <<<"${SUITES[*]}"
ROOTS_DIR=${ROOTS_DIR:-/var/tmp/bloomery-roots}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
UBUNTU_MIRROR=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
PORT=${PORT:-18577}

die() {
    echo "check-fresh-root: $*" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || die "needs root (chroot, mounts)"
command -v debootstrap >/dev/null || die "needs debootstrap (apt-get install debootstrap)"
[ -f "$TARBALL" ] || die "$TARBALL: no such file"
NAME=$(basename "$TARBALL" .tar.gz) # dist.sh: the folder inside has the tarball's name

mounted=()
cleanup() {
    pkill -f "bloomery-serve -m /opt/demo.gguf --port $PORT" 2>/dev/null || true
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT

check_root() {
    local suite=$1 root=$ROOTS_DIR/$1
    if [ ! -x "$root/bin/sh" ]; then
        case $suite in
        bookworm) debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" >"$root.log" 2>&1 ;;
        noble) debootstrap --variant=minbase --no-check-gpg noble "$root" "$UBUNTU_MIRROR" \
            /usr/share/debootstrap/scripts/gutsy >"$root.log" 2>&1 ;;
        *) die "$suite: bookworm or noble" ;;
        esac || die "$suite: debootstrap failed (see $root.log)"
    fi
    rm -rf "$root/opt/t" && mkdir -p "$root/opt/t"
    tar xzf "$TARBALL" -C "$root/opt/t"
    local t=/opt/t/$NAME
    for m in proc dev sys; do
        mount --bind "/$m" "$root/$m" && mounted+=("$root/$m")
    done
    mount -t tmpfs tmpfs "$root/dev/shm" && mounted+=("$root/dev/shm") # the rings
    local in=(chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root)
    echo "== $suite: $(grep -h PRETTY_NAME "$root/etc/os-release" | cut -d= -f2), $("${in[@]}" dpkg -l | grep -c '^ii') packages"
    local missing
    missing=$("${in[@]}" /bin/sh -c "for p in $t/bin/bloomery-*; do ldd \$p 2>/dev/null | grep 'not found'; done" || true)
    [ -z "$missing" ] || die "$suite: libraries not found: $missing"
    "${in[@]}" "$t/bin/bloomery-mkmodel" -o /opt/demo.gguf --layers 4 --n-embd 256 --experts 8 \
        --experts-used 2 --expert-ff 256 >/dev/null || die "$suite: bloomery-mkmodel failed"
    "${in[@]}" "$t/bin/bloomery-serve" -m /opt/demo.gguf --port "$PORT" -t 1 -tb 1 -c 1024 \
        -ot '\.ffn_(up|down|gate)_exps=HOSTTIER' >"$root/opt/serve.log" 2>&1 &
    local ok=0
    for _ in $(seq 60); do
        if grep -q "serve event=ready" "$root/opt/serve.log"; then ok=1; break; fi
        sleep 0.5
    done
    [ $ok = 1 ] || die "$suite: the server did not get ready: $(tail -5 "$root/opt/serve.log")"
    local reply
    reply=$(curl -s "127.0.0.1:$PORT/completion" -d '{"prompt":"The old lighthouse keeper","n_predict":4,"temperature":0}')
    echo "$reply" | grep -q '"tokens_predicted":4' || die "$suite: no completion: $reply"
    grep -o 'child_ready process=[a-z0-9]* pid=[0-9]* kernels="[^"]*"' "$root/opt/serve.log" | sed 's/^/  /'
    pkill -f "bloomery-serve -m /opt/demo.gguf --port $PORT"
    wait
    "${in[@]}" "$t/bin/bloomery-cli" -m /opt/demo.gguf -p Hello -n 4 -t 1 >/dev/null 2>&1 || die "$suite: bloomery-cli failed"
    echo "  ok: ldd, bloomery-mkmodel, bloomery-serve (worker, hosttier) answered, bloomery-cli"
    cleanup
    mounted=()
}

mkdir -p "$ROOTS_DIR"
for s in "${SUITES[@]}"; do check_root "$s"; done
