#!/usr/bin/env python3
"""sass_hashes.py: one line per kernel of the CUDA objects given, with a hash of its machine code.

    scripts/sass_hashes.py [--arch 90] build/src/backend/CMakeFiles/lily_backend_cuda.dir > hashes.txt

For each host object (.o, or every .o under a directory) the fatbin (.nv_fatbin) is read, the
cubin (ELF) of the architecture asked for taken (sm_90a is 90), and each kernel's sections
hashed: .text.NAME (the SASS), its relocations, .nv.info.NAME (registers, parameters, barriers),
and the sizes of .nv.shared.NAME and .nv.constant0.NAME. Two builds have the same machine code
for a kernel when its lines are equal (diff the outputs). No cuobjdump needed: the fatbin and
ELF formats are read here (the PTX entries are zstd-compressed and skipped)."""
import argparse, hashlib, os, re, struct, sys


def fatbin_entries(data):
    """(kind, arch, payload) of each entry: kind 1 PTX, 2 ELF; arch as nvcc numbers it (90)."""
    off = 0
    while off + 16 <= len(data):
        magic, _, header_size, fat_size = struct.unpack_from('<IHHQ', data, off)
        if magic != 0xBA55ED50:
            break
        p, end = off + header_size, off + header_size + fat_size
        while p < end:
            kind, _, entry_header, payload = struct.unpack_from('<HHIQ', data, p)
            arch = struct.unpack_from('<I', data, p + 28)[0]
            yield kind, arch, data[p + entry_header:p + entry_header + payload]
            p += entry_header + payload
        off = end


def elf_sections(data):
    """{name: (type, bytes, size)} of a little-endian ELF64 file."""
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    headers = [struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for h in headers:
        name = names[h[0]:names.index(b'\0', h[0])].decode()
        out[name] = (h[1], data[h[4]:h[4] + h[5]] if h[1] != 8 else b'', h[5])  # type 8: NOBITS
    return out


def normalise(name):
    """A mangled name without the per-file tag of anonymous namespaces (it changes with the file)."""
    return re.sub(r'_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+?_cu_[0-9a-f]{8}', '_GLOBAL__N_', name)


def symbol_names(sections):
    """{index: normalised name} of the cubin's symbols."""
    if '.symtab' not in sections or '.strtab' not in sections:
        return {}
    table, strings = sections['.symtab'][1], sections['.strtab'][1]
    out = {}
    for i in range(0, len(table), 24):
        offset = struct.unpack_from('<I', table, i)[0]
        out[i // 24] = normalise(strings[offset:strings.index(b'\0', offset)].decode())
    return out


def host_section(path, wanted):
    data = open(path, 'rb').read()
    sections = elf_sections(data)
    return sections[wanted][1] if wanted in sections else b''


def kernels(obj, arch):
    fatbin = host_section(obj, '.nv_fatbin')
    for kind, a, payload in fatbin_entries(fatbin):
        if kind != 2 or a != arch or payload[:4] != b'\x7fELF':
            continue
        s = elf_sections(payload)
        symbols = symbol_names(s)
        for name in sorted(n for n in s if n.startswith('.text.')):
            k = name[len('.text.'):]
            h = hashlib.sha256(s[name][1])
            h.update(s.get('.nv.info.' + k, (0, b'', 0))[1])
            for extra, size in (('.rel.text.', 16), ('.rela.text.', 24)):
                rel = s.get(extra + k, (0, b'', 0))[1]
                for i in range(0, len(rel), size):  # offset, type and the symbol's name, not its index
                    offset, info = struct.unpack_from('<QQ', rel, i)
                    addend = rel[i + 16:i + size]
                    h.update(f'{offset} {info & 0xffffffff} {symbols.get(info >> 32, "?")} {addend.hex()};'.encode())
            shared = s.get('.nv.shared.' + k, (0, b'', 0))[2]
            const0 = s.get('.nv.constant0.' + k, (0, b'', 0))[2]
            yield normalise(k), h.hexdigest()[:16], len(s[name][1]), shared, const0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--arch', type=int, default=90)
    ap.add_argument('paths', nargs='+')
    args = ap.parse_args()
    objs = []
    for p in args.paths:
        if os.path.isdir(p):
            for root, _, files in os.walk(p):
                objs += [os.path.join(root, f) for f in files if f.endswith('.o')]
        else:
            objs.append(p)
    rows = []
    for o in objs:
        for k, h, size, shared, const0 in kernels(o, args.arch):
            rows.append(f'{k} {h} text={size} shared={shared} param={const0}')
    for r in sorted(rows):
        print(r)
    print(f'{len(rows)} kernels', file=sys.stderr)


if __name__ == '__main__':
    main()
