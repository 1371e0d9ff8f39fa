#!/usr/bin/env bash
# ROS 2 node tests: builds the `ros` feature, runs the ros module's unit tests, starts a node as a
# process, runs the rclpy peer against it (test/ros/peer.py), checks a clean Ctrl-C shutdown, and
# checks that every node executable starts and stops cleanly.
#
#   bash test/ros/run.sh            # NODE=voxelizer by default; BIG=1 adds a 5 MB scan
#   SKIP_UNIT=1 bash test/ros/run.sh
#
# Uses a unique ROS_DOMAIN_ID and ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST; waits for conditions,
# never for fixed discovery delays. Ends with 'N passed, N failed'.
set -eo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

# shellcheck source=../../scripts/ros-env.sh
source scripts/ros-env.sh
set -u
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/ros}"
NODE="${NODE:-voxelizer}"
BINS=(voxelizer sampler neighbors nms pipeline)
bindir="$CARGO_TARGET_DIR/release"
logdir="$CARGO_TARGET_DIR/test-ros-logs"
mkdir -p "$logdir"

passed=0
failed=0
check() { # check OK_CONDITION_RC "what"
    if [ "$1" = 0 ]; then echo "PASS $2"; passed=$((passed + 1)); else echo "FAIL $2"; failed=$((failed + 1)); fi
}

t0=$(date +%s)
cargo build --release --features ros $(printf -- '--bin %s ' "${BINS[@]}")
echo "build: $(( $(date +%s) - t0 )) s"

if [ "${SKIP_UNIT:-0}" != 1 ]; then
    t0=$(date +%s)
    cargo test --release --features ros --lib ros::
    echo "unit tests: $(( $(date +%s) - t0 )) s"
fi

export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( 10 + $$ % 90 ))}"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
echo "ROS_DOMAIN_ID=$ROS_DOMAIN_ID RMW_IMPLEMENTATION=$RMW_IMPLEMENTATION"

pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_for_line() { # wait_for_line FILE PATTERN PID TIMEOUT_S
    local deadline=$(( $(date +%s) + $4 ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        grep -q "$2" "$1" 2>/dev/null && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

stop_node() { # stop_node PID TIMEOUT_S -> exit status of the node (124 if it had to be killed)
    kill -INT "$1" 2>/dev/null || true
    local deadline=$(( $(date +%s) + $2 ))
    while kill -0 "$1" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
    if kill -0 "$1" 2>/dev/null; then kill -KILL "$1"; wait "$1" 2>/dev/null; return 124; fi
    local rc=0
    wait "$1" || rc=$?
    return "$rc"
}

# 1. The node under test, against the peer: first with the default sensor-data QoS (best effort,
#    small cloud), then reliable and slowed down (relay_delay_ms) for the full run, so that a burst
#    must go through the latest-wins queue. Best effort over Fast DDS loses many >1 MB clouds here.
run_peer() { # run_peer LABEL NODE_ARGS... -- PEER_ARGS...
    local label=$1; shift
    local nargs=() pargs=()
    while [ "$1" != -- ]; do nargs+=("$1"); shift; done; shift
    pargs=("$@")
    local nodelog="$logdir/$NODE-$label.log"
    "$bindir/$NODE" --ros-args -r points:=/lk_test/points -r __node:=lk_test_node \
        -p malformed_log_period:=1.0 "${nargs[@]}" >"$nodelog" 2>&1 &
    local npid=$!
    pids+=("$npid")
    wait_for_line "$nodelog" "input '" "$npid" 30
    check $? "[$label] $NODE started"
    set +e
    python test/ros/peer.py --input /lk_test/points --output /lk_test_node/points --node-fqn /lk_test_node \
        "${pargs[@]}" | tee "$logdir/peer-$label.log"
    local prc=${PIPESTATUS[0]}
    set -e
    local p_pass p_fail
    p_pass=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$logdir/peer-$label.log" | tail -1)
    p_fail=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$logdir/peer-$label.log" | tail -1)
    passed=$((passed + ${p_pass:-0}))
    failed=$((failed + ${p_fail:-0}))
    [ "$prc" = 0 ] || [ "${p_fail:-0}" != 0 ] || { echo "FAIL [$label] peer exited $prc"; failed=$((failed + 1)); }
    kill -0 "$npid" 2>/dev/null
    check $? "[$label] $NODE survived the peer"
    if [ "$label" = full ]; then
        local n_warn
        n_warn=$(grep -c "malformed PointCloud2" "$nodelog" || true)
        [ "$n_warn" -ge 1 ] && [ "$n_warn" -le 4 ]
        check $? "[$label] malformed clouds logged, rate-limited ($n_warn log lines for 4 clouds)"
    fi
    local rc
    set +e; stop_node "$npid" 10; rc=$?; set -e
    check "$rc" "[$label] $NODE stopped cleanly on SIGINT (exit $rc)"
    grep -q "stopped:" "$nodelog"
    check $? "[$label] final counts logged: $(grep -o 'stopped:.*' "$nodelog" | head -1)"
}
run_peer default -- --quick --expect-qos "best effort, keep last 1"
big=(); [ "${BIG:-0}" = 1 ] && big=(--big)
run_peer full -p reliable:=true -p relay_delay_ms:=30 -- --expect-qos "reliable" --expect-drops "${big[@]}"

# 2. Every executable starts, and stops on SIGINT with status 0.
for b in "${BINS[@]}"; do
    log="$logdir/start-$b.log"
    "$bindir/$b" --ros-args -r __node:="lk_start_$b" >"$log" 2>&1 &
    p=$!
    pids+=("$p")
    wait_for_line "$log" "input '" "$p" 30
    started=$?
    set +e; stop_node "$p" 10; rc=$?; set -e
    [ "$started" = 0 ] && [ "$rc" = 0 ]
    check $? "$b starts and stops cleanly (exit $rc)"
done

# 3. A bad parameter at start is refused with a clear message (non-zero exit).
log="$logdir/badparam.log"
set +e
timeout 30 "$bindir/$NODE" --ros-args -r __node:=lk_bad -p queue_size:=0 >"$log" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "outside" "$log"
check $? "out-of-range parameter at start refused (exit $rc: $(grep -o 'outside.*' "$log" | head -1))"

echo "ros tests: $passed passed, $failed failed"
[ "$failed" = 0 ]
