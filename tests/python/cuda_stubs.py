"""Make PyPI's CUDA build of torch import and run on CPU without the multi-GB nvidia-* wheels.

PyPI's Linux x86_64 torch wheel is a CUDA build: its libraries name cuBLAS, cuDNN, NCCL, ... as
DT_NEEDED, and Python opens extension modules with RTLD_NOW, so every symbol must resolve at import
even though a CPU-only run never calls one of them. setup-torch installs torch with --no-deps plus
the two small real CUDA libraries that the CPU library itself needs (cudart, CUPTI), and this script
builds a tiny stub for each remaining missing library: right soname, right symbol versions, every
symbol torch references from it. A stub function returns 1, which each of these libraries reads as
an error status; nothing on a CPU path calls them, and a stray GPU call fails instead of hanging.

Usage: python cuda_stubs.py SITE_PACKAGES   (writes SITE_PACKAGES/nvidia/cu13/lib/<soname>)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SYSTEM_LIB_DIRS = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]


def run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def needed(lib: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", "-W", str(lib)))


def version_needs(lib: Path) -> dict[str, str]:
    """Version name -> file that must define it, from .gnu.version_r."""
    out = run("readelf", "-V", "-W", str(lib))
    section = out.split("Version needs section", 1)
    result: dict[str, str] = {}
    if len(section) < 2:
        return result
    current = None
    for line in section[1].splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)", line)
        if m and current:
            result[m.group(1)] = current
    return result


def dynamic_symbols(lib: Path) -> tuple[list[tuple[str, str | None, str]], set[str]]:
    """(undefined strong symbols as (name, version, type), defined names) of a shared object."""
    undefined: list[tuple[str, str | None, str]] = []
    defined: set[str] = set()
    for line in run("readelf", "--dyn-syms", "-W", str(lib)).splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].endswith(":"):
            continue
        _, _, _, typ, bind, _, ndx, name = parts[:8]
        base, _, version = name.partition("@")
        version = version.lstrip("@") or None
        if ndx == "UND":
            if bind != "WEAK" and base:
                undefined.append((base, version, typ))
        elif base:
            defined.add(base)
    return undefined, defined


def find_lib(soname: str, search: list[Path]) -> Path | None:
    for d in search:
        p = d / soname
        if p.exists():
            return p
    return None


def main() -> None:
    site = Path(sys.argv[1])
    torch_lib = site / "torch" / "lib"
    out_dir = site / "nvidia" / "cu13" / "lib"
    out_dir.mkdir(parents=True, exist_ok=True)
    search = [torch_lib, out_dir] + [Path(d) for d in SYSTEM_LIB_DIRS]

    libs = sorted(torch_lib.glob("*.so")) + sorted((site / "torch").glob("_C*.so"))
    # Only libraries loaded on import matter; libcaffe2_nvrtc is dlopen'ed on first GPU JIT use.
    libs = [lib for lib in libs if lib.name != "libcaffe2_nvrtc.so"]

    missing: set[str] = set()
    present: set[Path] = set()
    for lib in libs:
        for so in needed(lib):
            p = find_lib(so, search)
            if p is None:
                missing.add(so)
            else:
                present.add(p)

    defined: set[str] = set()
    for p in set(libs) | present:
        defined |= dynamic_symbols(p)[1]

    versioned: dict[str, dict[str, str]] = {so: {} for so in missing}
    unversioned: dict[str, str] = {}
    for lib in libs:
        owners = version_needs(lib)
        undefined, _ = dynamic_symbols(lib)
        for name, version, typ in undefined:
            if version is not None:
                owner = owners.get(version)
                if owner in missing:
                    versioned[owner].setdefault(version, "")
                    versioned[owner][name + "@" + version] = typ
            elif name not in defined:
                unversioned[name] = typ

    for so in sorted(missing):
        write_stub(out_dir / so, so, versioned[so], unversioned)
    print(f"cuda_stubs: {len(missing)} stub libraries in {out_dir}: {' '.join(sorted(missing))}")


def write_stub(path: Path, soname: str, versioned: dict[str, str], unversioned: dict[str, str]) -> None:
    nodes: dict[str, list[str]] = {}
    symbols: dict[str, str] = dict(unversioned)
    for key, typ in versioned.items():
        if "@" not in key:
            nodes.setdefault(key, [])
            continue
        name, version = key.split("@", 1)
        nodes.setdefault(version, []).append(name)
        symbols[name] = typ

    asm = [".text"]
    for name, typ in sorted(symbols.items()):
        if typ == "OBJECT":
            asm += [".data", f'.globl "{name}"', f'.type "{name}", @object', f'.size "{name}", 64',
                    f'"{name}":', ".zero 64", ".text"]
        else:
            asm += [f'.globl "{name}"', f'.type "{name}", @function', f'"{name}":', "mov $1, %eax", "ret"]
    asm.append('.section .note.GNU-stack,"",@progbits')

    # ld allows no anonymous version node beside named ones, so unversioned symbols join the
    # first named node: an unversioned reference binds to a symbol's default version.
    rest = sorted(set(unversioned) - {n for ns in nodes.values() for n in ns})
    if nodes:
        first = sorted(nodes)[0]
        nodes[first] = nodes[first] + rest
        script = []
        for i, (version, names) in enumerate(sorted(nodes.items())):
            body = "".join(f'  "{n}";\n' for n in sorted(names))
            local = " local: *;\n" if i == 0 else ""
            script.append(f"{version} {{\n global:\n{body}{local}}};\n")
    else:
        body = "".join(f'  "{n}";\n' for n in rest)
        script = [f"{{\n global:\n{body} local: *;\n}};\n"]

    with tempfile.TemporaryDirectory() as tmp:
        s = Path(tmp) / "stub.s"
        v = Path(tmp) / "stub.map"
        s.write_text("\n".join(asm) + "\n")
        v.write_text("".join(script))
        tmp_out = path.with_suffix(path.suffix + ".tmp")
        subprocess.run(["cc", "-shared", "-nostdlib", f"-Wl,-soname,{soname}", f"-Wl,--version-script={v}",
                        "-o", str(tmp_out), str(s)], check=True)
        os.replace(tmp_out, path)


if __name__ == "__main__":
    main()
