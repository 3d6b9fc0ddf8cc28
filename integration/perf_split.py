#!/usr/bin/env python3
"""Where a benchmark row's epoch spent its CPU, from a `perf record --call-graph dwarf` file such as
`bench_remote.py --perf DIR` writes (one per row and round, epoch 1 only):

    .venv-peers/bin/python integration/bench_remote.py --rows bound,stoker-shards,stoker-shards-nocache --perf /tmp/perf
    python3 integration/perf_split.py /tmp/perf/*.data

Only the samples of threads named `stoker` count: Stoker's own threads in the row's process (its
runtime and blocking threads). The S3 server and the proxy (`tokio-rt-worker`) and the Python
consumer (`python`) are left out. Each sample goes to the first category its call chain matches,
in the order below (a page fault inside a write(2) counts as the write), so the categories add up
to the whole; CPU seconds are the samples' periods summed.
"""

from __future__ import annotations

import collections
import subprocess
import sys

CATEGORIES = [
    ("disk cache: write(2) into the page cache", ("ksys_write", "vfs_write")),
    ("disk cache: files created, renamed, removed", ("do_sys_openat2", "do_renameat2", "do_unlinkat", "do_mkdirat")),
    ("socket receive (the kernel's copy out of socket buffers)", ("tcp_recvmsg", "__sys_recvfrom", "sock_recvmsg")),
    ("socket send", ("__sys_sendto", "tcp_sendmsg", "__sys_sendmsg")),
    ("page faults (new memory touched first)", ("exc_page_fault",)),
    ("memory handed back (munmap, madvise)", ("__x64_sys_munmap", "__x64_sys_madvise")),
    ("block checksums (xxhash)", ("xxhash3",)),
    ("memcpy in user space (bodies joined, samples into batches)", ("__memmove_avx", "__memcpy_avx", "memcpy")),
    ("futex, scheduling, epoll", ("__x64_sys_futex", "schedule", "do_epoll_wait")),
    ("allocator (mimalloc)", ("_mi_", "mi_")),
]
KERNEL = ("do_syscall_64", "asm_", "irq")


def split(path: str) -> None:
    out = subprocess.run(
        ["perf", "script", "-i", path, "--comm", "stoker", "-F", "period,ip,sym"],
        capture_output=True, text=True, check=True,
    ).stdout
    totals: collections.Counter = collections.Counter()
    whole = 0
    for sample in out.split("\n\n"):
        lines = [line.strip() for line in sample.strip().splitlines() if line.strip()]
        if not lines or not lines[0].split()[0].isdigit():
            continue
        period = int(lines[0].split()[0])
        whole += period
        chain = " ".join(lines[1:])
        for name, marks in CATEGORIES:
            if any(m in chain for m in marks):
                totals[name] += period
                break
        else:
            totals["other kernel" if any(k in chain for k in KERNEL) else "other user space"] += period
    if whole == 0:
        print(f"{path}: no samples of Stoker's threads")
        return
    print(f"{path}: Stoker's threads {whole / 1e9:.2f} CPU-s")
    for name, ns in totals.most_common():
        print(f"  {ns / 1e9:6.2f} s {100 * ns / whole:5.1f}%  {name}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        split(p)
