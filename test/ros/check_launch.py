#!/usr/bin/env python3
"""Static checks of launch/ and config/*.param.yaml (`ros2 launch` cannot be installed here).

- every launch/*.launch.xml parses (xml.etree) and every launch/*.launch.py parses (ast);
- every node they start is package lidar_kernels and an executable of src/bin/;
- every parameter they set is declared by that node (`<bin> --list-params`), every remapping is
  of the node's input topic, every $(var x) / LaunchConfiguration('x') is a declared argument,
  every params file they name exists in config/;
- each XML launch file has a Python twin starting the same executables with the same arguments;
- every config/*.param.yaml has a `/**` section and per-node sections (`<node>: ros__parameters:`);
  each node's keys there (/** and its own, dotted by nesting) are declared by that node, with a
  value of the declared type (arrays of one element type).

Prints PASS/FAIL lines and 'N passed, N failed'.
"""

import argparse
import ast
import glob
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
INPUTS = {'nms': 'boxes_in'}
results = [0, 0]


def check(ok, what):
    print(('PASS ' if ok else 'FAIL ') + what, flush=True)
    results[0 if ok else 1] += 1
    return ok


def declared(bindir, exe):
    """{name: (type, read_only)} from `<exe> --list-params`."""
    out = subprocess.run([os.path.join(bindir, exe), '--list-params'], check=True, capture_output=True, text=True,
                         timeout=30).stdout
    params = {}
    for line in out.splitlines():
        name, typ, _default, _range, ro, _desc = line.split('\t', 5)
        params[name] = (typ, ro == 'read_only')
    return params


def check_refs(where, text_values, args):
    used = set()
    for v in text_values:
        used |= set(re.findall(r'\$\(var ([A-Za-z0-9_]+)\)', v))
    missing = used - set(args)
    check(not missing, f'{where}: every $(var ...) is a declared <arg> ({sorted(used)})' + (f': missing {missing}' if missing else ''))
    for v in text_values:
        for f in re.findall(r'config/([A-Za-z0-9_.]+\.yaml)', v):
            check(os.path.isfile(os.path.join(ROOT, 'config', f)), f'{where}: config/{f} exists')


def xml_launch(path, bins, decl):
    where = os.path.relpath(path, ROOT)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        check(False, f'{where}: XML parses ({e})')
        return None
    check(root.tag == 'launch', f'{where}: XML parses, root <launch>')
    args = {a.get('name'): a.get('default') for a in root.iter('arg')}
    texts = [v for el in root.iter() for v in el.attrib.values()]
    check_refs(where, texts, args)
    nodes = []
    for n in root.iter('node'):
        exe = n.get('exec')
        ok = n.get('pkg') == 'lidar_kernels' and exe in bins
        check(ok, f'{where}: node pkg={n.get("pkg")} exec={exe} is an executable of src/bin')
        if not ok:
            continue
        names = [p.get('name') for p in n.iter('param') if p.get('name')]
        bad = [p for p in names if p not in decl[exe]]
        check(not bad, f'{where}: {exe} parameters {names} declared by the node' + (f': undeclared {bad}' if bad else ''))
        froms = [p.get('from') for p in n.iter('param') if p.get('from')]
        check(bool(froms), f'{where}: {exe} takes a params file ({froms})')
        remaps = [r.get('from') for r in n.iter('remap')]
        inp = INPUTS.get(exe, 'points')
        check(remaps == [inp], f'{where}: {exe} remaps its input topic {inp} ({remaps})')
        nodes.append((exe, sorted(names), sorted(remaps)))
    check(bool(nodes), f'{where}: starts {len(nodes)} node(s)')
    return nodes, sorted(args)


def const(node):
    return node.value if isinstance(node, ast.Constant) else None


def py_launch(path, bins, decl):
    where = os.path.relpath(path, ROOT)
    try:
        tree = ast.parse(open(path).read(), path)
    except SyntaxError as e:
        check(False, f'{where}: Python parses ({e})')
        return None
    fns = [f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
    check('generate_launch_description' in fns, f'{where}: Python parses, defines generate_launch_description')
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
    args = [const(c.args[0]) for c in calls if c.func.id == 'DeclareLaunchArgument' and c.args]
    used = [const(c.args[0]) for c in calls if c.func.id == 'LaunchConfiguration' and c.args]
    missing = set(used) - set(args)
    check(not missing, f'{where}: every LaunchConfiguration is a DeclareLaunchArgument ({sorted(set(used))})'
          + (f': missing {missing}' if missing else ''))
    for c in calls:
        if c.func.id == 'PathJoinSubstitution' and c.args and isinstance(c.args[0], ast.List):
            parts = [const(e) for e in c.args[0].elts]
            if 'config' in parts:
                f = parts[-1]
                check(os.path.isfile(os.path.join(ROOT, 'config', f)), f'{where}: config/{f} exists')
    nodes = []
    for c in calls:
        if c.func.id != 'Node':
            continue
        kw = {k.arg: k.value for k in c.keywords}
        exe = const(kw.get('executable'))
        ok = const(kw.get('package')) == 'lidar_kernels' and exe in bins
        check(ok, f'{where}: Node package={const(kw.get("package"))} executable={exe} is an executable of src/bin')
        if not ok:
            continue
        names = []
        for p in getattr(kw.get('parameters'), 'elts', []):
            if isinstance(p, ast.Dict):
                names += [const(k) for k in p.keys]
        bad = [p for p in names if p not in decl[exe]]
        check(not bad, f'{where}: {exe} parameters {names} declared by the node' + (f': undeclared {bad}' if bad else ''))
        remaps = [const(t.elts[0]) for t in getattr(kw.get('remappings'), 'elts', []) if isinstance(t, ast.Tuple)]
        inp = INPUTS.get(exe, 'points')
        check(remaps == [inp], f'{where}: {exe} remaps its input topic {inp} ({remaps})')
        nodes.append((exe, sorted(names), sorted(remaps)))
    check(bool(nodes), f'{where}: starts {len(nodes)} node(s)')
    return nodes, sorted(args)


def flatten(d, prefix=''):
    for k, v in d.items():
        key = f'{prefix}.{k}' if prefix else str(k)
        if isinstance(v, dict):
            yield from flatten(v, key)
        else:
            yield key, v


def type_ok(typ, v):
    if typ == 'bool':
        return isinstance(v, bool)
    if typ == 'integer':
        return isinstance(v, int) and not isinstance(v, bool)
    if typ == 'double':
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if typ == 'string':
        return isinstance(v, str)
    if typ == 'double array':
        return isinstance(v, list) and (all(isinstance(x, float) for x in v) or all(isinstance(x, int) and not isinstance(x, bool) for x in v))
    if typ == 'string array':
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    return False


def param_file(path, decl):
    where = os.path.relpath(path, ROOT)
    try:
        doc = yaml.safe_load(open(path))
    except yaml.YAMLError as e:
        check(False, f'{where}: YAML parses ({e})')
        return
    sections = list(doc) if isinstance(doc, dict) else []
    unknown = [k for k in sections if k != '/**' and k not in decl]
    ok = bool(sections) and not unknown and all(list(doc[k] or {}) == ['ros__parameters'] for k in sections)
    if not check(ok, f'{where}: sections {sections} are /** or node names, each with ros__parameters'
                 + (f': unknown {unknown}' if unknown else '')):
        return
    # A node reads /** and its own section: every key there must be one it declares, of its type,
    # so that no node logs "not declared" with the shipped files.
    for exe in sorted(decl):
        keys = dict(flatten((doc.get('/**') or {}).get('ros__parameters') or {}))
        keys.update(flatten((doc.get(exe) or {}).get('ros__parameters') or {}))
        bad = [k for k in keys if k not in decl[exe]]
        check(not bad, f'{where}: {exe} reads {len(keys)} keys, each declared by it' + (f': undeclared {bad}' if bad else ''))
        wrong = [f'{k}={keys[k]!r} (want {decl[exe][k][0]})' for k in keys if k in decl[exe] and not type_ok(decl[exe][k][0], keys[k])]
        check(not wrong, f'{where}: {exe}: every value has the declared type' + (f': {wrong}' if wrong else ''))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--bindir', required=True)
    args = ap.parse_args()
    bins = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, 'src', 'bin', '*.rs')))
    decl = {b: declared(args.bindir, b) for b in bins}
    check(all(len(d) > 10 for d in decl.values()), f'--list-params of {bins}: ' + ', '.join(f'{b} {len(d)}' for b, d in decl.items()))
    xmls = sorted(glob.glob(os.path.join(ROOT, 'launch', '*.launch.xml')))
    pys = sorted(glob.glob(os.path.join(ROOT, 'launch', '*.launch.py')))
    check(len(xmls) >= len(bins) and len(pys) >= len(bins), f'{len(xmls)} XML and {len(pys)} Python launch files')
    for b in bins:
        check(os.path.join(ROOT, 'launch', f'{b}.launch.xml') in xmls and os.path.join(ROOT, 'launch', f'{b}.launch.py') in pys,
              f'launch/{b}.launch.xml and .py exist')
    for x in xmls:
        rx = xml_launch(x, bins, decl)
        py = x[:-len('.xml')] + '.py'
        if not os.path.exists(py):
            check(False, f'{os.path.relpath(x, ROOT)}: Python twin {os.path.basename(py)} exists')
            continue
        rp = py_launch(py, bins, decl)
        if rx and rp:
            check(rx == rp, f'{os.path.basename(x)} and {os.path.basename(py)} start the same nodes with the same arguments'
                  + ('' if rx == rp else f': {rx} vs {rp}'))
    for p in [p for p in pys if p[:-len('.py')] + '.xml' not in xmls]:
        py_launch(p, bins, decl)
    files = sorted(glob.glob(os.path.join(ROOT, 'config', '*.param.yaml')))
    check(len(files) >= 4, f'params files: {[os.path.basename(f) for f in files]}')
    for f in files:
        param_file(f, decl)
    print(f'{results[0]} passed, {results[1]} failed', flush=True)
    return 1 if results[1] else 0


if __name__ == '__main__':
    sys.exit(main())
