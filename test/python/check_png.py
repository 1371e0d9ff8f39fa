#!/usr/bin/env python3
"""Reads every PNG in DIR with Python's own zlib (not the png crate that wrote them): signature,
chunk CRCs, IHDR, and that the image data inflates to height rows of (1 + width * 3) bytes with
valid filter bytes, and is not one flat colour. Usage: check_png.py DIR EXPECTED_COUNT"""
import struct
import sys
import zlib
from pathlib import Path


def check(path: Path) -> str | None:
    data = path.read_bytes()
    if data[:8] != b'\x89PNG\r\n\x1a\n':
        return 'no PNG signature'
    pos, idat, ihdr = 8, b'', None
    while pos < len(data):
        (length,) = struct.unpack('>I', data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack('>I', data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            return f'bad CRC in {kind!r}'
        if kind == b'IHDR':
            ihdr = struct.unpack('>IIBBBBB', body)
        elif kind == b'IDAT':
            idat += body
        pos += 12 + length
    if ihdr is None:
        return 'no IHDR'
    width, height, depth, colour = ihdr[:4]
    if (depth, colour) != (8, 2):
        return f'not 8-bit RGB (depth {depth}, colour type {colour})'
    raw = zlib.decompress(idat)
    if len(raw) != height * (1 + 3 * width):
        return f'{len(raw)} bytes of image data for {width}x{height}'
    if any(raw[r * (1 + 3 * width)] > 4 for r in range(height)):
        return 'bad filter byte'
    if len(set(raw[1:1 + 3 * width])) == 1 and len(set(raw)) < 8:
        return 'a flat picture'
    return None


def main() -> int:
    folder, expected = Path(sys.argv[1]), int(sys.argv[2])
    pngs = sorted(folder.glob('*.png'))
    bad = [(p, e) for p in pngs if (e := check(p))]
    for p, e in bad:
        print(f'FAIL {p}: {e}')
    ok = not bad and len(pngs) == expected
    print(f'{len(pngs)} PNGs in {folder} (expected {expected}), {len(bad)} bad: {"ok" if ok else "FAIL"}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
