# shellcheck shell=bash
# Where an RC round trip spends its time, in the kernel and in user space,
# from ftrace in the Soft-RoCE guest. Sourced by scripts/perf-vs-perftest
# (--trace); needs root and tracefs, which the guest has.
#
# rxe carries a send on loopback inside the sender's post system call: the
# `write` to the verbs device runs the requester, and the responder writes
# the peer's receive completion before the call returns. Four points are
# traced: the post's `write` entering (raw_syscalls:sys_enter, NR 1, of the
# 32-byte command rdma-core's rxe provider writes to ring the doorbell),
# `rxe_post_send`, the first `rxe_rcv` (the packet at the peer's QP) and
# `rxe_cq_post` called by `rxe_responder` (the peer's completion written).
# A half round trip splits into:
#
#   uverbs      write entered -> rxe_post_send      (the verbs layer)
#   requester   rxe_post_send -> rxe_rcv            (building the packet)
#   responder   rxe_rcv -> the peer's completion    (landing it)
#   turnaround  the peer's completion -> the peer's next post's write
#               (user space: noticing it, the library, posting the reply)
#
# Each figure is the mean of the middle 90% of samples, in microseconds of
# the traced run: tracing slows every part, so compare tools with each
# other, not with untraced runs. Timestamps are whole microseconds; the
# means over thousands of samples are finer than that.

RC_TRACE_FS=/sys/kernel/tracing

# Set the tracer up (once); fails when tracefs or rdma_rxe's symbols are
# missing.
rc_trace_setup() {
    local t="$RC_TRACE_FS"
    [ -d "$t/events" ] || mount -t tracefs nodev "$t" || return 1
    local f
    for f in rxe_post_send rxe_rcv rxe_cq_post; do
        grep -q "^$f " "$t/available_filter_functions" || {
            echo "rc-trace: $f cannot be traced (is rdma_rxe loaded?)" >&2
            return 1
        }
    done
    echo nop >"$t/current_tracer"
    echo 'rxe_post_send rxe_rcv rxe_cq_post' >"$t/set_ftrace_filter"
    echo function >"$t/current_tracer"
    local e
    for e in sys_enter sys_exit; do
        echo 'id == 1' >"$t/events/raw_syscalls/$e/filter"
        echo 1 >"$t/events/raw_syscalls/$e/enable"
    done
    echo 65536 >"$t/buffer_size_kb"
    echo 0 >"$t/tracing_on"
}

# Undo rc_trace_setup.
rc_trace_teardown() {
    local t="$RC_TRACE_FS"
    echo 0 >"$t/tracing_on"
    echo 0 >"$t/events/raw_syscalls/sys_enter/enable"
    echo 0 >"$t/events/raw_syscalls/sys_exit/enable"
    echo nop >"$t/current_tracer"
    echo >"$t/set_ftrace_filter"
}

# Run the command in "$@" traced, and copy the trace to $RC_TRACE_OUT.
rc_traced() {
    local t="$RC_TRACE_FS" rc=0
    echo >"$t/trace"
    echo 1 >"$t/tracing_on"
    "$@" || rc=$?
    echo 0 >"$t/tracing_on"
    cp "$t/trace" "$RC_TRACE_OUT"
    return "$rc"
}

# The split of the trace FILE for the processes named COMM (a prefix of the
# command name as the trace shows it, up to 15 characters), one line:
# "uverbs requester responder turnaround sum samples".
rc_trace_split() {
    awk -v comm="$2" '
        /^#/ { next }
        {
            who = $1; pid = who; sub(/-[0-9]+$/, "", who); sub(/.*-/, "", pid)
            if (index(who, comm) != 1) next
            ts = $4; sub(/:$/, "", ts); ts *= 1e6
            ev = $5
        }
        ev == "sys_enter:" && $7 == "1" && $10 == "20," {
            # The peer completion this post answers: the other process'"'"'s last.
            for (p in cqe) if (p != pid) { print "turnaround", ts - cqe[p]; delete cqe[p] }
            enter[pid] = ts; post[pid] = rcv[pid] = ""; next
        }
        !(pid in enter) { next }
        ev == "rxe_post_send" && post[pid] == "" { post[pid] = ts; next }
        ev == "rxe_rcv" && post[pid] != "" && rcv[pid] == "" { rcv[pid] = ts; next }
        ev == "rxe_cq_post" && $6 == "<-rxe_responder" && rcv[pid] != "" {
            print "uverbs", post[pid] - enter[pid]
            print "requester", rcv[pid] - post[pid]
            print "responder", ts - rcv[pid]
            cqe[pid] = ts; delete enter[pid]; next
        }
        ev == "sys_exit:" { delete enter[pid] }
    ' "$1" | sort -k1,1 -k2g | awk '
        function flush() {
            if (k == "") return
            lo = int(n / 20); hi = n - lo; s = 0
            for (i = lo + 1; i <= hi; i++) s += v[i]
            mean[k] = s / (hi - lo); count[k] = n
        }
        $1 != k { flush(); k = $1; n = 0 }
        { v[++n] = $2 }
        END {
            flush()
            if (count["responder"] < 100 || count["turnaround"] < 100) { print "too few samples"; exit 1 }
            printf "%.2f %.2f %.2f %.2f %.2f %d\n", mean["uverbs"], mean["requester"], mean["responder"],
                mean["turnaround"], mean["uverbs"] + mean["requester"] + mean["responder"] + mean["turnaround"],
                count["responder"]
        }'
}
