#!/usr/bin/env python3
"""L2 model of the streamed Q4_K expert prefill kernel's work order (moe/expert_prefill_stream.cuh).

Not a test: a CPU model used to choose the order in which the persistent blocks take their units
(moe/PERF_NOTES.md, "work order" section). It simulates 264 persistent blocks (2 per SM on 132 SMs)
walking the units of one gate/up or down launch on the 80B shapes (h 2048, I 512, E 512, top-10,
uniform random routing, tiles of <= 64 rows), feeds every operand access, in time order, into an
LRU cache of the given size, and counts the bytes that miss (= read from HBM).

Objects: a weight piece is (expert, 128-row column block, k-stage), 128 rows x 72 bytes (half a
Q4_K super-block row on average; the kernel copies the 16-byte head twice but that hits); an
activation piece is 1 KB of a gathered x row (gate/up, 4 k-stages of 256 B) or a whole 1 KB act row
(down). Time: a block's stage takes speed x (1 + 0.15 x m16 fragments) (the notes measured an
about flat time per stage); speed is per SM, uniform in [1 - spread, 1 + spread]; optionally
`late` of the blocks start late (a side-stream kernel holding their SM).

Orders (unit index u = tile * C + col today, C = 128-row column blocks per expert):
  ranges   today's: block b takes units [U*b/G, U*(b+1)/G) in index order
  strided  block b takes units b, b + G, b + 2G, ... (same index order)
  dynamic  block b takes unit b first, then G + a global counter's next value, taken when it
           starts the unit before (the kernel's rule)
Index orders: 'tc' (tile, col) = today's; 'wct4' = (window of 4 tiles, col, tile in window).
"""
import argparse
import heapq
import random
from collections import OrderedDict

E, TOPK, H, I = 512, 10, 2048, 512
SMS, PER_SM = 132, 2
G = SMS * PER_SM


def make_tiles(n, rng, tile_rows=64):
    counts = [0] * E
    slot_tokens = [[] for _ in range(E)]
    for t in range(n):
        for e in rng.sample(range(E), TOPK):
            counts[e] += 1
            slot_tokens[e].append(t)
    tiles = []  # (expert, first_slot, rows, tokens)
    slot = 0
    for e in range(E):
        r = counts[e]
        for k in range(0, r, tile_rows):
            rows = min(tile_rows, r - k)
            tiles.append((e, slot + k, rows, slot_tokens[e][k:k + rows]))
        slot += r
    return tiles


def unit_order(num_tiles, C, index_order):
    """The list of (tile, col) in work-index order."""
    if index_order == 'tc':
        return [(t, c) for t in range(num_tiles) for c in range(C)]
    assert index_order.startswith('wct')
    W = int(index_order[3:])
    out = []
    for w0 in range(0, num_tiles, W):
        w1 = min(num_tiles, w0 + W)
        out += [(t, c) for c in range(C) for t in range(w0, w1)]
    return out


class Lru:
    def __init__(self, cap):
        self.cap, self.d, self.used = cap, OrderedDict(), 0
        self.miss = {'w': 0, 'a': 0}
        self.req = {'w': 0, 'a': 0}

    def touch(self, key, size, kind):
        self.req[kind] += size
        d = self.d
        if key in d:
            d.move_to_end(key)
            return
        self.miss[kind] += size
        d[key] = size
        self.used += size
        while self.used > self.cap:
            _, s = d.popitem(last=False)
            self.used -= s


def simulate(tiles, kind, assign, index_order, cap_mb, spread, late, seed):
    rng = random.Random(seed)
    gate_up = kind == 'gateup'
    C = (2 * I if gate_up else H) // 128
    ksteps = (H if gate_up else I) // 128
    wpiece = 128 * 72
    order = unit_order(len(tiles), C, index_order)
    U = len(order)
    speed = [1 + rng.uniform(-spread, spread) for _ in range(SMS)]
    lru = Lru(cap_mb * 1e6)
    start = [0.0] * G
    for b in rng.sample(range(G), int(late * G)):
        start[b] = 0.2 * U / G * ksteps * 1.5  # a fifth of the launch
    if assign == 'ranges':
        lists = [list(range(U * b // G, U * (b + 1) // G)) for b in range(G)]
    elif assign == 'strided':
        lists = [list(range(b, U, G)) for b in range(G)]
    counter = 0
    pos = [0] * G
    cur = [-1] * G
    heap = []
    reserved = [None] * G
    def next_unit(b):
        nonlocal counter
        if assign == 'dynamic':
            # The kernel's rule: block b's first unit is b; when unit n starts, the block takes
            # unit n + 1 = G + counter++ (held until unit n ends).
            u = b if reserved[b] is None else reserved[b]
            reserved[b] = G + counter
            counter += 1
            return u if u < U else -1
        if pos[b] >= len(lists[b]):
            return -1
        pos[b] += 1
        return lists[b][pos[b] - 1]
    for b in range(G):
        # blocks are placed on SMs round-robin: b and b + 132 share an SM
        heapq.heappush(heap, (start[b], b, 0))
    end = 0.0
    while heap:
        t, b, ks = heapq.heappop(heap)
        if ks == 0:
            cur[b] = next_unit(b)
            if cur[b] < 0:
                end = max(end, t)
                continue
        tile, col = order[cur[b]]
        e, first, rows, toks = tiles[tile]
        lru.touch(('w', e, col, ks), wpiece, 'w')
        if gate_up:
            if ks % 4 == 0:
                for tok in toks:
                    lru.touch(('x', tok, ks // 4), 1024, 'a')
        elif ks == 0:
            for r in range(rows):
                lru.touch(('act', first + r), 1024, 'a')
        frags = (rows + 15) // 16
        dt = speed[b % SMS] * (1 + 0.15 * frags)
        heapq.heappush(heap, (t + dt, b, (ks + 1) % ksteps))
    return lru, end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--tokens', type=int, nargs='+', default=[2048, 8192])
    ap.add_argument('--l2', type=float, nargs='+', default=[50.0])
    ap.add_argument('--spread', type=float, default=0.1)
    ap.add_argument('--late', type=float, default=0.0)
    ap.add_argument('--orders', nargs='+',
                    default=['ranges/tc', 'strided/tc', 'dynamic/tc', 'strided/wct4', 'dynamic/wct4'])
    args = ap.parse_args()
    for n in args.tokens:
        tiles = make_tiles(n, random.Random(12345))
        wbytes = {'gateup': 2 * I * H // 256 * 144, 'down': H * I // 256 * 144}
        experts = len({t[0] for t in tiles})
        print(f'n={n}: {len(tiles)} tiles, {experts} experts; weights once: '
              f'gate/up {experts * wbytes["gateup"] / 1e6:.0f} MB, down {experts * wbytes["down"] / 1e6:.0f} MB')
        for cap in args.l2:
            for kind in ('gateup', 'down'):
                for o in args.orders:
                    assign, index_order = o.split('/')
                    lru, end = simulate(tiles, kind, assign, index_order, cap, args.spread, args.late, 7)
                    once = experts * wbytes[kind] / 1e6
                    print(f'  L2 {cap:4.0f} MB {kind:6s} {o:13s}: HBM weights {lru.miss["w"] / 1e6:6.0f} MB '
                          f'({lru.miss["w"] / 1e6 / once:4.2f}x once), activations {lru.miss["a"] / 1e6:5.0f} MB '
                          f'(requested {lru.req["a"] / 1e6:5.0f}), total {(lru.miss["w"] + lru.miss["a"]) / 1e6:6.0f} MB; '
                          f'makespan {end:8.0f}')


if __name__ == '__main__':
    main()
