"""RadixCache: share the KV of common prefixes across requests.

Mirrors python/sglang/srt/mem_cache/radix_cache.py (TreeNode, RadixCache with
match_prefix, insert, cache_finished_req, cache_unfinished_req, evict,
inc_lock_ref / dec_lock_ref). A radix tree over token ids whose nodes hold the
KV slots of their tokens. A request that starts with a cached prefix reads
those slots instead of recomputing them. Nodes in use by a running request are
locked; unlocked leaves are evicted least-recently-used first when the
allocator runs short. With page_size > 1 the tree holds whole pages only.
SGLang also supports other eviction policies, hierarchical (host) caching,
LoRA/extra keys and event reporting; omitted.

Ownership of a request's slots, the invariant everything here keeps:
``req_to_token[req, :len(req.prefix_indices)]`` belongs to the tree (locked
through ``req.last_node``); ``req_to_token[req, len(req.prefix_indices):kv_len]``
belongs to the request until it is inserted or freed.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Optional

import torch

from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
from minisgl.mem_cache.memory_pool import ReqToTokenPool

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import Req

_clock = itertools.count()  # a logical clock: LRU order without wall-clock time


class TreeNode:
    def __init__(self, key: tuple[int, ...] = (), value: Optional[torch.Tensor] = None, parent=None) -> None:
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent: Optional[TreeNode] = parent
        self.key = key  # token ids on the edge into this node
        self.value = value  # their KV slots
        self.lock_ref = 0
        self.last_access_time = next(_clock)

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access_time < other.last_access_time


class RadixCache:
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator,
        page_size: int,
        disable: bool = False,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = disable
        self.device = token_to_kv_pool_allocator.device
        self.reset()

    def reset(self) -> None:
        self.root_node = TreeNode()
        self.root_node.lock_ref = 1  # the root is never evicted
        self.evictable_size_ = 0
        self.protected_size_ = 0

    # ---- lookups ---------------------------------------------------------------------------

    def _child_key(self, key: tuple[int, ...]) -> tuple[int, ...]:
        return key[: self.page_size]

    def _match_len(self, a: tuple[int, ...], b: tuple[int, ...]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n // self.page_size * self.page_size

    def match_prefix(self, key: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """The KV slots of the longest cached (page-aligned) prefix of key, and its last node."""
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        if self.disable:
            return empty, self.root_node
        key = tuple(key[: len(key) // self.page_size * self.page_size])
        node, values = self.root_node, []
        while key and self._child_key(key) in node.children:
            child = node.children[self._child_key(key)]
            child.last_access_time = next(_clock)
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            values.append(child.value)
            node, key = child, key[n:]
        return (torch.cat(values) if values else empty), node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut child's edge after split_len tokens; return the new upper node."""
        upper = TreeNode(child.key[:split_len], child.value[:split_len], child.parent)
        upper.lock_ref = child.lock_ref
        upper.children = {self._child_key(child.key[split_len:]): child}
        child.parent.children[self._child_key(child.key)] = upper
        child.parent, child.key, child.value = upper, child.key[split_len:], child.value[split_len:]
        return upper

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Add key -> value; return how many leading tokens were already cached (their
        slots in `value` are duplicates the caller must free)."""
        key = tuple(key)
        node, matched = self.root_node, 0
        while key:
            ck = self._child_key(key)
            if ck not in node.children:
                new = TreeNode(key, value.clone(), node)
                node.children[ck] = new
                self.evictable_size_ += len(key)
                return matched
            child = node.children[ck]
            child.last_access_time = next(_clock)
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            node, key, value, matched = child, key[n:], value[n:], matched + n
        return matched

    # ---- requests ----------------------------------------------------------------------------

    def _aligned(self, n: int) -> int:
        return n // self.page_size * self.page_size

    def cache_finished_req(self, req: "Req") -> None:
        """A request is done (or retracted): its computed KV goes to the tree, the rest is freed."""
        kv = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].to(torch.int64)
        allocator = self.token_to_kv_pool_allocator
        if self.disable:
            allocator.free(kv)
        else:
            token_ids = (req.origin_input_ids + req.output_ids)[: req.kv_len]
            aligned = self._aligned(req.kv_len)
            new_prefix_len = self.insert(token_ids[:aligned], kv[:aligned])
            allocator.free(kv[len(req.prefix_indices) : new_prefix_len])  # computed twice: keep the tree's copy
            allocator.free(kv[aligned:])  # a partial last page is not cached
            self.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.prefix_indices = torch.empty(0, dtype=torch.int64)
        req.last_node = None

    def cache_unfinished_req(self, req: "Req") -> None:
        """After a prefill: publish the request's prompt KV so later requests can share it now."""
        if self.disable:
            return
        token_ids = req.fill_ids[: req.kv_len]
        aligned = self._aligned(len(token_ids))
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        kv = row[:aligned].to(torch.int64)
        old_len = len(req.prefix_indices)
        new_prefix_len = self.insert(token_ids[:aligned], kv)
        self.token_to_kv_pool_allocator.free(kv[old_len:new_prefix_len])
        new_indices, new_last_node = self.match_prefix(token_ids[:aligned])
        row[old_len : len(new_indices)] = new_indices[old_len:].to(row.dtype)
        self.inc_lock_ref(new_last_node)
        self.dec_lock_ref(req.last_node)
        req.prefix_indices, req.last_node = new_indices, new_last_node

    # ---- locking and eviction ----------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: Optional[TreeNode]) -> None:
        while node is not None and node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens slots from unlocked leaves, least recently used first."""
        leaves = [n for n in self._all_nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            node = heapq.heappop(leaves)
            self.token_to_kv_pool_allocator.free(node.value)
            freed += len(node.key)
            self.evictable_size_ -= len(node.key)
            parent = node.parent
            del parent.children[self._child_key(node.key)]
            if parent is not self.root_node and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
        return freed

    def _all_nodes(self) -> list[TreeNode]:
        nodes, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes[1:]

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        return sum(len(n.key) for n in self._all_nodes())

    def flush(self) -> bool:
        """Drop the whole cache; only when no request holds a lock (SGLang's flush_cache)."""
        if self.protected_size_ > 0:
            return False
        for node in self._all_nodes():
            self.token_to_kv_pool_allocator.free(node.value)
        self.reset()
        return True
