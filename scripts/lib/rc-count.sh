# shellcheck shell=bash
# How many instructions each RC latency tool's echoing side spends on one
# message, counted by callgrind in the Soft-RoCE guest. Sourced by
# scripts/perf-vs-perftest (--count).
#
# Under TCG a half round trip's user-space part costs time roughly in
# proportion to the instructions it runs, but the guest's speed drifts
# between runs, so timed ratios need many rounds. An instruction count does
# not drift with the guest's speed: it stays within a few percent from one
# run to the next, so it tells whether a change to the data path moved the
# user-space turnaround, and by how much, in one run.
#
# The echoing side (ib_send_lat's server, zerocast-perf's server) runs
# under callgrind twice, for RC_COUNT_FEW and RC_COUNT_MANY round trips; the
# difference of the two totals, over the difference of the two counts, is
# the cost of one message (receive, reply, repost) without the start-up,
# the connection set-up and the end, which both runs share. What the
# echoing thread runs in user space is counted: the tool, its library and
# rdma-core's rxe provider; the kernel's part (rxe itself) is not, nor are
# zerocast's engine thread's runs, which are off the round trip's path and
# come and go with the timing of the two threads (how often the engine
# finds the sending thread posting).
#
# Under callgrind the echoing side is far slower than its peer, so a
# message is most often there when it polls. The empty polls there are
# counted too, and how many there are depends on timing: at 64 B,
# ib_send_lat's count read 1,054-1,193 per message in four runs, and
# zerocast-perf's 2,547-2,613 in three runs of one build.

RC_COUNT_FEW=1000
RC_COUNT_MANY=3000

# The instruction total of the main thread in callgrind's output FILE
# (written per thread: FILE-01 is the first).
rc_count_total() {
    awk '$1 == "summary:" { print $2; found = 1; exit } END { exit !found }' "$1-01"
}

# rc_count_one WHO SIZE: instructions per message of WHO's (perftest or
# zerocast) echoing thread, one number.
rc_count_one() {
    local who="$1" size="$2" n out totals=()
    for n in "$RC_COUNT_FEW" "$RC_COUNT_MANY"; do
        out="$LOGS/callgrind.$who.$size.$n"
        rm -f "$out"-*
        SERVER_WRAP=(valgrind -q --tool=callgrind --separate-threads=yes "--callgrind-out-file=$out")
        local rc=0
        if [ "$who" = perftest ]; then
            perftest ib_send_lat "$size" "$n" >/dev/null || rc=$?
        else
            zcperf lat rc "$size" "$n" >/dev/null || rc=$?
        fi
        SERVER_WRAP=()
        [ "$rc" = 0 ] || return 1
        totals+=("$(rc_count_total "$out")") || { echo "no callgrind total in $out" >&2; return 1; }
    done
    awk -v a="${totals[0]}" -v b="${totals[1]}" -v n1="$RC_COUNT_FEW" -v n2="$RC_COUNT_MANY" \
        'BEGIN { printf "%.0f", (b - a) / (n2 - n1) }'
}

# rc_count_lat SIZE: count both tools at SIZE and add a row to COUNTS.
rc_count_lat() {
    local size="$1" p z
    p=$(rc_count_one perftest "$size") || return 1
    z=$(rc_count_one zerocast "$size") || return 1
    echo "  counted at $size B: ib_send_lat $p, zerocast-perf $z instructions per message" >&2
    COUNTS+=("$(awk -v s="$size" -v p="$p" -v z="$z" 'BEGIN {
        printf "| %d B | %d | %d | %+d | %.2fx |", s, p, z, z - p, z / p }')")
}
