"""The KV allocators' free list: any interleaving of allocations and frees keeps availability
exact, never hands out a slot twice (or the dummy slot 0), and frees without copying the list."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

SIZE = 96


def check(allocator, held: list[torch.Tensor]) -> None:
    slots = torch.cat(held).tolist() if held else []
    assert len(set(slots)) == len(slots), "a slot was handed out twice"
    assert all(1 <= s < SIZE + allocator.page_size for s in slots)
    page = allocator.page_size
    held_pages = {s // page for s in slots}
    assert allocator.available_size() == SIZE - len(held_pages) * page


# Each op: ("alloc", n) or ("free", k), k picking one held chunk.
OPS = st.lists(st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 40)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_token_allocator_interleavings(ops):
    allocator = TokenToKVPoolAllocator(SIZE, "cpu")
    held: list[torch.Tensor] = []
    for op, n in ops:
        if op == "alloc":
            before = allocator.available_size()
            got = allocator.alloc(n)
            if n > before:
                assert got is None and allocator.available_size() == before
            else:
                assert got is not None and len(got) == n
                held.append(got)
        elif held:
            allocator.free(held.pop(n % len(held)))
        check(allocator, held)
    for chunk in held:
        allocator.free(chunk)
    assert allocator.available_size() == SIZE
    assert sorted(allocator.alloc(SIZE).tolist()) == list(range(1, SIZE + 1))


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_paged_allocator_interleavings_with_growing_requests(ops):
    """Requests grow token by token (alloc_extend / alloc_decode fill the last page first)."""
    page = 8
    allocator = PagedTokenToKVPoolAllocator(SIZE, page, "cpu")
    reqs: list[list[int]] = []  # each request's slots, in order
    for op, n in ops:
        if op == "alloc":
            # A new request of n tokens, or (n odd) one more decode token for an existing one.
            if n % 2 and reqs:
                slots = reqs[n % len(reqs)]
                new = allocator.alloc_decode([len(slots) + 1], [slots[-1]])
                if new is not None:
                    slots += new.tolist()
            elif n:
                new = allocator.alloc_extend([0], [n], [-1])
                if new is not None:
                    assert len(new) == n
                    reqs.append(new.tolist())
        elif reqs:
            allocator.free(torch.tensor(reqs.pop(n % len(reqs))))
        for slots in reqs:  # a request's slots are runs inside its own pages
            assert all(b == a + 1 for a, b in zip(slots, slots[1:]) if b % page)
        check(allocator, [torch.tensor(s) for s in reqs])
    for slots in reqs:
        allocator.free(torch.tensor(slots))
    assert allocator.available_size() == SIZE


def test_freeing_keeps_a_copy_not_a_view():
    """Callers free views of req_to_token rows, which are overwritten afterwards."""
    allocator = TokenToKVPoolAllocator(SIZE, "cpu")
    row = allocator.alloc(4).clone()
    allocator.free(row[:4])
    row[:] = 0  # the row is reused for another request
    assert sorted(allocator.alloc(SIZE).tolist()) == list(range(1, SIZE + 1))
