#!/usr/bin/env python3
"""Regenerates fuzz/seeds/<target>/ from the table tests' string literals (run from fuzz/).

Seeds are committed; rerun this when the tables grow. Discovery seeds beyond the small ones
here come straight from tests/fixtures/discovery/ (scripts/fuzz passes those folders)."""
import hashlib, os, re, shutil

LIT = re.compile(r'(b?)"((?:[^"\\]|\\.)*)"')
ESC = re.compile(r'\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)', re.S)


def unescape(s, raw_bytes):
    def one(m):
        e = m.group(1)
        if e.startswith('u{'):
            return chr(int(e[2:-1], 16)).encode()
        if e.startswith('x'):
            return bytes([int(e[1:], 16)]) if raw_bytes else chr(int(e[1:], 16)).encode()
        return {'n': b'\n', 't': b'\t', 'r': b'\r', '0': b'\0', '\\': b'\\', '"': b'"',
                "'": b"'", '\n': b''}.get(e, e.encode())
    out, pos = b'', 0
    for m in ESC.finditer(s):
        out += s[pos:m.start()].encode() + one(m)
        pos = m.end()
    return out + s[pos:].encode()


def literals(path):
    text = open(path, encoding='utf-8').read()
    return [unescape(m.group(2), m.group(1) == 'b') for m in LIT.finditer(text)]


def write(target, seeds):
    d = os.path.join('seeds', target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for s in dict.fromkeys(seeds):
        name = hashlib.sha1(s).hexdigest()[:16]
        open(os.path.join(d, name), 'wb').write(s)
    print(target, len(os.listdir(d)))


core = '../filter/core/src/'
paths = [l for f in ('request_info.rs', 'routing.rs', 'plan.rs') for l in literals(core + f)
         if l.startswith(b'/') or l == b'*']
methods = [b'GET', b'POST', b'DELETE', b'PATCH', b'PUT', b'HEAD', b'get', b'OPTIONS']
write('request_info', [methods[i % len(methods)] + b'\n' + p for i, p in enumerate(paths)])
write('identity', [l for l in literals(core + 'identity.rs') if b'=' in l and len(l) < 4096])
# The negotiation tables build headers with format!() from these constants.
nego = literals(core + 'negotiation.rs')
consts = dict(re.findall(r'const (\w+): &str =\s*"([^"]*)"', open(core + 'negotiation.rs').read()))


def expand(l):
    for k, v in consts.items():
        l = l.replace(('{' + k + '}').encode(), v.encode())
    return l


write('negotiation', [bytes([i % 2]) + expand(l) for i, l in enumerate(nego)
                      if b'/' in l or b'=' in l or b',' in l])
