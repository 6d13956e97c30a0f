#!/usr/bin/env python3
"""CPU model of the f16-tile attention path (TANDEM_ATTN_KV16, attention_kv16.cu).

1. Layouts: the shared K slab and Vt slab bytes the wgmma kernel builds today (StageK/ConvertK,
   StageV/ConvertV of attention_tc_wgmma.cu, zero fill from the item's valid keys) against the
   bytes the new path puts there (KvTilesF16Kernel's images, zero fill from the sequence's last
   position, then CopyTile's cp.async with src-size from the item's valid keys): must be equal.
2. Work split: KvTilesF16Kernel's units (chunks of 256 items, block scan, grid stride) cover every
   (sequence, key tile <= last position / 64, kv head, K or V) exactly once, for random batches
   (more than 256 items included) and grid sizes.
3. Schedule of the overlapped kernel (TANDEM_ATTN_KV16=2, WgmmaKv16OverlapAttentionKernel): per
   block barrier epoch, the slabs the wgmmas read hold the right tile, written and waited in an
   earlier epoch, and no copy of the epoch writes a slab a wgmma of the epoch reads; every S(t) and
   O += P·V(t) runs once, in tile order; for blocks of 1 .. 9 tiles.
No GPU, no numpy. Run: python3 scripts/check_attn_kv16_model.py
"""
import math
import random
import struct
def swz(row, chunk): return row*128 + ((chunk ^ (row & 7)) << 4)


def f16bytes(x):
    try: return struct.pack('<e', x)
    except OverflowError: return struct.pack('<e', math.copysign(math.inf, x))
random.seed(1)
def old_images(tile, valid):  # tile: 64 x 256 f32
    st = [row if j < valid else [0.0]*256 for j, row in enumerate(tile)]
    K = bytearray(32768); V = bytearray(32768)
    for tid in range(256):  # ConvertK
        c, j0 = tid & 63, tid >> 6
        for i in range(16):
            j = j0 + 4*i
            at = (c >> 4)*8192 + swz(j, (c & 15) >> 1) + ((c & 1) << 3)
            K[at:at+8] = b''.join(f16bytes(v) for v in st[j][4*c:4*c+4])
    for tid in range(256):  # ConvertV
        c = (tid & 1) | ((tid >> 3) << 1); b0 = (tid >> 1) & 3
        for o in range(2):
            b = b0 + 4*o
            for dd in range(4):
                at = swz(4*c+dd, b)
                V[at:at+16] = b''.join(f16bytes(st[8*b+k][4*c+dd]) for k in range(8))
    return bytes(K), bytes(V)
def conv_images(tile, valid):  # KvTilesF16Kernel
    K = bytearray(b'\xff'*32768); V = bytearray(b'\xff'*32768)
    for tid in range(256):
        qd, j0 = tid & 31, tid >> 5
        for i in range(8):
            j = j0 + 8*i
            x = tile[j][8*qd:8*qd+8] if j < valid else [0.0]*8
            at = (qd >> 3)*8192 + swz(j, qd & 7)
            K[at:at+16] = b''.join(f16bytes(v) for v in x)
    for tid in range(256):
        lane, warp = tid & 31, tid >> 5; b, cq = lane & 7, lane >> 3
        for h in range(2):
            c = 4*(warp + 8*h) + cq
            for dd in range(4):
                at = swz(4*c+dd, b)
                V[at:at+16] = b''.join(f16bytes(tile[8*b+k][4*c+dd] if 8*b+k < valid else 0.0) for k in range(8))
    return bytes(K), bytes(V)
def copy_tile(Kimg, Vimg, valid):  # CopyTile
    K = bytearray(b'\xee'*32768); V = bytearray(b'\xee'*32768); seen = set()
    octs = {}
    for tid in range(256):
        octet = (tid & 7) ^ ((tid >> 3) & 7)
        vb = 2*max(0, min(8, valid - 8*octet))
        for i in range(8):
            L = tid + 256*i; at = 16*L; assert L not in seen; seen.add(L)
            key = (tid >> 3) + 32*(i & 1)
            assert key == (L % 512)//8
            nb = 16 if key < valid else 0
            K[at:at+16] = Kimg[at:at+nb] + b'\0'*(16-nb)
            # check octet mapping: chunk L of Vt: row d = L//8, physical chunk L%8 = octet ^ (d&7)
            d = L // 8; assert (L % 8) == (octet ^ (d & 7))
            V[at:at+16] = Vimg[at:at+vb] + b'\0'*(16-vb)
    assert len(seen) == 2048
    return bytes(K), bytes(V)
for trial in range(12):
    f32 = lambda v: struct.unpack('<f', struct.pack('<f', v))[0]
    tile = [[f32(random.gauss(0, 3)) for _ in range(256)] for _ in range(64)]
    tile[random.randrange(64)][random.randrange(256)] = 1e5  # f16 overflow -> inf, same both ways
    item_valid = random.choice([1, 7, 8, 9, 33, 63, 64, random.randint(1, 64)])
    seq_valid = random.randint(item_valid, 64)
    ok, ov = old_images(tile, item_valid)
    ck, cv = conv_images(tile, seq_valid)
    nk, nv = copy_tile(ck, cv, item_valid)

    assert ok == nk and ov == nv
print("layouts OK")
def plan(seqs, per):  # seqs: list of (start, n); returns items (first, count), token_seq, token_pos
    items=[]; ts=[]; tp=[]
    for s,(start,n) in enumerate(seqs):
        base=len(ts)
        for t in range(n): ts.append(s); tp.append(start+t)
        for f in range(0,n,per): items.append((base+f, min(per,n-f)))
    return items, ts, tp
def simulate(items, ts, tp, kvh, grid):
    done_units={}
    T=256; num=len(items)
    for bx in range(grid):
        done=0
        for chunk in range(0,num,T):
            units=[]
            for tid in range(T):
                i=chunk+tid; u=0
                if i<num:
                    first,count=items[i]
                    if i+1==num or ts[items[i+1][0]]!=ts[first]:
                        u=(tp[first+count-1]//64+1)*kvh*2
                units.append(u)
            ends=[]; acc=0
            for u in units: acc+=u; ends.append(acc)
            total=acc
            u=(bx - done%grid + grid)%grid
            while u<total:
                lo,hi=0,T-1
                while lo<hi:
                    mid=(lo+hi)>>1
                    if ends[mid]>u: hi=mid
                    else: lo=mid+1
                rel=u-(ends[lo-1] if lo>0 else 0)
                part=rel&1; kvhead=(rel>>1)%kvh; kt=(rel>>1)//kvh
                item=chunk+lo; first,count=items[item]
                key=(ts[first],kt,kvhead,part)
                done_units[key]=done_units.get(key,0)+1
                u+=grid
            done=(done+total%grid)%grid
    return done_units
many = False
for trial in range(30):
    nseq=random.randint(1,6); per=random.choice([16,32,128])
    seqs=[(random.randint(0,3000), random.randint(64,1500 if trial%3 else 5000)) for _ in range(nseq)]
    items,ts,tp=plan(seqs,per); kvh=random.choice([1,2,4]); grid=random.choice([1,7,264,1000])
    got=simulate(items,ts,tp,kvh,grid)
    want={(s,kt,h,p):1 for s,(st,n) in enumerate(seqs) for kt in range((st+n-1)//64+1) for h in range(kvh) for p in range(2)}
    assert got==want, (trial, len(got), len(want))
    many = many or len(items) > 256
assert many, "no batch with more than 256 items"
print("work split OK")


# 3. The overlapped kernel's slab schedule. An epoch runs from one block barrier to the next; a
# wgmma issued in an epoch is waited in it (every step ends with wgmma wait 0), a cp.async group
# issued in an epoch is waited before the barrier that ends it (wait_group 0 at the next step's
# top; the prologue's group 1 = K(b) is waited before the prologue barrier, group 2 before step b's).
def overlap_schedule(b, e):
    slab = lambda t: (t - b) & 1
    held = {}  # ('K'|'V', slab) -> tile, as visible to wgmmas (writes of finished epochs)
    epochs = []  # (reads, writes): reads [(kind, slab, tile, op)], writes [(kind, slab, tile)]
    # prologue epoch 0: writes K(b) (waited in it); epoch 1 (after the prologue barrier): S(b)
    epochs.append(([], [('K', slab(b), b)], True))
    w = [('V', slab(b), b)] + ([('K', slab(b + 1), b + 1)] if b + 1 < e else [])
    epochs.append(([('K', slab(b), b, ('S', b))], w, False))
    for t in range(b, e):  # step t: after its barrier
        reads = [('V', slab(t), t, ('PV', t))]
        if t + 1 < e: reads.append(('K', slab(t + 1), t + 1, ('S', t + 1)))
        writes = ([('V', slab(t + 1), t + 1)] if t + 1 < e else []) + ([('K', slab(t + 2), t + 2)] if t + 2 < e else [])
        epochs.append((reads, writes, False))
    ops = []
    for i, (reads, writes, same_epoch_visible) in enumerate(epochs):
        if same_epoch_visible:  # epoch 0: K(b) is waited and fenced before the barrier, read after it
            for k, sl, tile in writes: held[(k, sl)] = tile
            continue
        read_slabs = {(k, sl) for k, sl, _, _ in reads}
        for k, sl, tile in writes:
            assert (k, sl) not in read_slabs, (b, e, i, k, sl)  # no copy into a slab a wgmma reads
        for k, sl, tile, op in reads:
            assert held.get((k, sl)) == tile, (b, e, i, k, sl, tile, held)
            ops.append(op)
        for k, sl, tile in writes: held[(k, sl)] = tile  # landed and visible from the next epoch on
    s_ops = [t for k, t in ops if k == 'S']; pv_ops = [t for k, t in ops if k == 'PV']
    assert s_ops == list(range(b, e)) and pv_ops == list(range(b, e)), (b, e, ops)
    for t in range(b, e):  # S(t) completes in an earlier epoch than O += P·V(t) (the softmax between)
        assert ops.index(('S', t)) < ops.index(('PV', t))


for b in range(0, 4):
    for n in range(1, 10):
        overlap_schedule(b, b + n)
print("overlap schedule OK")
