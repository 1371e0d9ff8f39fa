#!/usr/bin/env python3
"""rclpy peer for the lidar_kernels node tests (run by test/ros/run.sh, in the ros-env venv).

Publishes PointCloud2 clouds built from data/ouster/*.bin (6 float32 LE per point: x y z
reflectivity ring t) in two layouts, the ouster-ros driver's 48-byte point and packed xyzi; listens
to the node's output and /diagnostics; sends malformed clouds and checks that they are counted and
that the node goes on; exercises the parameter services. Never sleeps for discovery: it waits until
the publisher sees the node's subscription, then until the first output arrives.

Prints one line per check and ends with 'N passed, N failed'; exit status 1 on any failure.
"""

import argparse
import os
import sys
import time

import numpy as np
import rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy
from rclpy.serialization import serialize_message
from sensor_msgs.msg import PointCloud2, PointField
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Parameter, ParameterValue, ParameterType
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters

F32, U16, U32 = PointField.FLOAT32, PointField.UINT16, PointField.UINT32
NP = {PointField.INT8: 'i1', PointField.UINT8: 'u1', PointField.INT16: 'i2', PointField.UINT16: 'u2',
      PointField.INT32: 'i4', PointField.UINT32: 'u4', PointField.FLOAT32: 'f4', PointField.FLOAT64: 'f8'}


def load_bin(path):
    v = np.fromfile(path, dtype='<f4')
    assert v.size % 6 == 0, path
    return v.reshape(-1, 6)  # x y z reflectivity ring t


def field(name, offset, dt):
    return PointField(name=name, offset=offset, datatype=dt, count=1)


def make_cloud(pts, layout, stamp_ns, frame_id='os_lidar'):
    """pts: (n, 6) array. layout: 'ouster' (48-byte ouster_ros::Point) or 'xyzi' (16-byte)."""
    n = pts.shape[0]
    if layout == 'ouster':
        dt = np.dtype({'names': ['x', 'y', 'z', 'intensity', 't', 'reflectivity', 'ring', 'ambient', 'range'],
                       'formats': ['<f4', '<f4', '<f4', '<f4', '<u4', '<u2', '<u2', '<u2', '<u4'],
                       'offsets': [0, 4, 8, 16, 20, 24, 26, 28, 32], 'itemsize': 48})
        fields = [field('x', 0, F32), field('y', 4, F32), field('z', 8, F32), field('intensity', 16, F32),
                  field('t', 20, U32), field('reflectivity', 24, U16), field('ring', 26, U16),
                  field('ambient', 28, U16), field('range', 32, U32)]
        a = np.zeros(n, dtype=dt)
        a['intensity'] = pts[:, 3]
        a['t'] = np.round(pts[:, 5] * 1e9).astype('<u4')
        a['reflectivity'] = pts[:, 3].astype('<u2')
        a['ring'] = pts[:, 4].astype('<u2')
        a['range'] = np.round(np.linalg.norm(pts[:, :3], axis=1) * 1000).astype('<u4')
    else:
        dt = np.dtype({'names': ['x', 'y', 'z', 'intensity'], 'formats': ['<f4'] * 4,
                       'offsets': [0, 4, 8, 12], 'itemsize': 16})
        fields = [field('x', 0, F32), field('y', 4, F32), field('z', 8, F32), field('intensity', 12, F32)]
        a = np.zeros(n, dtype=dt)
        a['intensity'] = pts[:, 3]
    a['x'], a['y'], a['z'] = pts[:, 0], pts[:, 1], pts[:, 2]
    msg = PointCloud2()
    msg.header.stamp.sec = int(stamp_ns // 1_000_000_000)
    msg.header.stamp.nanosec = int(stamp_ns % 1_000_000_000)
    msg.header.frame_id = frame_id
    msg.height, msg.width = 1, n
    msg.fields = fields
    msg.is_bigendian = False
    msg.point_step = dt.itemsize
    msg.row_step = dt.itemsize * n
    msg.data = a.tobytes()
    msg.is_dense = True
    return msg


def xyz_of(msg):
    names = {f.name: f for f in msg.fields}
    dt = np.dtype({'names': ['x', 'y', 'z'], 'formats': ['<' + NP[names[k].datatype] for k in 'xyz'],
                   'offsets': [names[k].offset for k in 'xyz'], 'itemsize': msg.point_step})
    a = np.frombuffer(bytes(msg.data), dtype=dt, count=msg.width * msg.height)
    return np.stack([a['x'], a['y'], a['z']], axis=1).astype(np.float32)


def stamp_ns(msg):
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


class Peer(Node):
    def __init__(self, args):
        super().__init__('lk_test_peer')
        self.args = args
        qos_in = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        self.pub = self.create_publisher(PointCloud2, args.input, qos_in)
        qos_out = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        self.outputs = []
        self.create_subscription(PointCloud2, args.output, self.outputs.append, qos_out)
        self.diags = []
        self.create_subscription(DiagnosticArray, '/diagnostics', self.on_diag, 10)
        self.passed = 0
        self.failed = 0

    def on_diag(self, msg):
        for s in msg.status:
            if s.name.startswith(self.args.node_fqn + ':'):
                self.diags.append((s.level, s.message, {kv.key: kv.value for kv in s.values}))

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
            rclpy.spin_once(self, timeout_sec=0.05)
        return cond()

    def output_with_stamp(self, ns):
        for m in self.outputs:
            if stamp_ns(m) == ns:
                return m
        return None

    def send_and_wait(self, msg, timeout=15.0, resend=3.0):
        """Publishes msg until an output with its stamp arrives (best effort may lose one)."""
        ns = stamp_ns(msg)
        deadline = time.monotonic() + timeout
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            self.pub.publish(msg)
            if self.spin_until(lambda: self.output_with_stamp(ns) is not None, min(resend, deadline - time.monotonic())):
                return self.output_with_stamp(ns), time.monotonic() - t0
        return None, None

    def latest_diag(self):
        return self.diags[-1][2] if self.diags else {}

    def wait_diag(self, cond, timeout=10.0):
        start = len(self.diags)
        return self.spin_until(lambda: any(cond(d[2]) for d in self.diags[start:]), timeout)

    def call(self, srv_type, name, req, timeout=10.0):
        cli = self.create_client(srv_type, name)
        if not cli.wait_for_service(timeout_sec=timeout):
            return None
        fut = cli.call_async(req)
        self.spin_until(fut.done, timeout)
        return fut.result() if fut.done() else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--input', required=True)
    ap.add_argument('--output', required=True)
    ap.add_argument('--node-fqn', required=True, help='e.g. /lk_test_node')
    ap.add_argument('--data', default=os.path.join(os.path.dirname(__file__), '..', '..', 'data', 'ouster'))
    ap.add_argument('--big', action='store_true', help='also send a full OS1-128 scan (5 MB, ouster layout)')
    ap.add_argument('--quick', action='store_true', help='discovery, one small cloud, QoS report only')
    ap.add_argument('--expect-qos', default=None, help="expected 'input_qos' diagnostics value prefix")
    ap.add_argument('--expect-drops', action='store_true', help='the node is slowed (relay_delay_ms): the burst must drop')
    args = ap.parse_args()

    rclpy.init()
    peer = Peer(args)
    ok = True
    try:
        # 1. Discovery: wait until our publisher is matched with the node's subscription.
        t0 = time.monotonic()
        matched = peer.spin_until(lambda: peer.pub.get_subscription_count() >= 1, 30.0)
        peer.check(matched, f'input publisher matched the node subscription ({time.monotonic() - t0:.2f} s)')
        if not matched:
            return 1

        small = load_bin(os.path.join(args.data, 'os1-32_scan0.bin'))
        base = 1_700_000_000_000_000_000
        # 2. First output (the node's publisher has matched our subscription once this arrives).
        out, dt = peer.send_and_wait(make_cloud(small, 'xyzi', base), timeout=30.0, resend=1.0)
        peer.check(out is not None, f'first output received ({dt if dt is None else round(dt, 3)} s)')
        if out is None:
            return 1

        if args.expect_qos is not None:
            got = peer.wait_diag(lambda d: d.get('input_qos', '').startswith(args.expect_qos), 5.0)
            peer.check(got, f"input QoS reported: {peer.latest_diag().get('input_qos')}")
        if args.quick:
            return 0 if peer.failed == 0 else 1

        # 3. Content: both layouts, several scans; x/y/z bit-identical, header kept, width kept.
        cases = [('os1-32_scan0.bin', 'xyzi'), ('os1-32_scan0.bin', 'ouster'), ('os0-128_scan0.bin', 'xyzi')]
        if args.big:
            cases.append(('os1-128_scan0.bin', 'ouster'))
        for i, (fname, layout) in enumerate(cases):
            pts = load_bin(os.path.join(args.data, fname))
            msg = make_cloud(pts, layout, base + (i + 1) * 100_000_000, frame_id=f'frame_{i}')
            out, dt = peer.send_and_wait(msg)
            what = f'{fname} as {layout} ({len(msg.data)} bytes)'
            if not peer.check(out is not None, f'{what}: output received'):
                continue
            peer.check(out.header.frame_id == msg.header.frame_id, f'{what}: header kept')
            peer.check(out.width * out.height == pts.shape[0], f'{what}: {out.width * out.height} points out of {pts.shape[0]}')
            same = np.array_equal(xyz_of(out), pts[:, :3].astype(np.float32))
            peer.check(same, f'{what}: x/y/z bit-identical (round trip {dt * 1e3:.1f} ms incl. publish)')
            names = [f.name for f in out.fields]
            peer.check('intensity' in names, f'{what}: output fields {names}')

        # 4. Malformed clouds: counted by kind in /diagnostics, node survives.
        good = make_cloud(small[:1000], 'xyzi', base + 10_000_000_000)
        truncated = make_cloud(small[:1000], 'xyzi', base + 11_000_000_000)
        truncated.data = bytes(truncated.data)[:-16 * 10]
        short_step = make_cloud(small[:1000], 'xyzi', base + 12_000_000_000)
        short_step.point_step = 8  # z (offset 8, 4 bytes) and intensity end past point_step
        short_step.row_step = 8 * 1000
        short_step.data = bytes(short_step.data)[:8000]
        no_x = make_cloud(small[:1000], 'xyzi', base + 13_000_000_000)
        no_x.fields = [f for f in no_x.fields if f.name != 'x']
        raw = serialize_message(good)[:200]  # CDR cut inside the point blob
        before = peer.latest_diag()
        if not before:
            peer.spin_until(lambda: bool(peer.diags), 5.0)
            before = peer.latest_diag()
        peer.check(bool(before), '/diagnostics received from the node')
        m0 = int(before.get('malformed', '0'))
        for m in (truncated, short_step, no_x):
            peer.pub.publish(m)
            peer.spin_until(lambda: False, 0.05)  # keep the latest-wins queue from merging them
        peer.pub.publish(raw)
        kinds = ['malformed.data_too_short', 'malformed.field_past_point_step', 'malformed.missing_field', 'malformed.cdr']
        got = peer.wait_diag(lambda d: int(d.get('malformed', '0')) >= m0 + 4 and all(k in d for k in kinds), 15.0)
        d = peer.latest_diag()
        peer.check(got, 'malformed clouds counted: ' + ', '.join(f'{k}={d.get(k)}' for k in ['malformed'] + kinds))
        peer.check(any(lvl in (1, b'\x01') for lvl, _, _ in peer.diags), 'diagnostics level WARN after malformed clouds')
        out, _ = peer.send_and_wait(good)
        peer.check(out is not None and out.width == 1000, 'node still processes good clouds after malformed ones')

        # 5. Burst: the latest-wins queue drops (and counts) rather than blocking; books balance.
        burst = [make_cloud(small, 'ouster', base + 20_000_000_000 + k) for k in range(30)]
        for m in burst:
            peer.pub.publish(m)
        last = stamp_ns(burst[-1])
        peer.spin_until(lambda: peer.output_with_stamp(last) is not None, 20.0)

        def balanced(d):
            return (d.get('queue_waiting') == '0' and int(d['received']) ==
                    int(d['processed']) + int(d['malformed']) + int(d['dropped_queue_full']))
        ok_books = peer.wait_diag(balanced, 10.0)
        d = peer.latest_diag()
        peer.check(ok_books, f"books balance after a burst: received {d.get('received')} = processed {d.get('processed')}"
                   f" + malformed {d.get('malformed')} + dropped {d.get('dropped_queue_full')}")
        peer.check(peer.output_with_stamp(last) is not None, 'newest cloud of the burst processed (latest wins)')
        if args.expect_drops:
            peer.check(int(d.get('dropped_queue_full', '0')) > 0, f"slow stage: burst dropped {d.get('dropped_queue_full')} "
                       f"waiting clouds, got {sum(1 for m in peer.outputs if stamp_ns(m) >= stamp_ns(burst[0]))} outputs")

        # 6. Parameters: described with range, range and read-only enforced.
        node = args.node_fqn
        r = peer.call(DescribeParameters, f'{node}/describe_parameters',
                      DescribeParameters.Request(names=['queue_size', 'reliable']))
        desc = [x.description for x in r.descriptors] if r else []
        peer.check(len(desc) == 2 and 'Range [1, 64]' in desc[0] and 'Read-only' in desc[1], f'describe_parameters: {desc}')

        def setp(name, value):
            p = Parameter(name=name, value=value)
            r = peer.call(SetParameters, f'{node}/set_parameters', SetParameters.Request(parameters=[p]))
            return r.results[0] if r else None
        r = setp('queue_size', ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=2))
        peer.check(r is not None and r.successful, 'set queue_size:=2 accepted')
        r = setp('queue_size', ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=0))
        peer.check(r is not None and not r.successful, f'set queue_size:=0 rejected ({r.reason if r else None})')
        r = setp('reliable', ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=True))
        peer.check(r is not None and not r.successful, f'set reliable at run time rejected ({r.reason if r else None})')
        r = peer.call(GetParameters, f'{node}/get_parameters', GetParameters.Request(names=['queue_size']))
        peer.check(r is not None and r.values[0].integer_value == 2, 'get queue_size == 2')
        peer.check(peer.wait_diag(lambda d: d.get('queue_size') == '2', 5.0), 'queue_size change applied (diagnostics)')
    finally:
        print(f'{peer.passed} passed, {peer.failed} failed', flush=True)
        ok = peer.failed == 0
        peer.destroy_node()
        rclpy.shutdown()
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
