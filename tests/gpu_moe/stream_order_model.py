#!/usr/bin/env python3
"""CPU check of the unit bookkeeping of StreamedQ4KGemmKernel (moe/expert_prefill_stream.cuh) in its
three work orders (kRanges, kStrided, kDynamic): a line-by-line transliteration of the producer
(issue) and the consumer loop, one logical thread per block (the block's threads act alike), blocks
interleaved at random per main-loop iteration, a shared counter for kDynamic. Asserts that every
unit is computed exactly once with its k-stages in order, that compute(f)'s k-stage f % ksteps is
the one issued, that kDynamic never reads a next-unit slot before it is written, and that the
counter is back at 0 after the launch. Grid sizes above the unit count included (a device tile
count below the launch bound). Not a GPU test: the barrier argument is in the kernel's comments.
Run: python3 tests/gpu_moe/stream_order_model.py  (prints "ok N cases").
"""
# CPU transliteration of StreamedQ4KGemmKernel's producer/consumer unit bookkeeping (all threads of a
# block act alike, so one logical thread per block; blocks interleave at random per iteration).
import random
INT_MAX = 2**31 - 1

def run(units, G, ksteps, kStages, order, seed):
    rng = random.Random(seed)
    counter = [0, 0]
    done_units = {}
    blocks = []
    for b in range(G):
        st = dict(b=b, total=INT_MAX, u_begin=0, u_step=1, next_unit=[None, None], pending=None,
                  p_count=0, p_unit=None, p_ks=0, issued={}, f=0, phase='init')
        if order == 'strided':
            st['u_begin'], st['u_step'] = b, G
            st['total'] = ((units - 1 - b) // G + 1) * ksteps if units > b else 0
        elif order == 'ranges':
            st['u_begin'] = units * b // G
            st['total'] = (units * (b + 1) // G - st['u_begin']) * ksteps
        st['p_unit'] = st['u_begin']
        blocks.append(st)

    def issue(st, f):
        if f < st['total'] and st['p_ks'] == 0:
            if order == 'dynamic':
                if st['p_count'] == 0:
                    st['p_unit'] = st['b']
                else:
                    st['p_unit'] = st['next_unit'][st['p_count'] & 1]
                    assert st['p_unit'] is not None, 'read before write'
                    st['next_unit'][st['p_count'] & 1] = None  # consumed: a stale re-read would show
                if st['p_unit'] >= units:
                    st['total'] = f
                else:
                    st['pending'] = G + counter[0]; counter[0] += 1
            elif st['p_count'] > 0:
                st['p_unit'] += st['u_step']
            st['p_count'] += 1
        if f < st['total']:
            if order == 'dynamic' and st['p_ks'] == ksteps - 1:
                st['next_unit'][st['p_count'] & 1] = st['pending']
            st['issued'][f % kStages] = (st['p_unit'], st['p_ks'], f)
            st['p_ks'] += 1
            if st['p_ks'] == ksteps:
                st['p_ks'] = 0

    def compute(st, f):
        u, ks, ff = st['issued'][f % kStages]
        assert ff == f and ks == f % ksteps, (ff, f, ks)
        done_units.setdefault(u, []).append(ks)

    live = list(range(G))
    # init + prologue per block happen when the block first runs
    while live:
        b = rng.choice(live)
        st = blocks[b]
        if st['phase'] == 'init':
            for f in range(kStages - 1):
                issue(st, f)
            st['phase'] = 'loop'
            continue
        f = st['f']
        if f < st['total']:
            issue(st, f + kStages - 1)
            compute(st, f)
            st['f'] += 1
        else:
            if order == 'dynamic':
                counter[1] += 1
                if counter[1] == G:
                    counter[0] = counter[1] = 0
            live.remove(b)
    assert sorted(done_units) == list(range(units)), (order, units, G)
    for u, kss in done_units.items():
        assert kss == list(range(ksteps)), (u, kss)
    if order == 'dynamic':
        assert counter == [0, 0]

n = 0
for order in ('ranges', 'strided', 'dynamic'):
    for ksteps in (2, 4, 6, 16):
        for kStages in (4, 6):
            for units in (0, 1, 2, 5, 37, 264, 1000):
                for G in (1, 3, 264):
                    G2 = G
                    for seed in range(3):
                        run(units, G2, ksteps, kStages, order, seed); n += 1
print('ok', n, 'cases')
