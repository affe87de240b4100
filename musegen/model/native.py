"""C kernels for CPU hot spots that PyTorch would run as many passes over memory.

Each kernel is a C file beside this module, compiled on first use with the system's C
compiler (`$CC`, else `cc`) into the user's cache and loaded with ctypes: no Python headers,
no build step at install, under a second to compile. Where no compiler works (or
MUSEGEN_NATIVE=0), `library` returns None and callers run their PyTorch version, which
computes the same thing.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from ..device import cpu_flags

HERE = Path(__file__).parent
# The portable flags are the fallback for compilers that do not know -march=native.
FLAG_SETS = (["-O3", "-march=native"], ["-O3"])
_POINTER, _INT, _INT64, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
SIGNATURES = {  # kernel -> {function: (ctypes argument types, return type)}
    "dropout": {"dropout": ([_POINTER, _POINTER, _INT64, _INT, ctypes.c_uint64, ctypes.c_uint32, _FLOAT], None)},
    "step": {
        "linear_bf16": ([_POINTER] * 5 + [_INT64] * 3, _INT),
        "linear_attention_step": ([_POINTER] * 5 + [_INT] + [_FLOAT] * 3 + [_POINTER] * 2 + [_INT64] * 5, _INT),
        "layer_step": ([_POINTER] * 4, _INT),
        "step_interface": ([ctypes.c_char_p], _INT64),
    },
}


def enabled() -> bool:
    return os.environ.get("MUSEGEN_NATIVE", "1") != "0"


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "musegen" / "native"


def _machine() -> str:
    """What a -march=native build depends on: a shared home on another CPU needs its own build."""
    return f"{platform.machine()} {platform.system()} {' '.join(sorted(cpu_flags()))}"


def _compile(source: Path, target: Path, defines: list[str]) -> bool:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    for flags in FLAG_SETS:
        # built beside the target and renamed into place: processes starting together never load half a file
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            command = [compiler, *flags, *defines, "-shared", "-fPIC", str(source), "-o", str(built), "-lm"]
            if subprocess.run(command, capture_output=True).returncode == 0:
                os.replace(built, target)
                return True
    return False


@functools.cache
def library(name: str, portable: bool = False) -> Optional[ctypes.CDLL]:
    """The compiled kernel `name` (HERE / f"{name}.c", with the headers beside it named
    f"{name}_*.h") with its functions typed, or None when it cannot be built or loaded here (no
    compiler, a read-only or full cache, a CPU it needs instructions from, MUSEGEN_NATIVE=0).
    `portable`: built with -DMUSEGEN_PORTABLE, its plain-C version where it has one."""
    if not enabled():
        return None
    source = HERE / f"{name}.c"
    defines = ["-DMUSEGEN_PORTABLE"] if portable else []
    text = b"".join(p.read_bytes() for p in [source, *sorted(HERE.glob(f"{name}_*.h"))])
    key = hashlib.sha256(text + " ".join([_machine(), *defines]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}{'-portable' if portable else ''}-{key}.so"
    try:
        if not target.exists() and not _compile(source, target, defines):
            return None
        lib = ctypes.CDLL(str(target))
    except OSError:
        return None
    for function, (argtypes, restype) in SIGNATURES[name].items():
        getattr(lib, function).argtypes, getattr(lib, function).restype = argtypes, restype
    return lib
