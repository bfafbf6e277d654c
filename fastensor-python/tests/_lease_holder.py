"""A fresh process that loads one checkpoint through every API that returns mapped memory,
keeps the tensors, and checks them after another program acted on the file.

``python _lease_holder.py DIR [--seccomp-einval] [--drop-cap-lease] [--unprotected]
[--apis a,b,...] [--fork]``

DIR holds ``model.safetensors`` (a tiny GPT-2's weights and ``ones``, 16 MiB of float32
ones), its ``config.json``, and ``sharded/`` (an index whose one shard is a hard link to
``model.safetensors``). The process prints one JSON line (``ready``: the placement a load
gets, the lease counts) and waits for a line on its standard input; then it drops the
file's pages (``POSIX_FADV_DONTNEED`` on the file, ``MADV_PAGEOUT`` on every tensor's
memory, which also reclaims page-cache pages that are mapped) and prints one JSON line
(``checked``: the tensors whose values changed, the lease counts). A page the file took
away from a tensor ends the process with ``SIGBUS``.

With ``--fork`` the process forks once its tensors are loaded (as a preforking server or a
``DataLoader`` worker does); the child checks the tensors it inherited when the parent does
(its findings are the parent's ``child``: its exit status, the tensors that changed, its
lease counts).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import sys

os.environ.setdefault("FASTENSOR_PROFILE", "")

MADV_PAGEOUT = 21
PAGE = 4096


def refuse_leases_with_einval() -> None:
    """Makes every ``fcntl(fd, F_SETLEASE, ...)`` of this process fail with ``EINVAL`` (what
    a file system without leases answers), through a seccomp filter; nothing else changes."""
    import struct

    if platform.machine() != "x86_64":
        raise SystemExit("seccomp filter written for x86_64 only")
    audit_arch_x86_64, nr_fcntl, f_setlease = 0xC000003E, 72, 1024
    errno_einval = 0x00050000 | 22  # SECCOMP_RET_ERRNO | EINVAL
    allow = 0x7FFF0000
    ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06

    def op(code, jt, jf, k):
        return struct.pack("HBBI", code, jt, jf, k)

    prog = b"".join(
        [
            op(ld_w_abs, 0, 0, 4),  # arch
            op(jeq_k, 0, 5, audit_arch_x86_64),
            op(ld_w_abs, 0, 0, 0),  # syscall number
            op(jeq_k, 0, 3, nr_fcntl),
            op(ld_w_abs, 0, 0, 24),  # args[1], low 32 bits
            op(jeq_k, 0, 1, f_setlease),
            op(ret_k, 0, 0, errno_einval),
            op(ret_k, 0, 0, allow),
        ]
    )
    n = len(prog) // 8
    buf = ctypes.create_string_buffer(prog)
    fprog = struct.pack("HxxxxxxQ", n, ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.addressof(fbuf), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def drop_cap_lease() -> None:
    """Drops ``CAP_LEASE`` from this process's effective and permitted capabilities: it may
    then lease only files it owns."""
    import struct

    cap_lease = 28
    libc = ctypes.CDLL(None, use_errno=True)
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0))  # version 3
    data = ctypes.create_string_buffer(24)
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    fields = list(struct.unpack("6I", data.raw))
    fields[0] &= ~(1 << cap_lease)  # effective
    fields[1] &= ~(1 << cap_lease)  # permitted
    data = ctypes.create_string_buffer(struct.pack("6I", *fields))
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def page_out(regions) -> None:
    """``MADV_PAGEOUT`` over each ``(address, length)``: the kernel reclaims the pages it
    can (clean file pages, mapped or not; anonymous pages only where there is swap)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for addr, length in regions:
        if length == 0:
            continue
        start = addr // PAGE * PAGE
        end = (addr + length + PAGE - 1) // PAGE * PAGE
        libc.madvise(start, end - start, MADV_PAGEOUT)


def main() -> None:
    args = sys.argv[1:]
    directory = args[0]
    if "--seccomp-einval" in args:
        refuse_leases_with_einval()
    if "--drop-cap-lease" in args:
        drop_cap_lease()
    apis = "file,selected,sharded,numpy,pretrained,later"
    if "--apis" in args:
        apis = args[args.index("--apis") + 1]
    apis = apis.split(",")

    import fastensor
    import fastensor.numpy as fnp
    import fastensor.torch as ft
    import torch
    from fastensor import _engine, _host_load, _native

    engine = fastensor.Engine(unprotected_maps="--unprotected" in args)
    native = _engine.engine_or_default(engine)
    path = os.path.join(directory, "model.safetensors")
    loaded: dict[str, dict] = {}
    pending = None
    if "file" in apis:
        loaded["file"] = ft.load_file(path, engine=engine)
    if "selected" in apis:
        loaded["selected"] = ft.load_selected(path, ["ones", "lm_head.weight"], engine=engine)
    if "sharded" in apis:
        index = os.path.join(directory, "sharded", "model.safetensors.index.json")
        loaded["sharded"] = ft.load_sharded(index, engine=engine)
    if "numpy" in apis:
        loaded["numpy"] = fnp.load_file(path, engine=engine)
    if "pretrained" in apis:
        import fastensor.transformers as ftr
        from transformers import GPT2LMHeadModel

        model = ftr.from_pretrained(GPT2LMHeadModel, directory, engine=engine)
        loaded["pretrained"] = dict(model.named_parameters())
    if "later" in apis:
        evict(path)  # its pages come in after the load returned
        loaded["later"], pending = _host_load.load_host_later(native, path)

    def as_torch(v):
        return v if isinstance(v, torch.Tensor) else torch.from_numpy(v)

    reference = {
        api: {k: as_torch(v).detach().clone() for k, v in tensors.items()}
        for api, tensors in loaded.items()
    }
    _, _, placement = native.load_new(path, ["ones"])

    def check() -> list[str]:
        regions = []
        for tensors in loaded.values():
            for v in tensors.values():
                t = as_torch(v)
                regions.append((t.data_ptr(), t.numel() * t.element_size()))
        if os.path.exists(path):
            evict(path)
        page_out(regions)
        return [
            f"{api}:{k}"
            for api, tensors in loaded.items()
            for k, v in tensors.items()
            if not torch.equal(as_torch(v).detach(), reference[api][k])
        ]

    child = None
    if "--fork" in args:
        if pending is not None:
            pending.wait()
            pending = None
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: checks when told to, reports through the pipe
            os.close(go_w)
            os.close(out_r)
            # The parent's OpenMP threads do not exist here (as in a DataLoader worker).
            torch.set_num_threads(1)
            os.read(go_r, 1)
            found = {"changed": check(), "stats": _native.lease_stats()}
            os.write(out_w, json.dumps(found).encode())
            os._exit(0)
        os.close(go_r)
        os.close(out_w)
        child = (pid, go_w, out_r)
    print(
        json.dumps({"ready": True, "placement": placement, "stats": _native.lease_stats()}),
        flush=True,
    )
    sys.stdin.readline()

    if pending is not None:
        pending.wait()
    found_in_child = None
    if child is not None:
        pid, go_w, out_r = child
        os.write(go_w, b"x")
        chunks = []
        while chunk := os.read(out_r, 1 << 16):
            chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
        report = json.loads(b"".join(chunks)) if chunks else {}
        found_in_child = {"status": os.waitstatus_to_exitcode(status), **report}
    changed = check()
    print(
        json.dumps(
            {
                "checked": True,
                "changed": changed,
                "stats": _native.lease_stats(),
                "child": found_in_child,
            }
        )
    )


if __name__ == "__main__":
    main()
