"""Put a CPU model's weights on 2 MiB pages (transparent huge pages), where the OS allows it.

minisgl's own; SGLang has no counterpart (on a GPU, pages are the driver's business). A decode
step at a small batch streams every weight once, and with 4 KiB pages that is a TLB miss, a
walk of the page tables, every 4 KiB: 131,000 per float32 step of SmolLM2-135M. On 2 MiB pages
there are 512 times fewer. llama.cpp gets some of this from the kernel without asking: it maps
the GGUF file, and the page cache can hold parts of a file in 2 MiB folios (80 of the 527 MB of
the float32 file, mapped and read on one machine). Weights that torch allocated are anonymous
memory, which the common THP setting ("madvise") backs with huge pages only where a program
asks, with madvise(MADV_HUGEPAGE).

So after loading, every large weight is copied into one arena that asked, and each tensor is
re-pointed at its copy in place (``Tensor.set_``), so every module, list and view that holds
the tensor sees the new memory. One arena rather than one mapping per weight: only whole 2 MiB
pages inside a mapping can be huge, and most of SmolLM2's 121 weights are 0.6 to 7 MiB.
Where the kernel has THP off, or the platform has no madvise, the arena is plain memory and
nothing else changes.
"""

from __future__ import annotations

import mmap

import torch
from torch import nn

from minisgl.malloc_trim import malloc_trim

HUGE_PAGE = 2 << 20
# Norm weights and biases are a few KiB; only what a step streams in bulk is worth moving.
MIN_BYTES = 64 << 10
ALIGN = 64  # c10's CPU allocator aligns to 64 bytes; the kernels' vector loads assume no more
TRIM_EVERY = 32 << 20


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """Parameters, buffers and plain tensor attributes (a packed weight is one), in lists too, and their bases."""
    found = []
    for m in module.modules():
        found += [*m.parameters(recurse=False), *m.buffers(recurse=False)]
        for v in vars(m).values():
            found += [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    # A view keeps its base alive, and with it the old memory, unless the base moves too (a packed
    # 2-D weight is a squeezed view of the 3-D stack the kernel packs).
    return found + [t._base for t in found if t._base is not None]


def _arena(nbytes: int) -> tuple[mmap.mmap, int]:
    """nbytes of private anonymous memory advised for huge pages, and the offset in it of the first
    2 MiB boundary, where the arena starts."""
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:  # before the first write: faults then take whole 2 MiB pages
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):  # no madvise here, or a kernel built without THP (EINVAL)
        pass
    return mapping, -torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr() % HUGE_PAGE


def move_to_huge_pages(module: nn.Module) -> int:
    """Move the module's large CPU weights into one huge-page arena; returns the bytes moved."""
    by_storage: dict[int, list[torch.Tensor]] = {}
    for t in _tensors(module):
        # A oneDNN-blocked weight has no storage to re-point; GPU memory is not the OS's.
        if t.is_cpu and not t.is_mkldnn and t.untyped_storage().nbytes() >= MIN_BYTES:
            by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    if not by_storage:
        return 0
    offsets, total = {}, 0
    for key, ts in by_storage.items():
        offsets[key] = total
        total += -(-ts[0].untyped_storage().nbytes() // ALIGN) * ALIGN
    mapping, start = _arena(total)
    freed = 0
    with torch.no_grad():
        for key in list(by_storage):
            ts = by_storage.pop(key)
            old = ts[0].untyped_storage()
            # Each weight keeps a storage of its own, now over its part of the arena (frombuffer's
            # holds the mapping alive), so whatever tells tensors apart by storage (the CPU graph
            # runner's check of its inputs) sees what it saw before.
            new = torch.frombuffer(mapping, dtype=torch.uint8, count=old.nbytes(), offset=start + offsets[key])
            new.copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            for t in {id(t): t for t in ts}.values():
                t.set_(new.untyped_storage(), t.storage_offset(), t.shape, t.stride())
            freed += old.nbytes()
            del old, ts  # the last references: the old memory goes back to the allocator
            if freed >= TRIM_EVERY:
                # glibc keeps freed heap memory for reuse; handing it back as we go keeps the
                # process's peak near one copy of the weights rather than two.
                malloc_trim()
                freed = 0
    malloc_trim()
    return total


def smaps_rollup_bytes(field: str) -> int:
    """One field of /proc/self/smaps_rollup ("Rss", "AnonHugePages"), in bytes. It walks the page
    tables; /proc/self/status's VmRSS lags behind huge-page faults (it once showed 105 MB too many)."""
    line = next(ln for ln in open("/proc/self/smaps_rollup") if ln.startswith(field + ":"))
    return int(line.split()[1]) << 10
