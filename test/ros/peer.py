#!/usr/bin/env python3
"""rclpy peer for the lidar_kernels node tests (run by test/ros/run.sh in the ros-env venv).

Modes:
  outputs   The nodes given with --node KIND=FQN (pipeline, voxelizer, sampler, neighbors, detector) all
            subscribe to --input. The peer publishes every scan of the sample bag twice, first the
            bag's own CDR bytes (the Ouster driver's 48-byte point), then converted to packed xyzi,
            and checks every output of every node against the `lidar-kernels replay` output bag of
            the same scans and configuration (--expected): same header, counts, coordinates,
            indices (the ouster round byte-identical). Then, against the first node: malformed
            clouds counted by kind in /diagnostics and the node goes on; a burst through the
            latest-wins queue; parameter services (describe, set with range / read-only, a set that
            changes the output).
  nms       Box records to the nms node; kept boxes and the MarkerArray checked.
  diag      Waits for /diagnostics from every --node and checks --expect KEY=VALUE-PREFIX there.
  latency   One scan (--scan), sent --repeat times, one at a time; prints the end-to-end time seen
            here and the node's receive_to_publish / process times from /diagnostics as JSON.
  stream    The sample's scans at --rate Hz for --seconds (--publisher-qos reliable | best_effort):
            delivered / sent to the node, and every processed scan's outputs received here.
  qos       A best-effort publisher against the node's reliable input, a reliable subscriber of
            its best-effort output, a silent publisher: each a WARN in /diagnostics naming it.
  big       One --points random cloud; returns when the node has received it.

Never sleeps for discovery: waits until the publisher sees the subscriptions and outputs arrive.
Prints one line per check and ends with 'N passed, N failed'; exit status 1 on any failure.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy
from rclpy.serialization import serialize_message, deserialize_message
from sensor_msgs.msg import PointCloud2, PointField
from diagnostic_msgs.msg import DiagnosticArray
from visualization_msgs.msg import MarkerArray, Marker
from rcl_interfaces.msg import Parameter, ParameterValue, ParameterType
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters

F32, U16, U32, I32 = PointField.FLOAT32, PointField.UINT16, PointField.UINT32, PointField.INT32
NP = {PointField.INT8: 'i1', PointField.UINT8: 'u1', PointField.INT16: 'i2', PointField.UINT16: 'u2',
      PointField.INT32: 'i4', PointField.UINT32: 'u4', PointField.FLOAT32: 'f4', PointField.FLOAT64: 'f8'}
TOPICS = {'pipeline': ['voxels', 'voxel_features', 'downsampled', 'samples', 'neighborhoods'],
          'voxelizer': ['voxels', 'voxel_features', 'downsampled'],
          'sampler': ['samples'], 'neighbors': ['neighborhoods'], 'nms': ['boxes'],
          'detector': ['detections', 'clusters']}
XYZI_OFFSET_NS = 1000 * 1_000_000_000  # stamps of the xyzi round: the bag's + 1000 s


def field(name, offset, dt):
    return PointField(name=name, offset=offset, datatype=dt, count=1)


def stamp_ns(msg):
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


def set_stamp(msg, ns):
    msg.header.stamp.sec = int(ns // 1_000_000_000)
    msg.header.stamp.nanosec = int(ns % 1_000_000_000)


def values(msg, name):
    f = {f.name: f for f in msg.fields}[name]
    dt = np.dtype({'names': [name], 'formats': ['<' + NP[f.datatype]], 'offsets': [f.offset], 'itemsize': msg.point_step})
    return np.frombuffer(bytes(msg.data), dtype=dt, count=msg.width * msg.height)[name]


def to_xyzi(msg):
    """The same points as packed float32 x y z intensity (16 bytes), stamp shifted."""
    n = msg.width * msg.height
    dt = np.dtype({'names': ['x', 'y', 'z', 'intensity'], 'formats': ['<f4'] * 4, 'offsets': [0, 4, 8, 12], 'itemsize': 16})
    a = np.zeros(n, dtype=dt)
    for k in ('x', 'y', 'z', 'intensity'):
        a[k] = values(msg, k)
    out = PointCloud2()
    out.header.frame_id = msg.header.frame_id
    set_stamp(out, stamp_ns(msg) + XYZI_OFFSET_NS)
    out.height, out.width = 1, n
    out.fields = [field('x', 0, F32), field('y', 4, F32), field('z', 8, F32), field('intensity', 12, F32)]
    out.is_bigendian = False
    out.point_step, out.row_step = 16, 16 * n
    out.data = a.tobytes()
    out.is_dense = msg.is_dense
    return out


def small_cloud(n, ns, frame_id='lk_small'):
    rng = np.random.default_rng(n)
    pts = rng.uniform(-20, 20, size=(n, 4)).astype('<f4')
    msg = PointCloud2()
    msg.header.frame_id = frame_id
    set_stamp(msg, ns)
    msg.height, msg.width = 1, n
    msg.fields = [field('x', 0, F32), field('y', 4, F32), field('z', 8, F32), field('intensity', 12, F32)]
    msg.is_bigendian = False
    msg.point_step, msg.row_step = 16, 16 * n
    msg.data = pts.tobytes()
    msg.is_dense = True
    return msg


def read_bag(path):
    """{topic: [(stamp_ns, raw CDR)]} of the PointCloud2 topics of a rosbag2 folder (rosbags)."""
    from rosbags.rosbag2 import Reader
    out = {}
    with Reader(path) as r:
        clouds = [c for c in r.connections if c.msgtype == 'sensor_msgs/msg/PointCloud2']
        for conn, _t, raw in r.messages(connections=clouds):
            m = deserialize_message(bytes(raw), PointCloud2)
            out.setdefault(conn.topic, []).append((stamp_ns(m), bytes(raw)))
    return out


def compare(got, exp, same_layout):
    """None when equal, else the first difference."""
    if got.header.frame_id != exp.header.frame_id:
        return f'frame_id {got.header.frame_id!r} != {exp.header.frame_id!r}'
    if (got.height, got.width) != (exp.height, exp.width):
        return f'shape {got.height}x{got.width} != {exp.height}x{exp.width}'
    gnames, enames = [f.name for f in got.fields], [f.name for f in exp.fields]
    if same_layout:
        if gnames != enames or got.point_step != exp.point_step:
            return f'fields {gnames} != {enames}'
        if bytes(got.data) != bytes(exp.data):
            return 'data bytes differ'
        return None
    for name in [n for n in enames if n in gnames]:
        g, e = values(got, name), values(exp, name)
        if g.dtype.kind == 'f':
            same = np.array_equal(g.astype('f8'), e.astype('f8'), equal_nan=True)
        else:
            same = np.array_equal(g.astype('i8'), e.astype('i8'))
        if not same:
            return f'field {name} differs'
    if not {'x', 'y', 'z'} <= set(gnames):
        return f'no x/y/z in {gnames}'
    return None


class Peer(Node):
    def __init__(self, args):
        super().__init__('lk_test_peer')
        self.args = args
        self.passed = 0
        self.failed = 0
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        self.qos = qos
        in_qos = qos
        if getattr(args, 'publisher_qos', 'reliable') == 'best_effort':
            in_qos = QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST)
        self.pub = self.create_publisher(PointCloud2, args.input, in_qos) if args.input and args.mode != 'qos' else None
        self.nodes = []  # (kind, fqn)
        for spec in args.node:
            kind, fqn = spec.split('=', 1)
            self.nodes.append((kind, fqn))
        self.outputs = {}  # (fqn, topic) -> {stamp: (msg, t_received)}
        self.markers = {}  # fqn -> {stamp: MarkerArray}
        if args.mode in ('outputs', 'nms', 'latency', 'stream'):
            for kind, fqn in self.nodes:
                for t in (args.topics or TOPICS[kind]):
                    key = (fqn, t)
                    self.outputs[key] = {}
                    self.create_subscription(PointCloud2, f'{fqn}/{t}', self._store(key), qos)
                if kind == 'nms':
                    self.markers[fqn] = {}
                    self.create_subscription(MarkerArray, f'{fqn}/markers',
                                             lambda m, f=fqn: self.markers[f].__setitem__(stamp_ns(m.markers[-1]) if m.markers else 0, m), qos)
        self.diags = {}  # fqn -> [(level, message, {k: v})]
        self.create_subscription(DiagnosticArray, '/diagnostics', self.on_diag, 50)

    def _store(self, key):
        def cb(msg):
            self.outputs[key][stamp_ns(msg)] = (msg, time.monotonic())
        return cb

    def on_diag(self, msg):
        for s in msg.status:
            fqn = s.name.split(':', 1)[0]
            self.diags.setdefault(fqn, []).append((s.level, s.message, {kv.key: kv.value for kv in s.values}))

    def check(self, ok, what):
        print(('PASS ' if ok else 'FAIL ') + what, flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def spin_until(self, cond, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            rclpy.spin_once(self, timeout_sec=0.02)
        return cond()

    def latest_diag(self, fqn):
        d = self.diags.get(fqn)
        return d[-1][2] if d else {}

    def wait_diag(self, fqn, cond, timeout=10.0):
        start = len(self.diags.get(fqn, []))
        return self.spin_until(lambda: any(cond(d[2]) for d in self.diags.get(fqn, [])[start:]), timeout)

    def have_all(self, ns, keys):
        return all(ns in self.outputs[k] for k in keys)

    def send_and_wait(self, msg, keys, timeout=60.0, resend=20.0):
        """Publishes msg (object or raw CDR bytes) until every output key has its stamp."""
        ns = stamp_ns(msg if not isinstance(msg, bytes) else deserialize_message(msg, PointCloud2))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            self.pub.publish(msg)
            if self.spin_until(lambda: self.have_all(ns, keys), min(resend, deadline - time.monotonic())):
                return ns, t0
        return ns, None

    def call(self, srv_type, name, req, timeout=10.0):
        cli = self.create_client(srv_type, name)
        if not cli.wait_for_service(timeout_sec=timeout):
            return None
        fut = cli.call_async(req)
        self.spin_until(fut.done, timeout)
        return fut.result() if fut.done() else None

    def set_param(self, fqn, name, value):
        r = self.call(SetParameters, f'{fqn}/set_parameters', SetParameters.Request(parameters=[Parameter(name=name, value=value)]))
        return r.results[0] if r else None

    def wait_matched(self, count):
        t0 = time.monotonic()
        ok = self.spin_until(lambda: self.pub.get_subscription_count() >= count, 30.0)
        self.check(ok, f'input publisher matched {self.pub.get_subscription_count()}/{count} node subscriptions '
                       f'({time.monotonic() - t0:.2f} s)')
        return ok


def int_value(v):
    return ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=v)


def run_outputs(peer, args):
    if not peer.wait_matched(len(peer.nodes)):
        return
    scans = read_bag(args.bag)
    (in_topic, frames), = [(t, v) for t, v in scans.items()]
    expected = {t.rsplit('/', 1)[-1]: {ns: deserialize_message(raw, PointCloud2) for ns, raw in v}
                for t, v in read_bag(args.expected).items()}
    print(f'{len(frames)} scans from {args.bag} ({in_topic}); expected topics {sorted(expected)}', flush=True)
    keys = list(peer.outputs)

    # 1. Every scan, both layouts, every node's outputs vs replay.
    for layout in ('ouster', 'xyzi'):
        for ns0, raw in frames:
            src = deserialize_message(raw, PointCloud2)
            msg = raw if layout == 'ouster' else to_xyzi(src)
            ns, t0 = peer.send_and_wait(msg, keys)
            what = f'{layout} scan {ns0} ({src.width * src.height} points)'
            if not peer.check(t0 is not None, f'{what}: every output of {len(peer.nodes)} nodes received'):
                continue
            for (fqn, topic) in keys:
                got = peer.outputs[(fqn, topic)][ns][0]
                exp = expected[topic].get(ns0)
                if exp is None:
                    peer.check(False, f'{what}: {fqn}/{topic}: no replay output at this stamp')
                    continue
                same_layout = layout == 'ouster' or topic in ('voxels', 'voxel_features', 'neighborhoods')
                diff = compare(got, exp, same_layout)
                stamp_ok = stamp_ns(got) == ns
                peer.check(diff is None and stamp_ok,
                           f'{what}: {fqn}/{topic} {got.height}x{got.width} == replay'
                           f"{' (bytes)' if same_layout else ' (fields ' + ','.join(f.name for f in got.fields) + ')'}"
                           + ('' if diff is None else f': {diff}') + ('' if stamp_ok else ': stamp changed'))

    fqn = peer.nodes[0][1]
    # 2. Malformed clouds: counted by kind in /diagnostics, node survives.
    base = 1_800_000_000_000_000_000
    good = small_cloud(1000, base)
    truncated = small_cloud(1000, base + 1)
    truncated.data = bytes(truncated.data)[:-16 * 10]
    short_step = small_cloud(1000, base + 2)
    short_step.point_step = 8  # z (offset 8) and intensity end past point_step
    short_step.row_step = 8 * 1000
    short_step.data = bytes(short_step.data)[:8000]
    no_x = small_cloud(1000, base + 3)
    no_x.fields = [f for f in no_x.fields if f.name != 'x']
    raw = serialize_message(good)[:200]  # CDR cut inside the point blob
    peer.spin_until(lambda: bool(peer.latest_diag(fqn)), 5.0)
    before = peer.latest_diag(fqn)
    peer.check(bool(before), f'/diagnostics received from {fqn}')
    m0 = int(before.get('malformed', '0'))
    for m in (truncated, short_step, no_x, raw):
        peer.pub.publish(m)
        peer.spin_until(lambda: False, 0.05)  # keep the latest-wins queue from merging them
    kinds = ['malformed.data_too_short', 'malformed.field_past_point_step', 'malformed.missing_field', 'malformed.cdr']
    got = peer.wait_diag(fqn, lambda d: int(d.get('malformed', '0')) >= m0 + 4 and all(k in d for k in kinds), 15.0)
    d = peer.latest_diag(fqn)
    peer.check(got, 'malformed clouds counted: ' + ', '.join(f'{k}={d.get(k)}' for k in ['malformed'] + kinds))
    peer.check(any(lvl in (1, b'\x01') for lvl, _, _ in peer.diags.get(fqn, [])), 'diagnostics level WARN after malformed clouds')
    ns, t0 = peer.send_and_wait(good, [(fqn, 'samples')], timeout=30.0)
    peer.check(t0 is not None, 'node still processes good clouds after malformed ones')

    # 3. Burst: the latest-wins queue drops (and counts) rather than blocking; books balance.
    burst = []
    for k in range(12):
        m = to_xyzi(deserialize_message(frames[k % len(frames)][1], PointCloud2))
        set_stamp(m, base + 1_000_000_000 + k)
        burst.append(m)
    for m in burst:
        peer.pub.publish(m)
    last = stamp_ns(burst[-1])
    peer.spin_until(lambda: last in peer.outputs[(fqn, 'samples')], 60.0)

    def balanced(d):
        return (d.get('queue_waiting') == '0' and int(d['received']) ==
                int(d['processed']) + int(d['malformed']) + int(d['dropped_queue_full']))
    ok_books = peer.wait_diag(fqn, balanced, 15.0)
    d = peer.latest_diag(fqn)
    peer.check(ok_books, f"books balance after a burst: received {d.get('received')} = processed {d.get('processed')}"
               f" + malformed {d.get('malformed')} + dropped {d.get('dropped_queue_full')}")
    peer.check(last in peer.outputs[(fqn, 'samples')], 'newest cloud of the burst processed (latest wins)')
    peer.check(int(d.get('dropped_queue_full', '0')) > 0, f"burst of 12 scans: {d.get('dropped_queue_full')} waiting clouds dropped")
    peer.check('pipeline.fps_p50_ms' in d and 'receive_to_publish_p50_ms' in d,
               f"stage timings in diagnostics: fps p50 {d.get('pipeline.fps_p50_ms')} ms, receive->publish p50 "
               f"{d.get('receive_to_publish_p50_ms')} ms, backend {d.get('backend')!r}")

    # 4. Parameters: described with range, range / read-only enforced, a change applied.
    r = peer.call(DescribeParameters, f'{fqn}/describe_parameters',
                  DescribeParameters.Request(names=['fps.num_samples', 'backend', 'voxelize.voxel_size']))
    desc = [x.description for x in r.descriptors] if r else []
    types = [x.type for x in r.descriptors] if r else []
    peer.check(len(desc) == 3 and 'Range [1, 2147483647]' in desc[0] and 'Read-only' in desc[1]
               and types[2] == ParameterType.PARAMETER_DOUBLE_ARRAY, f'describe_parameters: {desc}')
    r = peer.call(GetParameters, f'{fqn}/get_parameters', GetParameters.Request(names=['voxelize.voxel_size', 'config_file']))
    peer.check(r is not None and list(r.values[0].double_array_value) == [0.16, 0.16, 10.0],
               f"get voxelize.voxel_size = {list(r.values[0].double_array_value) if r else None} (config_file {r.values[1].string_value if r else None!r})")
    r = peer.set_param(fqn, 'fps.num_samples', int_value(0))
    peer.check(r is not None and not r.successful, f'set fps.num_samples:=0 rejected ({r.reason if r else None})')
    r = peer.set_param(fqn, 'backend', ParameterValue(type=ParameterType.PARAMETER_STRING, string_value='cpu'))
    peer.check(r is not None and not r.successful, f'set backend at run time rejected ({r.reason if r else None})')
    # Values the pipeline would refuse are refused by set_parameters, with the reason, and the old
    # value stays what get_parameters returns (and what runs).
    dbl = lambda v: ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=v)
    dbls = lambda v: ParameterValue(type=ParameterType.PARAMETER_DOUBLE_ARRAY, double_array_value=v)
    text = lambda v: ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=v)
    flag = lambda v: ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=v)
    for name, value, why in [
            ('voxelize.voxel_size', dbls([0.2, 0.2]), 'needs 3 values'),
            ('neighbors.ball_query.min_radius', dbl(5.0), 'min_radius'),
            ('neighbors.mode', text('radius'), 'not one of'),
            ('voxelize.point_cloud_range', dbls([10.0, -51.2, -5.0, -10.0, 51.2, 5.0]), 'point_cloud_range'),
            ('fps.enabled', flag(False), 'fps.enabled')]:
        before = peer.call(GetParameters, f'{fqn}/get_parameters', GetParameters.Request(names=[name]))
        r = peer.set_param(fqn, name, value)
        after = peer.call(GetParameters, f'{fqn}/get_parameters', GetParameters.Request(names=[name]))
        kept = before is not None and after is not None and before.values[0] == after.values[0]
        peer.check(r is not None and not r.successful and why in r.reason and kept,
                   f'set {name} refused with a reason, old value kept: {r.reason if r else None!r}')
    r = peer.call(DescribeParameters, f'{fqn}/describe_parameters',
                  DescribeParameters.Request(names=['backend', 'reliable', 'fps.num_samples', 'neighbors.ball_query.radius']))
    ds = r.descriptors if r else []
    peer.check(len(ds) == 4 and ds[0].read_only and ds[1].read_only and not ds[2].read_only
               and ds[2].integer_range and ds[2].integer_range[0].from_value == 1 and ds[3].floating_point_range,
               'describe_parameters: read_only for backend and reliable, integer / floating-point ranges: '
               + str([(d.name, d.read_only, [(x.from_value, x.to_value) for x in d.integer_range],
                       [(x.from_value, x.to_value) for x in d.floating_point_range]) for d in ds]))
    # A value that fails every cloud (it depends on the cloud): stage_errors at ERROR level, a message
    # that reads the right way round; then a valid change takes effect on the next cloud.
    r = peer.set_param(fqn, 'fps.start_index', int_value(5_000_000))
    peer.check(r is not None and r.successful, 'set fps.start_index:=5000000 accepted (it depends on the cloud)')
    e0 = int(peer.latest_diag(fqn).get('stage_errors', '0'))
    peer.pub.publish(small_cloud(5000, base + 2_000_000_000))
    got = peer.wait_diag(fqn, lambda d: int(d.get('stage_errors', '0')) > e0, 15.0)
    lvl = [lvl for lvl, _, d in peer.diags.get(fqn, []) if int(d.get('stage_errors', '0')) > e0]
    d = peer.latest_diag(fqn)
    peer.check(got and lvl and lvl[0] in (2, b'\x02') and 'must be less than the number of points' in d.get('last_stage_error', ''),
               f"failing cloud: stage_errors {d.get('stage_errors')}, level {lvl[0] if lvl else None}, {d.get('last_stage_error')!r}")
    r = peer.set_param(fqn, 'fps.start_index', int_value(0))
    peer.check(r is not None and r.successful, 'set fps.start_index:=0 accepted')
    r = peer.set_param(fqn, 'fps.num_samples', int_value(123))
    peer.check(r is not None and r.successful, 'set fps.num_samples:=123 accepted')
    msg = small_cloud(5000, base + 3_000_000_000)
    ns, t0 = peer.send_and_wait(msg, [(fqn, 'samples')], timeout=30.0)
    out = peer.outputs[(fqn, 'samples')].get(ns, (None,))[0]
    peer.check(out is not None and out.width * out.height == 123, f'fps.num_samples change applied: {out.width if out else None} samples')


def run_nms(peer, args):
    if not peer.wait_matched(1):
        return
    fqn = peer.nodes[0][1]
    # Pairs of identical boxes (IoU 1: the lower score is suppressed) far apart from each other.
    rng = np.random.default_rng(7)
    n_pairs = 40
    boxes = []
    for k in range(n_pairs):
        x, y = (k % 8) * 20.0, (k // 8) * 20.0
        l, w, h = rng.uniform(1, 5), rng.uniform(1, 3), rng.uniform(1, 2)
        yaw = rng.uniform(-math.pi, math.pi)
        s = rng.uniform(0.5, 1.0)
        boxes.append((x, y, 0.5, l, w, h, yaw, s, k % 3))
        boxes.append((x, y, 0.5, l, w, h, yaw, s * 0.5, k % 3))
    order = rng.permutation(len(boxes))
    arr = np.array([boxes[i] for i in order], dtype='f8')
    names = ['x', 'y', 'z', 'length', 'width', 'height', 'yaw', 'score', 'label']
    dt = np.dtype({'names': names, 'formats': ['<f4'] * 8 + ['<i4'], 'offsets': [4 * i for i in range(9)], 'itemsize': 36})
    a = np.zeros(len(arr), dtype=dt)
    for i, n in enumerate(names):
        a[n] = arr[:, i]
    msg = PointCloud2()
    msg.header.frame_id = 'lk_boxes_frame'
    set_stamp(msg, 1_700_000_123_000_000_007)
    msg.height, msg.width = 1, len(a)
    msg.fields = [field(n, 4 * i, F32) for i, n in enumerate(names[:8])] + [field('label', 32, I32)]
    msg.point_step, msg.row_step = 36, 36 * len(a)
    msg.data = a.tobytes()
    msg.is_dense = True
    ns, t0 = peer.send_and_wait(msg, [(fqn, 'boxes')], timeout=30.0, resend=3.0)
    if not peer.check(t0 is not None, f'kept boxes received for {len(a)} box records'):
        return
    out = peer.outputs[(fqn, 'boxes')][ns][0]
    peer.check(out.header.frame_id == 'lk_boxes_frame' and stamp_ns(out) == ns, 'boxes: header kept')
    want = sorted([b for i, b in enumerate(boxes) if i % 2 == 0], key=lambda b: -b[7])
    got = np.stack([values(out, n).astype('f8') for n in names], axis=1) if out.width else np.zeros((0, 9))
    exp = np.array(want, dtype='f4').astype('f8')
    peer.check(got.shape == exp.shape and np.array_equal(got, exp),
               f'boxes: {got.shape[0]} kept == the {exp.shape[0]} higher-score boxes of each pair, in score order')
    peer.spin_until(lambda: len(peer.markers[fqn]) > 0, 10.0)
    ma = next(iter(peer.markers[fqn].values()), None)
    if not peer.check(ma is not None, 'MarkerArray received (deserialized by rclpy)'):
        return
    ms = ma.markers
    ok = len(ms) == len(want) + 1 and ms[0].action == Marker.DELETEALL
    peer.check(ok, f'markers: DELETEALL + {len(ms) - 1} CUBE markers for {len(want)} kept boxes')
    bad = []
    for i, (m, b) in enumerate(zip(ms[1:], exp)):
        yaw = b[6]
        q = (0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2))
        checks = [m.type == Marker.CUBE, m.action == Marker.ADD, m.id == i, m.ns == ms[0].ns, m.header.frame_id == 'lk_boxes_frame',
                  stamp_ns(m) == ns, np.allclose([m.pose.position.x, m.pose.position.y, m.pose.position.z], b[:3]),
                  np.allclose([m.scale.x, m.scale.y, m.scale.z], b[3:6]),
                  np.allclose([m.pose.orientation.x, m.pose.orientation.y, m.pose.orientation.z, m.pose.orientation.w], q, atol=1e-6),
                  0 < m.color.a <= 1]
        if not all(checks):
            bad.append(i)
    peer.check(ok and not bad, f'markers: pose (quaternion from yaw), scale, id, ns {ms[0].ns!r}, header match the kept boxes'
               + (f' (bad: {bad[:5]})' if bad else ''))


def run_diag(peer, args):
    want = dict(e.split('=', 1) for e in args.expect)

    def good(fqn):
        return any(all(d[2].get(k, '').startswith(v) for k, v in want.items()) for d in peer.diags.get(fqn, []))
    t0 = time.monotonic()
    peer.spin_until(lambda: all(good(fqn) for _, fqn in peer.nodes), args.timeout)
    print(f'{args.label}: waited {time.monotonic() - t0:.2f} s for {len(peer.nodes)} nodes', flush=True)
    for kind, fqn in peer.nodes:
        ok = good(fqn)
        d = peer.latest_diag(fqn)
        peer.check(ok, f"{args.label}: {fqn} publishes /diagnostics with " + ', '.join(f'{k}={d.get(k)!r}' for k in want))


def run_latency(peer, args):
    if not peer.wait_matched(1):
        return
    kind, fqn = peer.nodes[0]
    keys = [(fqn, t) for t in TOPICS[kind]]
    frames = read_bag(args.bag)
    (_, scans), = frames.items()
    src = deserialize_message(scans[args.scan][1], PointCloud2)
    e2e = []
    for k in range(args.warmup + args.repeat):
        m = to_xyzi(src) if args.layout == 'xyzi' else deserialize_message(scans[args.scan][1], PointCloud2)
        set_stamp(m, 1_900_000_000_000_000_000 + k)
        ns, t0 = peer.send_and_wait(m, keys, timeout=60.0, resend=60.0)
        if t0 is None:
            peer.check(False, f'latency: no output for repeat {k}')
            return
        if k >= args.warmup:
            e2e.append((max(peer.outputs[key][ns][1] for key in keys) - t0) * 1e3)
    peer.spin_until(lambda: False, 1.2)  # one more diagnostics period
    d = peer.latest_diag(fqn)
    res = {'node': kind, 'points': src.width * src.height, 'layout': args.layout, 'repeat': args.repeat,
           'e2e_p50_ms': float(np.percentile(e2e, 50)), 'e2e_min_ms': float(min(e2e)), 'e2e_max_ms': float(max(e2e)),
           'node_receive_to_publish_p50_ms': float(d.get('receive_to_publish_p50_ms', 'nan')),
           'node_process_ms_mean': float(d.get('process_ms_mean', 'nan')),
           'stages_p50_ms': {k[len('pipeline.'):-len('_p50_ms')]: float(v) for k, v in d.items()
                             if k.startswith('pipeline.') and k.endswith('_p50_ms')},
           'backend': d.get('backend')}
    print('LATENCY ' + json.dumps(res), flush=True)
    peer.check(len(e2e) == args.repeat, f"latency {kind}: e2e p50 {res['e2e_p50_ms']:.1f} ms, node receive->publish p50 "
               f"{res['node_receive_to_publish_p50_ms']:.1f} ms")


def run_stream(peer, args):
    """Scans at --rate Hz for --seconds into the node, then: delivered / sent to the node (its
    /diagnostics `received`), and every processed scan's outputs at this keep-up subscriber."""
    kind, fqn = peer.nodes[0]
    if not peer.wait_matched(1):
        return
    (_, scans), = read_bag(args.bag).items()
    raws = [bytearray(raw) for _, raw in scans]
    keys = [(fqn, t) for t in (args.topics or TOPICS[kind])]
    peer.spin_until(lambda: bool(peer.latest_diag(fqn)), 10.0)
    d0 = peer.latest_diag(fqn)
    r0, p0, l0 = (int(d0.get(k, '0')) for k in ('received', 'processed', 'input_lost'))
    n = int(args.rate * args.seconds)
    period = 1.0 / args.rate
    base = 1_950_000_000_000_000_000
    sent_stamps = []
    t_start = time.monotonic()
    for k in range(n):
        raw = raws[k % len(raws)]
        ns = base + int(k * period * 1e9)
        raw[4:8] = int(ns // 1_000_000_000).to_bytes(4, 'little', signed=True)
        raw[8:12] = int(ns % 1_000_000_000).to_bytes(4, 'little')
        peer.pub.publish(bytes(raw))
        sent_stamps.append(ns)
        peer.spin_until(lambda: time.monotonic() >= t_start + (k + 1) * period, period + 1.0)
    wall = time.monotonic() - t_start
    # Stragglers (resends), then one more diagnostics period.
    peer.spin_until(lambda: False, 3.0)
    d = peer.latest_diag(fqn)
    received, processed, lost = (int(d.get(k, '0')) - v for k, v in (('received', r0), ('processed', p0), ('input_lost', l0)))
    got = {t: sum(1 for s in sent_stamps if s in peer.outputs[(fqn, t)]) for _, t in keys}
    res = {'node': kind, 'qos': args.publisher_qos, 'sent': n, 'seconds': round(wall, 2), 'received': received,
           'processed': processed, 'dropped_queue_full': int(d.get('dropped_queue_full', '0')),
           'input_lost_from_stamps': lost, 'outputs': got, 'node_level': d.get('input_qos')}
    print('STREAM ' + json.dumps(res), flush=True)
    peer.check(received >= args.min_delivered * n,
               f'{args.publisher_qos} publisher, {n} scans at {args.rate} Hz: {received}/{n} delivered to the node '
               f'({100.0 * received / n:.1f} %, need {100 * args.min_delivered:.0f} %)')
    peer.check(lost <= n - received, f'lost estimated from stamps {lost} <= not delivered {n - received}')
    for t, c in got.items():
        peer.check(c == processed, f'{fqn}/{t}: {c} of {processed} processed scans delivered to a keep-up subscriber')


def run_qos(peer, args):
    """A best-effort publisher against the node's reliable input, then a reliable subscriber of its
    best-effort output: each a WARN naming the mismatch in /diagnostics within 5 s; then the silent
    input (a publisher, no cloud): a WARN naming the publisher."""
    kind, fqn = peer.nodes[0]
    be = QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST)
    start = len(peer.diags.get(fqn, []))

    def warned(pattern, since):
        return next((m for lvl, m, _ in peer.diags.get(fqn, [])[since:] if lvl in (1, 2, b'\x01', b'\x02') and pattern in m), None)

    pub = peer.create_publisher(PointCloud2, args.input, be)
    for what, pattern, make in [
            ('best-effort publisher vs the reliable input', 'QoS mismatch on input', None),
            ('reliable subscriber vs the best-effort output', 'QoS mismatch on output',
             lambda: peer.create_subscription(PointCloud2, f'{fqn}/{TOPICS[kind][0]}', lambda m: None, peer.qos))]:
        since = len(peer.diags.get(fqn, []))
        t0 = time.monotonic()
        if make:
            make()
        ok = peer.spin_until(lambda: warned(pattern, since) is not None, 10.0)
        dt = time.monotonic() - t0
        msg = warned(pattern, since) or ''
        i = msg.find(pattern)
        peer.check(ok and dt <= 5.0, f'{what}: WARN after {dt:.1f} s: {msg[i:i + 200]!r}')
    ok = peer.spin_until(lambda: warned('no cloud on', start) is not None, 15.0)
    msg = warned('no cloud on', start) or ''
    i = msg.find('no cloud on')
    peer.check(ok and 'publisher' in msg, f'silent input with a publisher reported: {msg[i:i + 200]!r}')
    peer.destroy_publisher(pub)


def run_big(peer, args):
    """One cloud of --points random points (packed xyzi, reliable), then waits until the node has
    received it (its /diagnostics): the caller then stops the node in the middle of the frame."""
    kind, fqn = peer.nodes[0]
    if not peer.wait_matched(1):
        return
    rng = np.random.default_rng(7)
    n = args.points
    m = PointCloud2()
    set_stamp(m, 1_960_000_000_000_000_000)
    m.header.frame_id = 'lk_big'
    m.height, m.width = 1, n
    m.fields = [field('x', 0, F32), field('y', 4, F32), field('z', 8, F32), field('intensity', 12, F32)]
    m.point_step, m.row_step, m.is_dense = 16, 16 * n, True
    m.data = rng.uniform(-50, 50, size=(n, 4)).astype('<f4').tobytes()
    peer.spin_until(lambda: bool(peer.latest_diag(fqn)), 10.0)
    r0 = int(peer.latest_diag(fqn).get('received', '0'))
    peer.pub.publish(m)
    ok = peer.wait_diag(fqn, lambda d: int(d.get('received', '0')) > r0, 30.0)
    peer.check(ok, f'{n}-point cloud ({16 * n / 1e6:.0f} MB) received by {fqn}')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('mode', choices=['outputs', 'nms', 'diag', 'latency', 'stream', 'qos', 'big'])
    ap.add_argument('--input', default=None, help='topic the nodes subscribe to')
    ap.add_argument('--node', action='append', default=[], help='KIND=FQN, e.g. pipeline=/lk_pipeline (repeatable)')
    ap.add_argument('--bag', help='input bag (lidar-kernels sample)')
    ap.add_argument('--expected', help='lidar-kernels replay --out bag of --bag')
    ap.add_argument('--expect', action='append', default=[], help='diag mode: KEY=VALUE-PREFIX')
    ap.add_argument('--label', default='diag')
    ap.add_argument('--timeout', type=float, default=20.0)
    ap.add_argument('--scan', type=int, default=0)
    ap.add_argument('--layout', default='ouster', choices=['ouster', 'xyzi'])
    ap.add_argument('--repeat', type=int, default=20)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--rate', type=float, default=10.0, help='stream: scans per second')
    ap.add_argument('--seconds', type=float, default=30.0, help='stream: how long')
    ap.add_argument('--publisher-qos', default='reliable', choices=['reliable', 'best_effort'],
                    help='stream: QoS of the input publisher (best_effort: the sensor-data profile, depth 5)')
    ap.add_argument('--topics', nargs='*', default=None, help='stream: output topics to subscribe to (default: all of the node)')
    ap.add_argument('--points', type=int, default=1_700_000, help='big: points of the cloud')
    ap.add_argument('--min-delivered', type=float, default=1.0, help='stream: delivered / sent needed')
    args = ap.parse_args()

    rclpy.init()
    peer = Peer(args)
    try:
        {'outputs': run_outputs, 'nms': run_nms, 'diag': run_diag, 'latency': run_latency, 'stream': run_stream,
         'qos': run_qos, 'big': run_big}[args.mode](peer, args)
    finally:
        print(f'{peer.passed} passed, {peer.failed} failed', flush=True)
        ok = peer.failed == 0
        peer.destroy_node()
        rclpy.shutdown()
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
