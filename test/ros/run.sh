#!/usr/bin/env bash
# ROS 2 node tests over real DDS (Fast DDS from the Jazzy PyPI wheels, see scripts/ros-env.sh):
#  0. builds the `ros` feature (node executables + the lidar-kernels CLI), runs the ros unit tests;
#  1. launch files / params files checked against src/bin and the nodes' declared parameters
#     (test/ros/check_launch.py; `ros2 launch` is not installable here);
#  2. expected outputs: `lidar-kernels sample` bag -> `lidar-kernels replay --config
#     config/pipeline.yaml --backend cpu --out`;
#  3. pipeline + voxelizer + sampler + neighbors as processes (reliable QoS) against the rclpy peer
#     (test/ros/peer.py outputs): every output equal to the replay's for the Ouster 48-byte layout
#     and packed xyzi; malformed clouds counted; burst; parameter services; clean SIGINT;
#  4. nms: box records in, kept boxes + MarkerArray out (peer.py nms);
#  5. each config/*.param.yaml accepted at start (pipeline and nms publish /diagnostics, backend
#     auto -> cpu here); backend cuda refused with a clear message;
#  6. every executable starts and stops cleanly; bad parameters refused at start naming the key;
#  7. 10 Hz of 107k-point scans for 30 s, best effort (node defaults) and reliable: delivered / sent;
#  8. QoS mismatches (input and output) within 5 s and a silent input as WARNs in /diagnostics;
#  9. SIGINT in the middle of a 1.7 M-point frame: exit 0 within 1 s.
#
#   bash test/ros/run.sh           SKIP_UNIT=1 skips the cargo unit tests
#
# Unique ROS_DOMAIN_ID, ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST; waits for conditions, never for
# fixed discovery delays. Ends with 'ros tests: N passed, N failed'.
set -eo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

# shellcheck source=../../scripts/ros-env.sh
source scripts/ros-env.sh
set -u
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/ros}"
BINS=(voxelizer sampler neighbors nms pipeline detector)
bindir="$CARGO_TARGET_DIR/release"
logdir="$CARGO_TARGET_DIR/test-ros-logs"
work="$CARGO_TARGET_DIR/test-ros-work"
rm -rf "$logdir" "$work"
mkdir -p "$logdir" "$work"
T_START=$(date +%s)

passed=0
failed=0
section() { echo "==== $* ($(( $(date +%s) - T_START )) s)"; }
check() { # check RC "what"
    if [ "$1" = 0 ]; then echo "PASS $2"; passed=$((passed + 1)); else echo "FAIL $2"; failed=$((failed + 1)); fi
}
count_peer() { # count_peer LOG RC: adds the peer's 'N passed, N failed'
    local p f
    p=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$1" | tail -1)
    f=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$1" | tail -1)
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
    [ "$2" = 0 ] || [ "${f:-0}" != 0 ] || { echo "FAIL peer exited $2 ($1)"; failed=$((failed + 1)); }
}
run_peer() { # run_peer LOG SCRIPT ARGS...: a Python check, its output also in LOG, its counts added
    local log=$1; shift
    { "$PY" "$@"; echo $? >"$log.rc"; } | tee "$log"
    count_peer "$log" "$(cat "$log.rc")"
}

t0=$(date +%s)
cargo build --release --features ros $(printf -- '--bin %s ' "${BINS[@]}") --bin lidar-kernels
echo "build: $(( $(date +%s) - t0 )) s"

if [ "${SKIP_UNIT:-0}" != 1 ]; then
    t0=$(date +%s)
    cargo test --release --features ros --lib ros::
    echo "unit tests: $(( $(date +%s) - t0 )) s"
fi

# The peer reads bags with the `rosbags` package (same version as test/python).
# On the PyPI wheels it goes into their venv, with the venv's constraints (numpy stays as pinned).
PY="${PYTHON:-python3}"
constraints="${LIDAR_KERNELS_ROS_WHEELS:+$LIDAR_KERNELS_ROS_WHEELS/.lidar_kernels_constraints.txt}"
"$PY" -c 'import rosbags' 2>/dev/null ||
    "$PY" -m pip install -q --disable-pip-version-check rosbags==0.11.9 ${constraints:+-c "$constraints"}

export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( 10 + $$ % 90 ))}"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
echo "ROS_DOMAIN_ID=$ROS_DOMAIN_ID RMW_IMPLEMENTATION=${RMW_IMPLEMENTATION:-}"

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

start_node() { # start_node BIN NAME LOG ARGS... ; sets $started_pid
    local b=$1 name=$2 log=$3; shift 3
    "$bindir/$b" --ros-args -r __node:="$name" "$@" >"$log" 2>&1 &
    started_pid=$!
    pids+=("$started_pid")
}

# 1. Launch files and params files.
section "1. launch and params files"
run_peer "$logdir/check_launch.log" test/ros/check_launch.py --bindir "$bindir"

# 2. Expected outputs from the replay CLI (same scans, same configuration, CPU backend).
section "2. expected outputs (replay)"
"$bindir/lidar-kernels" sample "$work/sample" >/dev/null
bag="$work/sample/ouster_sample"
rc=0
# --render turns the detect stage on (the detector node's expected outputs) and draws every frame.
"$bindir/lidar-kernels" replay "$bag" --config config/pipeline.yaml --backend cpu --quiet --out "$work/expected" \
    --render "$work/render" >"$logdir/replay.log" 2>&1 || rc=$?
check "$rc" "replay of the sample bag (expected outputs): $(grep -o 'replayed.*' "$logdir/replay.log" | head -1)"
n_png=$(find "$work/render" -name 'frame_*.png' | wc -l)
check "$([ "$n_png" -eq 4 ] && echo 0 || echo 1)" "replay --render wrote one PNG per scan ($n_png)"

# 3. Four point-cloud nodes on one input topic, against the peer.
section "3. pipeline, voxelizer, sampler, neighbors, detector vs replay"
common=(-p reliable:=true -p qos_depth:=16 -p output_depth:=10 -p malformed_log_period:=1.0 -p config_file:=config/pipeline.yaml
        -r points:=/lk_test/points)
node_args=()
declare -A npid
for b in pipeline voxelizer sampler neighbors detector; do
    start_node "$b" "lk_$b" "$logdir/$b.log" "${common[@]}" -p backend:=cpu
    npid[$b]=$started_pid
    node_args+=(--node "$b=/lk_$b")
done
for b in pipeline voxelizer sampler neighbors detector; do
    wait_for_line "$logdir/$b.log" "input '" "${npid[$b]}" 30 && rc=0 || rc=$?
    check $rc "$b started ($(grep -o 'backend: .*' "$logdir/$b.log" | head -1))"
done
run_peer "$logdir/peer-outputs.log" test/ros/peer.py outputs --input /lk_test/points "${node_args[@]}" --bag "$bag" \
    --expected "$work/expected"
for b in pipeline voxelizer sampler neighbors detector; do
    kill -0 "${npid[$b]}" 2>/dev/null && rc=0 || rc=$?
    check $rc "$b survived the peer"
done
n_warn=$(grep -c "malformed PointCloud2" "$logdir/pipeline.log" || true)
ok=0
[ "$n_warn" -ge 1 ] && [ "$n_warn" -le 4 ] || ok=1
check "$ok" "malformed clouds logged, rate-limited ($n_warn log lines for 4 clouds)"
for b in pipeline voxelizer sampler neighbors detector; do
    set +e; stop_node "${npid[$b]}" 10; rc=$?; set -e
    check "$rc" "$b stopped cleanly on SIGINT (exit $rc): $(grep -o 'stopped:.*' "$logdir/$b.log" | head -1)"
done

# 4. NMS node.
section "4. nms"
start_node nms lk_nms "$logdir/nms.log" -p reliable:=true -p output_depth:=10 -p backend:=cpu -r boxes_in:=/lk_test/boxes
p=$started_pid
wait_for_line "$logdir/nms.log" "input '" "$p" 30 && rc=0 || rc=$?
check $rc "nms started"
run_peer "$logdir/peer-nms.log" test/ros/peer.py nms --input /lk_test/boxes --node nms=/lk_nms
stop_node "$p" 10 && src=0 || src=$?
check "$src" "nms stopped cleanly on SIGINT (exit $src)"

# 5. Params files: each accepted at start by pipeline and nms (backend auto falls back to cpu here).
section "5. params files"
diag_nodes=()
pf_pids=()
for f in config/*.param.yaml; do
    n=$(basename "$f" .param.yaml)
    for b in pipeline nms; do
        # Node names as shipped (the params files have per-node sections), one namespace per file.
        start_node "$b" "$b" "$logdir/pf-$b-$n.log" --params-file "$f" -r __ns:="/lk_pf_$n"
        pf_pids+=("$started_pid")
        diag_nodes+=(--node "$b=/lk_pf_$n/$b")
    done
done
run_peer "$logdir/peer-paramfiles.log" test/ros/peer.py diag "${diag_nodes[@]}" --expect backend=cpu \
    --label "params file" --timeout 30
for p in "${pf_pids[@]}"; do
    set +e; stop_node "$p" 10; rc=$?; set -e
    [ "$rc" = 0 ] || { echo "FAIL a params-file node (pid $p) did not stop cleanly (exit $rc)"; failed=$((failed + 1)); }
done
! grep -l "not declared" "$logdir"/pf-*.log && rc=0 || rc=$?
check $rc "no node warns 'not declared' with the shipped params files"
grep -l "auto: no usable CUDA" "$logdir"/pf-pipeline-*.log >/dev/null && rc=0 || rc=$?
check $rc "backend auto falls back to the CPU with a log line: $(grep -ho 'backend: cpu.*' "$logdir"/pf-pipeline-orin.log | head -1)"

expect_refused() { # expect_refused LABEL PATTERN BIN ARGS...
    local label=$1 pat=$2 b=$3; shift 3
    local log="$logdir/refused-$label.log" rc=0
    set +e
    timeout 30 "$bindir/$b" --ros-args -r __node:="lk_refused_$label" "$@" >"$log" 2>&1
    rc=$?
    set -e
    local ok=0
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q -- "$pat" "$log" || ok=1
    check "$ok" "$label refused at start (exit $rc): $(grep -o -- "error: .*" "$log" | head -1 | cut -c1-220)"
}
expect_refused backend_cuda "parameter 'backend' = 'cuda'" pipeline --params-file config/orin.param.yaml -p backend:=cuda

# 6. Every executable starts and stops; bad parameters are refused with the key named.
section "6. start/stop, bad parameters"
for b in "${BINS[@]}"; do
    log="$logdir/start-$b.log"
    start_node "$b" "lk_start_$b" "$log"
    p=$started_pid
    started=0
    wait_for_line "$log" "input '" "$p" 30 || started=1
    set +e; stop_node "$p" 10; rc=$?; set -e
    ok=0
    [ "$started" = 0 ] && [ "$rc" = 0 ] || ok=1
    check "$ok" "$b starts and stops cleanly (exit $rc)"
done
expect_refused queue_size "outside" voxelizer -p queue_size:=0
expect_refused max_voxels "voxelize.max_voxels" voxelizer -p voxelize.max_voxels:=0
expect_refused min_radius "parameter .neighbors.ball_query.min_radius. = 0.7" neighbors -p neighbors.ball_query.radius:=0.5 -p neighbors.ball_query.min_radius:=0.7
expect_refused voxel_size "voxelize.voxel_size" pipeline -p "voxelize.voxel_size:=[0.1, 0.1]"
expect_refused mode "voxelize.mode" pipeline -p voxelize.mode:=soft
expect_refused config_file "config_file" sampler -p config_file:=/nonexistent.yaml
expect_refused neighbors_without_fps "fps.enabled" pipeline -p fps.enabled:=false

# 7. 10 Hz of the sample's scans for 30 s into a pipeline that keeps up (voxelize + downsample on
#    the CPU), and into the detector: node defaults (best-effort input, the package's Fast DDS profile, loaded by the node
#    itself) against a best-effort publisher given the same profile (as README tells a driver), then
#    both reliable. Delivered / sent to the node and every processed scan's outputs at the peer.
section "7. streaming at 10 Hz"
stream() { # stream LABEL NODE "TOPICS" PUBLISHER_QOS MIN_DELIVERED NODE_ARGS...
    local label=$1 node=$2 topics=$3 pq=$4 min=$5; shift 5
    start_node "$node" "lk_stream_$label" "$logdir/stream-$label.log" -r points:="/lk_stream_$label/points" \
        -p backend:=cpu "$@"
    local p=$started_pid
    wait_for_line "$logdir/stream-$label.log" "input '" "$p" 30 || check 1 "node started ($logdir/stream-$label.log)"
    # shellcheck disable=SC2086
    FASTRTPS_DEFAULT_PROFILES_FILE="$root/config/fastdds_large_clouds.xml" run_peer "$logdir/peer-stream-$label.log" \
        test/ros/peer.py stream --input "/lk_stream_$label/points" --node "$node=/lk_stream_$label" --bag "$bag" \
        --rate 10 --seconds "${STREAM_SECONDS:-30}" --publisher-qos "$pq" --min-delivered "$min" --topics $topics
    local src=0
    stop_node "$p" 10 || src=$?
    check "$src" "stream $label: node stopped cleanly (exit $src)"
}
pipeline_stream=(-p fps.enabled:=false -p neighbors.enabled:=false)
stream defaults pipeline "voxels voxel_features downsampled" best_effort 0.99 "${pipeline_stream[@]}"
stream reliable pipeline "voxels voxel_features downsampled" reliable 1.0 -p reliable:=true "${pipeline_stream[@]}"
# The detector (~15 ms a scan on the CPU) keeps up too: every scan in, every scan's boxes out.
stream detector detector "detections clusters" reliable 1.0 -p reliable:=true

# 8. QoS mismatches, the input's and an output's (within 5 s), and a silent input, in /diagnostics.
section "8. QoS mismatch diagnostics"
start_node pipeline lk_qos "$logdir/qos.log" -r points:=/lk_qos/points -p backend:=cpu -p reliable:=true \
    -p output_reliable:=false -p input_timeout:=2.0 -p malformed_log_period:=1.0
p=$started_pid
wait_for_line "$logdir/qos.log" "input '" "$p" 30 || check 1 "node started ($logdir/qos.log)"
run_peer "$logdir/peer-qos.log" test/ros/peer.py qos --input /lk_qos/points --node pipeline=/lk_qos
stop_node "$p" 10 && src=0 || src=$?
grep -q "QoS mismatch on input" "$logdir/qos.log" && grep -q "QoS mismatch on output" "$logdir/qos.log" && rc=0 || rc=$?
check $rc "QoS mismatches in the node's log: $(grep -o 'QoS mismatch on output[^;]*' "$logdir/qos.log" | head -1 | cut -c1-200)"

# 9. SIGINT in the middle of a 1.7 M-point frame (the whole pipeline on the CPU, with 200000 FPS
# samples: seconds of FPS; with the default 4096 the pruned CPU FPS ends the frame within 0.3 s).
section "9. SIGINT during a long frame"
start_node pipeline lk_big "$logdir/big.log" -r points:=/lk_big/points -p backend:=cpu -p reliable:=true \
    -p fps.num_samples:=200000
p=$started_pid
wait_for_line "$logdir/big.log" "input '" "$p" 30 || check 1 "node started ($logdir/big.log)"
run_peer "$logdir/peer-big.log" test/ros/peer.py big --input /lk_big/points --node pipeline=/lk_big --points 1700000
sleep 0.3
t0=$(date +%s%N)
stop_node "$p" 10 && src=0 || src=$?
dt_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
ok=0
[ "$src" = 0 ] && [ "$dt_ms" -lt 1000 ] && grep -q "abandoned" "$logdir/big.log" && ! grep -qi "error" "$logdir/big.log" || ok=1
check "$ok" "SIGINT during the 1.7 M-point frame: exit $src after $dt_ms ms, no error: $(grep -o 'stopped:.*' "$logdir/big.log" | head -1)"

echo "ros tests: $passed passed, $failed failed ($(( $(date +%s) - T_START )) s)"
[ "$failed" = 0 ]
