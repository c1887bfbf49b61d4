# shellcheck shell=bash disable=SC2034
# Shared helpers for the scripts in scripts/. Source it; do not run it.
#
#   ZC_ROOT            the repository root
#   zc_log MSG...      a progress line on stderr, prefixed with the script name
#   zc_die MSG...      an error line on stderr, then exit 1
#   zc_wait_listen PORT
#                      wait up to 20 s until a TCP port is listened on
#   zc_ensure_packages PKG...
#                      install the Debian packages that are missing, without
#                      prompting (as root, or through sudo); a no-op when all
#                      are installed; otherwise the apt-get line to run

ZC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ZC_PROG="${ZC_PROG:-$(basename "$0")}"

zc_log() {
    printf '%s: %s\n' "$ZC_PROG" "$*" >&2
}

zc_die() {
    printf '%s: error: %s\n' "$ZC_PROG" "$*" >&2
    exit 1
}

# Seconds since the epoch with a fraction, for stage timings.
zc_now() {
    date +%s.%N
}

# Elapsed seconds since START (from zc_now), one decimal.
zc_since() {
    awk -v s="$1" -v e="$(zc_now)" 'BEGIN { printf "%.1f", e - s }'
}

# How to run a command as root, in ZC_AS_ROOT: nothing as root; `sudo`
# for a user who may use it without a password, or who is at a terminal
# to type one. Empty and `zc_can_be_root` false otherwise.
ZC_AS_ROOT=()
zc_can_be_root() {
    if [ "$(id -u)" = 0 ]; then
        ZC_AS_ROOT=()
    elif command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
        ZC_AS_ROOT=(sudo)
    else
        return 1
    fi
}

# Run `apt-get update` at most once per script run, as root (see
# zc_can_be_root; the caller checked).
zc_apt_updated=0
zc_apt_update() {
    if [ "$zc_apt_updated" = 0 ]; then
        zc_can_be_root || zc_die "apt-get update needs root: run 'sudo apt-get update', then this again"
        zc_log "apt-get update"
        "${ZC_AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || zc_die "apt-get update failed"
        zc_apt_updated=1
    fi
}

zc_ensure_packages() {
    local missing=() pkg
    # One dpkg-query for all; `dpkg -s` would also accept removed-but-configured
    # packages, so check for "install ok installed".
    declare -A installed=()
    while read -r pkg; do
        installed[$pkg]=1
    done < <(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "$@" 2>/dev/null | awk '$1 == "ii" { print $2 }')
    for pkg in "$@"; do
        [ -n "${installed[$pkg]:-}" ] || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    # Only the install needs root; everything else runs as the caller.
    zc_can_be_root || zc_die "missing packages; install them as root, then run this again:
    sudo apt-get install -y --no-install-recommends ${missing[*]}"
    zc_log "installing missing packages${ZC_AS_ROOT[*]:+ (with ${ZC_AS_ROOT[*]})}: ${missing[*]}"
    zc_apt_update
    "${ZC_AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >&2 </dev/null || zc_die "apt-get install ${missing[*]} failed"
}

# What the Soft-RoCE guest needs on the host: QEMU, the initramfs tools, and
# the rdma-core user space that runs (from the host's root) inside the guest.
ZC_GUEST_PACKAGES=(
    qemu-system-x86 busybox-static cpio kmod xz-utils binutils
    rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
    iproute2
)

# What building the RDMA crate needs (bindgen for rdma-sys), and libzmq for
# the benches' ZeroMQ baselines (feature `zeromq`, built by --all-features).
ZC_BUILD_PACKAGES=(
    libibverbs-dev librdmacm-dev libclang-dev pkg-config
    libzmq3-dev
)

# The median, min and max of the numbers on stdin, as "1.23x [1.01-1.40]".
zc_summary() {
    sort -g | awk '{ v[NR] = $1 } END {
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.2fx [%.2f-%.2f]", m, v[1], v[NR] }'
}

# The ratio of zerocast's best round to the baseline's, as "1.23x", from
# "baseline zerocast" value pairs on stdin, one round a line; $1 says which
# value is best: `lower` (a latency) or `higher` (a rate).
zc_best_ratio() {
    awk -v lower="$([ "$1" = lower ] && echo 1 || echo 0)" '
        NR == 1 || (lower ? $1 < b : $1 > b) { b = $1 }
        NR == 1 || (lower ? $2 < z : $2 > z) { z = $2 }
        END { if (NR && b > 0) printf "%.2fx", z / b; else print "-" }'
}

# The GID index of port 1 of verbs device $1 that holds address $2 as an
# IPv4-mapped RoCE v2 GID (perftest's -x), waiting up to 10 s for it.
zc_roce_gid_index() {
    local dev="$1" a b c d want f n gid type i
    IFS=. read -r a b c d <<<"$2"
    want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
    for ((i = 0; i < 50; i++)); do
        for f in /sys/class/infiniband/"$dev"/ports/1/gids/*; do
            n=${f##*/}
            read -r gid <"$f" 2>/dev/null || continue
            [ "$gid" = "$want" ] || continue
            read -r type <"/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$n" 2>/dev/null || continue
            [ "$type" = "RoCE v2" ] && { echo "$n"; return 0; }
        done
        sleep 0.2
    done
    return 1
}

# Wait up to 20 s (or $2 tenths of a second) for a TCP port to be listened
# on (state 0A: LISTEN).
zc_wait_listen() {
    local hex i
    hex=$(printf ':%04X ' "$1")
    for ((i = 0; i < ${2:-200}; i++)); do
        grep -h "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A"' | grep -q . && return 0
        sleep 0.1
    done
    return 1
}
