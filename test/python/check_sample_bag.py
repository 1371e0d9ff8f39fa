#!/usr/bin/env python3
"""Checks a rosbag2 bag written by lidar_kernels with the independent `rosbags` reader.

Default: the bundled sample (lidar_kernels::bag::sample::write_sample_bag): topic /ouster/points,
one sensor_msgs/msg/PointCloud2 per scan of data/ouster (os1-128_scan0..2, os1-32_scan0), the
ouster-ros 48-byte point layout, and x, y, z bit-identical to the .bin scans.

For other bags (e.g. the replay output):
    check_sample_bag.py BAG --topics /ouster/points /lidar_kernels/voxels --no-scans
checks that every listed topic exists with messages, that the embedded message definitions parse
and every message on them deserializes, and the layout of --points-topic.

Exit status: 0 when every check passes, 1 on a mismatch, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from rosbags.highlevel import AnyReader
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SCANS = ['os1-128_scan0.bin', 'os1-128_scan1.bin', 'os1-128_scan2.bin', 'os1-32_scan0.bin']
FRAME_ID = 'os_sensor'
START_NS = 1_700_000_000_000_000_000
PERIOD_NS = 100_000_000

# ouster-ros 48-byte point: name -> (offset, datatype); datatypes: 2 UINT8, 4 UINT16, 6 UINT32, 7 FLOAT32.
OUSTER_FIELDS = [
    ('x', 0, 7), ('y', 4, 7), ('z', 8, 7), ('intensity', 16, 7), ('t', 20, 6),
    ('reflectivity', 24, 4), ('ring', 26, 4), ('ambient', 28, 4), ('range', 32, 6),
]

failures: list[str] = []


def check(cond: bool, what: str) -> bool:
    if not cond:
        failures.append(what)
        print(f'FAIL: {what}')
    return cond


def typestore_from_bag(reader: AnyReader):
    """A typestore built only from the definitions embedded in the bag (proves they are complete)."""
    store = get_typestore(Stores.EMPTY)
    for conn in reader.connections:
        text = conn.msgdef.data if conn.msgdef else ''
        if not check(bool(text), f'{conn.topic}: no message definition embedded'):
            continue
        try:
            store.register(get_types_from_msg(text, conn.msgtype))
        except Exception as exc:  # noqa: BLE001
            check(False, f'{conn.topic}: embedded definition of {conn.msgtype} does not parse: {exc}')
    return store


def check_layout(msg, topic: str, index: int) -> None:
    fields = [(f.name, f.offset, f.datatype) for f in msg.fields]
    check(fields == OUSTER_FIELDS, f'{topic}[{index}]: fields {fields} != ouster layout')
    check(msg.point_step == 48, f'{topic}[{index}]: point_step {msg.point_step} != 48')
    check(all(f.count == 1 for f in msg.fields), f'{topic}[{index}]: a field has count != 1')
    check(msg.height == 1, f'{topic}[{index}]: height {msg.height} != 1')
    check(msg.row_step == msg.point_step * msg.width, f'{topic}[{index}]: row_step {msg.row_step}')
    check(len(msg.data) == msg.row_step * msg.height, f'{topic}[{index}]: data has {len(msg.data)} bytes')
    check(not msg.is_bigendian, f'{topic}[{index}]: big endian')


def xyz(msg) -> np.ndarray:
    points = np.frombuffer(bytes(msg.data), dtype=np.uint8).reshape(-1, msg.point_step)
    return points[:, :12].copy().view('<f4').reshape(-1, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('bag', type=Path, help='bag folder (with metadata.yaml) or .mcap/.db3 file')
    ap.add_argument('--topics', nargs='+', default=None,
                    help='topics that must be present with at least one message (--points-topic always is)')
    ap.add_argument('--points-topic', default='/ouster/points', help='PointCloud2 topic to check')
    ap.add_argument('--scans', nargs='+', default=SAMPLE_SCANS, help='.bin scans, in message order')
    ap.add_argument('--no-scans', action='store_true', help='do not compare with .bin scans')
    ap.add_argument('--any-layout', action='store_true', help='do not require the ouster 48-byte layout')
    ap.add_argument('--data-dir', type=Path, default=REPO / 'data' / 'ouster')
    ap.add_argument('--count', type=int, default=None,
                    help='expected messages on --points-topic (default: number of scans)')
    args = ap.parse_args()

    if not args.bag.exists():
        print(f'{args.bag}: does not exist', file=sys.stderr)
        return 2
    topics = list(dict.fromkeys([*(args.topics or []), args.points_topic]))
    expect_count = args.count if args.count is not None else (None if args.no_scans else len(args.scans))

    with AnyReader([args.bag]) as reader:
        by_topic = {c.topic: c for c in reader.connections}
        print(f'{args.bag}: ' + ', '.join(f'{c.topic} ({c.msgtype}, {c.msgcount})' for c in reader.connections))
        for topic in topics:
            conn = by_topic.get(topic)
            if check(conn is not None, f'topic {topic} missing (have {sorted(by_topic)})'):
                check(conn.msgcount > 0, f'topic {topic} has no messages')
        store = typestore_from_bag(reader)

        # Every message on the listed topics deserializes with the embedded definitions.
        wanted = [c for c in reader.connections if c.topic in topics]
        seen: dict[str, int] = {}
        for conn, timestamp, raw in reader.messages(connections=wanted):
            index = seen.get(conn.topic, 0)
            seen[conn.topic] = index + 1
            try:
                msg = store.deserialize_cdr(raw, conn.msgtype)
            except Exception as exc:  # noqa: BLE001
                check(False, f'{conn.topic}[{index}]: does not deserialize as {conn.msgtype}: {exc}')
                continue
            if conn.topic != args.points_topic:
                continue
            if not check(conn.msgtype == 'sensor_msgs/msg/PointCloud2',
                         f'{conn.topic}: type {conn.msgtype} is not sensor_msgs/msg/PointCloud2'):
                continue
            if not args.any_layout:
                check_layout(msg, conn.topic, index)
            if args.no_scans:
                continue
            if index >= len(args.scans):
                continue
            scan = np.fromfile(args.data_dir / args.scans[index], dtype='<f4').reshape(-1, 6)
            got = xyz(msg)
            if check(got.shape == scan[:, :3].shape,
                     f'{conn.topic}[{index}]: {got.shape[0]} points, {args.scans[index]} has {scan.shape[0]}'):
                check(np.array_equal(got.view('<u4'), scan[:, :3].copy().view('<u4')),
                      f'{conn.topic}[{index}]: x,y,z differ from {args.scans[index]}')
            if args.scans == SAMPLE_SCANS:
                stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
                check(stamp == START_NS + index * PERIOD_NS, f'{conn.topic}[{index}]: stamp {stamp}')
                check(timestamp == stamp, f'{conn.topic}[{index}]: log time {timestamp} != stamp {stamp}')
                check(msg.header.frame_id == FRAME_ID, f'{conn.topic}[{index}]: frame_id {msg.header.frame_id!r}')
        if expect_count is not None:
            got_count = seen.get(args.points_topic, 0)
            check(got_count == expect_count, f'{args.points_topic}: {got_count} messages, expected {expect_count}')

    if failures:
        print(f'{len(failures)} check(s) failed')
        return 1
    print('OK')
    return 0


if __name__ == '__main__':
    sys.exit(main())
