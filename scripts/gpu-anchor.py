"""The anchor of scripts/gpu-check.sh: a cold safetensors.torch.load_file(path, device="cuda")
of a file the size gds_bench moves, median GiB/s of REPEAT rounds and its ratio to the read
ceiling, min(disk, host-to-device copy), that gds_bench measured in the same run.

    python3 scripts/gpu-anchor.py DIR SIZE_MIB REPEAT CEILING_GIB_S

Prints one row of gpu-check's table, or says why the anchor was not measured (no torch, no
safetensors, no CUDA device); exits 1 only when the bytes loaded are wrong.
"""

import os
import statistics
import sys
import time

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "fastensor-python", "bench"
    ),
)
from _util import drop_file_cache  # (the benchmarks' helpers)

NAME = 'safetensors load_file(device="cuda")'


def main(argv):
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    folder, mib, repeat, ceiling = argv[1], int(argv[2]), max(1, int(argv[3])), argv[4]
    try:
        ceiling = float(ceiling)
    except ValueError:
        ceiling = float("nan")
    try:
        import torch
        from safetensors.torch import load_file, save_file
    except ImportError as e:
        print(f"{NAME:<38} not measured: {e}")
        return 0
    if not torch.cuda.is_available():
        print(f"{NAME:<38} not measured: torch sees no CUDA device")
        return 0
    # Eight tensors, as a state dict has several; uint8, so any size in MiB divides.
    size = mib << 20
    gen = torch.Generator().manual_seed(7)
    parts = [size // 8] * 7 + [size - 7 * (size // 8)]
    tensors = {
        f"t{i}": torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
        for i, n in enumerate(parts)
    }
    path = os.path.join(folder, "gpu-anchor.safetensors")
    save_file(tensors, path)
    rates = []
    try:
        for r in range(repeat):
            drop_file_cache([path])
            torch.cuda.synchronize()
            start = time.perf_counter()
            loaded = load_file(path, device="cuda")
            torch.cuda.synchronize()
            rates.append(size / (1 << 30) / (time.perf_counter() - start))
            if r == 0:
                for k, t in tensors.items():
                    if not torch.equal(loaded[k].cpu(), t):
                        print(f"{NAME}: tensor {k} differs from the bytes saved")
                        return 1
            del loaded
    finally:
        os.remove(path)
    rate = statistics.median(rates)
    print(f"{NAME:<38} {rate:>8.2f} GiB/s {rate / ceiling:>6.2f} x ceiling")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
