#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_attention into tests/fuzz/corpus/ (run by hand; the
test runs the committed files, never this script). Each seed is one named case in the
byte format of decode() in fuzz_attention.cpp (seed-*, encode()) or, after the tag byte
0xc0, of decode() in fuzz_entries.cpp (seed-entry-*, encode_entry()); keep them in step.
Files named regression-* are inputs the fuzzer found and are not written here."""
import os
import sys

CAPS = [1e-38, 'FLT_MIN', 1e-3, 0.5, 1, 5, 20, 30, 50, 1e4, 1e30, 'FLT_MAX', 'inf', 'nan', -1, 0]
SCALES = [1, 0.125, 0.5, 2, -1, 1e-3, 1e-30, 1e-45, 1e30, 'FLT_MAX', 'inf', '-inf', 'nan', 0,
          '-0', 10]
HUGE_OFFSETS = ['2^62', '-2^62', '2^62+1', '-2^62-1', 'max', 'min', '2^40', '-2^40']
THREADS = [0, 1, 2, 3, 4, 1, 2, -1]
MAGS = [1, 1, 1, 1, 1, 1, 0.5, 2, 3, 0.1, 10, 30, 100, 1e4, 1e20, 3e38]
SPECIALS = ['nan', 'inf', '-inf', 65504, -1e30, 3e38, 0, 1e-40, 3.4e38]
HEADS = [(1, 1), (1, 2), (1, 3), (2, 2), (3, 3), (2, 4), (1, 4), (4, 4)]
DEFECTS = ['none', 'negative-size', 'zero-dim', 'heads-not-multiple', 'size-mismatch',
           'negative-stride', 'overlapping-output', 'broadcast-input', 'overlapping-input',
           'null-data', 'huge-size', 'huge-unit-stride', 'empty-batch', 'alias-output',
           'alias-lse', 'huge-threads', 'overflowing-layout', 'huge-dims-of-empty']
STORAGE = ['f32', 'bf16', 'f16']
LAYOUTS = ['bhsd', 'bshd', 'padded']


def at_least(base, residue, modulus):
    """The smallest byte >= base that is `residue` modulo `modulus`."""
    b = base + (residue - base) % modulus
    assert b < 256
    return b


def encode(storage='f32', out='f32', causal=False, softcap=None, B=1, heads=(1, 1), Lq=8,
           Lk=8, D=16, Dv=None, layouts=('bshd',) * 4, pad=1, lse=False, threads=1,
           scale=None, q_offset=None, mags=(1, 1, 1), seed=1, defect='none', p1=0, p2=0,
           specials=(), products='exact'):
    Dv = D if Dv is None else Dv
    b = bytearray()
    b.append(STORAGE.index(storage) + 3 * (out == 'f16'))
    b.append(int(causal) | (softcap is not None) << 1 |
             (CAPS.index(softcap if softcap is not None else 1) << 2))
    b.append(B - 1)
    b.append(HEADS.index(heads))
    b.append(Lq)
    if Lk <= 80:
        b.append(Lk)
    else:
        assert 250 <= Lk <= 525 and (Lk - 250) % 5 == 0 and Lq <= 16
        b.append(200 + (Lk - 250) // 5)
    b += bytes([D - 1, Dv - 1])
    for layout in layouts:
        b.append(LAYOUTS.index(layout) | (pad - 1) << 2)
    b.append(int(lse) | THREADS.index(threads) << 1 | (products == 'bf16') << 4)
    b.append(0 if scale is None else at_least(128, SCALES.index(scale), len(SCALES)))
    if q_offset is None:
        b.append(0)
    elif isinstance(q_offset, str):
        b.append(224 + HUGE_OFFSETS.index(q_offset))
    else:  # relative to the default Lk - Lq
        assert -48 <= q_offset <= 47
        b.append(176 + q_offset)
    b += bytes(MAGS.index(m) for m in mags)
    b += seed.to_bytes(4, 'big')
    kind = DEFECTS.index(defect)
    b.append(0 if kind == 0 else at_least(128, kind - 1, len(DEFECTS) - 1))
    b += bytes([p1, p2])
    b.append(0 if not specials else at_least(160, len(specials) - 1, 3))
    for tensor, at, value in specials:
        b += bytes(['qkv'.index(tensor), at >> 8, at & 255, SPECIALS.index(value)])
    return bytes(b)


SEEDS = {
    # Valid calls across storage, output, masks, score mods, layouts and shapes.
    'dense-f32': dict(),
    'causal-gqa-lse': dict(causal=True, heads=(1, 2), Lq=64, Lk=64, D=64, lse=True, threads=2),
    'bf16-causal-softcap-padded': dict(storage='bf16', causal=True, softcap=30, B=2, Lq=77,
                                       Lk=77, D=72, Dv=40, layouts=('padded',) * 4, pad=3,
                                       threads=3, lse=True),
    'f16-out-f16-softcap-bhsd': dict(storage='f16', out='f16', softcap=50, heads=(2, 4),
                                     Lq=65, Lk=70, D=33, Dv=65, layouts=('bhsd',) * 4),
    'mixed-layouts': dict(B=3, heads=(3, 3), Lq=20, Lk=31, D=17, Dv=9,
                          layouts=('bhsd', 'bshd', 'padded', 'bshd'), threads=4, lse=True),
    'long-keys-causal': dict(causal=True, heads=(2, 4), Lq=16, Lk=525, D=32, lse=True,
                             threads=2),
    'long-keys-bf16-full': dict(storage='bf16', Lq=5, Lk=300, D=64, Dv=8, threads=0),
    'empty-queries': dict(Lq=0, Lk=12, lse=True),
    'empty-keys': dict(causal=True, Lq=12, Lk=0, lse=True, threads=2),
    'one-query': dict(storage='bf16', causal=True, Lq=1, Lk=80, D=64, lse=True),
    'more-queries-than-keys-causal': dict(causal=True, Lq=40, Lk=10, D=24, lse=True),
    'offset-before-keys-causal': dict(causal=True, Lq=70, Lk=70, q_offset=-40, lse=True),
    'offset-after-keys-causal': dict(causal=True, Lq=10, Lk=30, q_offset=47, lse=True),
    'offset-2^62': dict(causal=True, Lq=3, Lk=5, q_offset='2^62', lse=True),
    'offset-minus-2^62-causal': dict(causal=True, Lq=3, Lk=5, q_offset='-2^62', lse=True),
    'offset-past-2^62': dict(Lq=3, Lk=5, q_offset='2^62+1'),
    'offset-min': dict(causal=True, Lq=3, Lk=5, q_offset='min'),
    'scale-negative': dict(scale=-1, lse=True),
    'scale-denormal': dict(scale=1e-45, Lq=9, Lk=9, lse=True),
    'scale-huge': dict(scale=1e30, lse=True),
    'scale-nan': dict(scale='nan'),
    'scale-zero': dict(scale=0),
    'scale-minus-zero': dict(scale='-0'),
    'scale-inf': dict(scale='inf'),
    'softcap-flt-min': dict(softcap='FLT_MIN', lse=True),
    'softcap-flt-max': dict(softcap='FLT_MAX', lse=True),
    'softcap-1e30-causal': dict(softcap=1e30, causal=True, lse=True),
    'softcap-below-flt-min': dict(softcap=1e-38),
    'softcap-nan': dict(softcap='nan'),
    'softcap-negative': dict(softcap=-1),
    'large-logits': dict(causal=True, mags=(1e4, 1, 1), Lq=30, Lk=30, lse=True),
    'overflowing-logits': dict(mags=(3e38, 3e38, 1), lse=True),
    'large-values-f16-out': dict(out='f16', mags=(1, 1, 1e4), lse=True),
    'threads-0': dict(threads=0, B=2, heads=(2, 2), Lq=70, Lk=20),
    'threads-negative': dict(threads=-1),
    'nan-in-visible-key': dict(specials=[('k', 3, 'nan')], lse=True),
    'inf-in-value': dict(specials=[('v', 5, 'inf')], lse=True),
    'nan-in-query': dict(storage='f16', specials=[('q', 17, 'nan')], lse=True),
    'extremes-everywhere': dict(storage='bf16', causal=True, specials=[
        ('q', 1, '-inf'), ('k', 200, 3e38), ('v', 77, 1e-40)], lse=True),
    # Defects: each must be rejected (or, where marked valid, handled).
    'negative-size': dict(defect='negative-size', p1=1, p2=2),
    'zero-head-dim': dict(defect='zero-dim', p1=1),
    'zero-value-dim': dict(defect='zero-dim', p1=0),
    'heads-not-multiple': dict(defect='heads-not-multiple', p2=0),
    'size-mismatch-v-seq': dict(defect='size-mismatch', p1=2, p2=2),
    'size-mismatch-o-dim': dict(defect='size-mismatch', p1=3, p2=3),
    'negative-stride': dict(defect='negative-stride', p1=1, p2=5),
    'overlapping-output-rows': dict(defect='overlapping-output', p2=1, Lq=4),
    'overlapping-output-heads': dict(defect='overlapping-output', p2=0, heads=(1, 2)),
    'overlapping-output-one-row': dict(defect='overlapping-output', p2=1, Lq=1),  # valid
    'broadcast-k-heads': dict(defect='broadcast-input', p1=1, p2=1, heads=(2, 2)),  # valid
    'broadcast-q-batch': dict(defect='broadcast-input', p1=0, p2=0, B=3),  # valid
    'overlapping-k-rows': dict(defect='overlapping-input', p1=1, p2=5, causal=True),  # valid
    'null-q': dict(defect='null-data', p1=0),
    'null-o': dict(defect='null-data', p1=3),
    'null-k-no-keys': dict(defect='null-data', p1=1, Lk=0, lse=True),  # valid
    'huge-batch-q': dict(defect='huge-size', p1=0, p2=0),
    'huge-dim-k': dict(defect='huge-size', p1=1, p2=3 | 4 * 3),
    'huge-stride-one-query': dict(defect='huge-unit-stride', p1=0, Lq=1, Lk=9),  # valid
    'huge-stride-one-output-row': dict(defect='huge-unit-stride', p1=3, p2=1, Lq=1),  # valid
    'empty-batch': dict(defect='empty-batch', lse=True),  # valid
    # The hardening contracts (Contracts in fuzz_attention.cpp), one seed or more each.
    'contract-masked-nan-key-causal': dict(causal=True, Lq=8, Lk=8, D=4, Dv=4,
                                          specials=[('k', 7 * 4, 'nan'), ('v', 7 * 4, 'inf')],
                                          lse=True),
    'contract-nan-logit-lse': dict(Lq=4, Lk=4, specials=[('k', 0, 'nan')], lse=True),
    'contract-alias-output-q': dict(defect='alias-output', p1=0, lse=True),
    'contract-alias-lse-o': dict(defect='alias-lse', p1=3, lse=True),
    'contract-alias-lse-k': dict(defect='alias-lse', p1=1, lse=True),
    'contract-huge-threads': dict(defect='huge-threads', p2=3),
    'contract-overflowing-bhsd': dict(defect='overflowing-layout', p1=0, p2=0),
    'contract-overflowing-bshd': dict(defect='overflowing-layout', p1=3, p2=1),
    'contract-huge-head-dim-empty': dict(defect='huge-dims-of-empty', p1=1, p2=3),
    # Bf16 products (Products::Bf16).
    'bf16-products-causal-gqa': dict(products='bf16', causal=True, heads=(2, 4), Lq=40, Lk=70,
                                     D=64, lse=True, threads=2),
    'bf16-products-f16-softcap': dict(products='bf16', storage='f16', softcap=30, Lq=33, Lk=33,
                                      D=40, Dv=24, layouts=('padded',) * 4, lse=True),
    # Issue 40, W1: a value finite in f32 and +inf in bf16 behind the causal mask (key 40):
    # rows 0-39, which cannot see it, stay the reference's.
    'issue40-w1-bf16-masked-value': dict(products='bf16', causal=True, Lq=48, Lk=48, D=16,
                                         specials=[('v', 40 * 16, 3.4e38)], lse=True),
}


# fuzz_entries.cpp's tables.
ENTRIES_TAG = 0xc0
ENTRIES = ['attention', 'decode', 'merge', 'varlen', 'paged', 'cache', 'moba', 'all_or_here',
           'backward', 'quant', 'linear', 'linear_backward']
NORMS = ['softmax', 'sinks', 'sigmoid', 'relu-power', 'softplus-l1', 'lssar']
MODS = ['dot', 'softcap', 'alibi', 'rope', 'fope', 'tapa']
PROFILES = ['f32', 'bf16/f16/bf16->f32', 'f16/bf16/f32->f16', 'f32/bf16/bf16->f32']
LEFTS = ['max', 'max', 0, 1, 3, 16, 100, 700]
RIGHTS = [0, 0, 'max', 2]
ENTRY_HEADS = [(1, 1), (1, 2), (2, 2), (2, 4), (1, 4), (3, 3), (1, 3), (4, 4)]
ENTRY_THREADS = [1, 2, 0, 3]
ENTRY_MAGS = [1, 0.5, 2, 4]
ENTRY_DEFECTS = ['none', 'decode-17-rows', 'lse-without-stat', 'scale-refused', 'policy-size',
                 'table-short', 'merge-shape', 'merge-stats', 'merge-alias', 'varlen-start',
                 'varlen-order', 'varlen-total', 'varlen-count', 'varlen-batch', 'paged-batch',
                 'paged-dim', 'paged-alias', 'paged-exhausted', 'paged-repeated', 'cache-full',
                 'cache-batch', 'routes-offset', 'routes-block', 'routes-list', 'window-zero',
                 'products-invalid', 'linear-alias', 'quantize-count', 'paged-huge-length']


def encode_entry(entry='attention', norm='softmax', mod='dot', left='max', right=0,
                 profile='f32', B=1, heads=(1, 1), Lq=4, Lk=16, D=16, Dv=None, bshd='0000',
                 lse=False, threads=1, scale=None, q_offset=None, mags=(1, 1, 1), seed=1,
                 p=(0, 0, 0, 0), e=(0,) * 8, defect='none', products='exact'):
    """p: policy bytes (cap / sigmoid / alpha / power; tapa / rope / fope (4: sigma, 8:
    train_len 64, 16: FopePadding::ReferenceCode); sinks; rope scaling), e: the entry's bytes
    (see fuzz_entries.cpp, fuzz_grads.cpp, fuzz_linear.cpp); the entry may override a few
    fields (decode() there, shape_grads_case())."""
    Dv = D if Dv is None else Dv
    b = bytearray([ENTRIES_TAG, ENTRIES.index(entry), NORMS.index(norm), MODS.index(mod),
                   LEFTS.index(left) | RIGHTS.index(right) << 3, PROFILES.index(profile),
                   B - 1, ENTRY_HEADS.index(heads), Lq])
    if Lk <= 64:
        b.append(Lk)
    elif Lk < 1000:
        assert 250 <= Lk <= 523 and (Lk - 250) % 7 == 0
        b.append(160 + (Lk - 250) // 7)
    else:
        assert Lk <= 1220 and Lk % 4 == 0
        b.append(200 + (Lk - 1000) // 4)
    b += bytes([D - 1, Dv - 1, int(bshd[::-1], 2),
                int(lse) | ENTRY_THREADS.index(threads) << 1 | (products == 'bf16') << 3])
    b.append(0 if scale is None else 193 if scale == 0.5 else 192)
    if isinstance(q_offset, str):  # far: attention_paged only
        b.append(252 + ['2^40', '-2^40', '2^62', 'max'].index(q_offset))
    else:
        b.append(0 if q_offset is None else at_least(192, (q_offset + 4) % 9, 9))  # Lk - Lq +
    b.append(sum(ENTRY_MAGS.index(m) << 2 * i for i, m in enumerate(mags)))
    b += seed.to_bytes(4, 'big')
    b += bytes(p) + bytes(e)
    kind = ENTRY_DEFECTS.index(defect)
    b.append(0 if kind == 0 else 128 + kind - 1)
    return bytes(b)


E = dict  # an entry seed's fields
ENTRY_SEEDS = {
    # attention(): the normalizers, scores and positions; the routes by shape.
    'attention-sigmoid': E(norm='sigmoid', Lq=8, Lk=40, heads=(1, 2)),
    'attention-sigmoid-bias': E(norm='sigmoid', p=(4 | 3 << 3, 0, 0, 0), Lq=20, Lk=50),
    'attention-relu-power-window': E(norm='relu-power', left=3, Lq=12, Lk=30, lse=True,
                                     p=(1, 0, 0, 0)),
    'attention-softplus-l1-lse': E(norm='softplus-l1', Lq=24, Lk=64, lse=True, threads=2),
    'attention-lssar': E(norm='lssar', Lq=16, Lk=60, lse=True),
    'attention-lssar-long-power-3': E(norm='lssar', Lq=10, Lk=299, D=32, p=(2 << 3, 0, 0, 0)),
    'attention-sinks-full': E(norm='sinks', right='max', heads=(2, 4), Lq=9, Lk=33, lse=True,
                              p=(0, 0, 3, 0)),
    'attention-alibi-split-kv': E(mod='alibi', heads=(2, 4), Lq=8, Lk=1024, lse=True, threads=2),
    'attention-softcap-below-split-kv': E(mod='softcap', Lq=8, Lk=1020, D=24, p=(2, 0, 0, 0)),
    'attention-rope-gptj-partial': E(mod='rope', Lq=20, Lk=40, D=32, p=(0, 3, 0, 0), lse=True),
    'attention-rope-yarn': E(mod='rope', Lq=7, Lk=60, D=16, p=(0, 0, 0, 2), q_offset=-2),
    'attention-rope-linear-split-kv': E(mod='rope', Lq=3, Lk=1100, D=8, p=(0, 0, 0, 1)),
    'attention-fope': E(mod='fope', heads=(1, 2), Lq=12, Lk=40, D=24, p=(0, 4 | 8, 0, 0),
                        lse=True),
    'attention-tapa': E(mod='tapa', Lq=16, Lk=64, D=20, p=(0, 1 | 1 << 2, 0, 0), lse=True),
    'attention-tapa-long': E(mod='tapa', Lq=4, Lk=1200, D=12, p=(0, 2, 0, 0)),
    'attention-mixed-row-engine': E(profile='bf16/f16/bf16->f32', heads=(2, 4), Lq=3, Lk=1100,
                                    lse=True, threads=2),
    'attention-mixed-split-kv': E(profile='f16/bf16/f32->f16', Lq=12, Lk=1024, bshd='1010'),
    'attention-mixed-tiles': E(profile='f32/bf16/bf16->f32', Lq=24, Lk=60,
                               bshd='0101', lse=True),
    # decode(): the row engine (softmax, Dot or Softcap, <= 4 rows), query tiles, chunks.
    'decode-row-engine-gqa': E(entry='decode', heads=(2, 4), Lq=1, Lk=502, lse=True,
                               threads=2),
    'decode-row-engine-softcap-4-rows': E(entry='decode', mod='softcap', Lq=4, Lk=523, D=40,
                                          p=(1, 0, 0, 0)),
    'decode-tiles-5-rows': E(entry='decode', Lq=5, Lk=1100, lse=True),
    'decode-rope-row-engine': E(entry='decode', mod='rope', Lq=2, Lk=523, D=16),
    'decode-fope': E(entry='decode', mod='fope', heads=(2, 2), Lq=3, Lk=64, D=8),
    'decode-tapa': E(entry='decode', mod='tapa', Lq=1, Lk=502, D=16),
    'decode-alibi-window': E(entry='decode', mod='alibi', left=100, Lq=16, Lk=1000, lse=True),
    'decode-sigmoid': E(entry='decode', norm='sigmoid', Lq=2, Lk=1100, threads=3),
    'decode-relu-power': E(entry='decode', norm='relu-power', Lq=6, Lk=299, lse=True),
    'decode-softplus-l1': E(entry='decode', norm='softplus-l1', Lq=1, Lk=1024, lse=True),
    'decode-sinks-mixed': E(entry='decode', norm='sinks', profile='f32/bf16/bf16->f32',
                            heads=(1, 4), Lq=2, Lk=1004, p=(0, 0, 1, 0), lse=True),
    'decode-17-rows': E(entry='decode', Lq=16, Lk=40, defect='decode-17-rows'),
    # merge(): parts over key ranges.
    'merge-softmax-3-parts': E(entry='merge', Lq=6, Lk=40, e=(2, 10, 30, 0, 0, 0, 0, 0),
                               lse=True),
    'merge-sinks-f16-out': E(entry='merge', norm='sinks', heads=(2, 2), Lq=4, Lk=30,
                             e=(1, 12, 0, 0, 1, 0, 0, 0), lse=True, p=(0, 0, 2, 0)),
    'merge-sigmoid': E(entry='merge', norm='sigmoid', Lq=5, Lk=50, e=(2, 0, 25, 0, 0, 0, 0, 0)),
    'merge-relu-power': E(entry='merge', norm='relu-power', Lq=5, Lk=20,
                          e=(1, 7, 0, 0, 0, 0, 0, 0), lse=True),
    'merge-softplus-l1': E(entry='merge', norm='softplus-l1', left=16, Lq=8, Lk=64,
                           e=(2, 20, 40, 0, 0, 0, 0, 0), lse=True),
    'merge-shape': E(entry='merge', Lq=3, Lk=10, e=(1, 5, 0, 0, 0, 0, 0, 0), defect='merge-shape'),
    'merge-stats': E(entry='merge', Lq=3, Lk=10, e=(1, 5, 0, 0, 0, 0, 0, 0), defect='merge-stats'),
    'merge-alias': E(entry='merge', Lq=3, Lk=10, e=(1, 5, 0, 0, 0, 0, 0, 0), defect='merge-alias'),
    'merge-sigmoid-stat': E(entry='merge', norm='sigmoid', lse=True, defect='lse-without-stat'),
    # attention_varlen(): packed sequences (e: count - 1, then q | k << 4 per sequence).
    'varlen-4-rope': E(entry='varlen', mod='rope', D=16, e=(3, 3 | 2 << 4, 0 | 5 << 4,
                                                            8 | 1 << 4, 5 | 15 << 4, 2, 0, 0),
                       lse=True, heads=(1, 2)),
    'varlen-softplus-l1': E(entry='varlen', norm='softplus-l1', e=(2, 4 | 3 << 4, 7 | 7 << 4,
                                                                   1 | 0, 0, 0, 0, 0), lse=True),
    'varlen-lssar': E(entry='varlen', norm='lssar', e=(1, 8 | 9 << 4, 2 | 4 << 4, 0, 0, 1, 0, 0)),
    'varlen-sigmoid-window': E(entry='varlen', norm='sigmoid', left=3,
                               e=(2, 6 | 6 << 4, 3 | 1 << 4, 4 | 12 << 4, 0, 3, 0, 0)),
    'varlen-start': E(entry='varlen', e=(1, 3 | 3 << 4, 3 | 3 << 4, 0, 0, 0, 0, 0),
                      defect='varlen-start'),
    'varlen-order': E(entry='varlen', e=(1, 3 | 3 << 4, 3 | 3 << 4, 0, 0, 0, 0, 0),
                      defect='varlen-order'),
    'varlen-total': E(entry='varlen', e=(1, 3 | 3 << 4, 3 | 3 << 4, 0, 0, 0, 0, 0),
                      defect='varlen-total'),
    'varlen-count': E(entry='varlen', e=(1, 3 | 3 << 4, 3 | 3 << 4, 0, 0, 0, 0, 0),
                      defect='varlen-count'),
    'varlen-batch': E(entry='varlen', e=(0, 3 | 3 << 4, 0, 0, 0, 0, 0, 0), defect='varlen-batch'),
    'varlen-table-short': E(entry='varlen', mod='rope', D=8, e=(1, 3 | 3 << 4, 2 | 6 << 4, 0, 0,
                                                                 0, 0, 0), defect='table-short'),
    # attention_paged() (e: sequences - 1, page size, lengths x3, spare pages, assign, cut).
    'paged-row-engine': E(entry='paged', heads=(2, 4), Lq=1, e=(2, 4, 210, 33, 0, 1, 0, 20),
                          lse=True, threads=2),
    'paged-row-engine-mixed': E(entry='paged', profile='bf16/f16/bf16->f32', Lq=3,
                                e=(1, 6, 77, 230, 0, 0, 1, 0), lse=True),
    'paged-pages-softcap': E(entry='paged', mod='softcap', Lq=20, e=(1, 2, 40, 13, 0, 2, 0, 5)),
    'paged-sigmoid': E(entry='paged', norm='sigmoid', Lq=4, e=(1, 3, 30, 50, 0, 0, 0, 7)),
    'paged-softplus-l1-assign': E(entry='paged', norm='softplus-l1', left=16, Lq=6,
                                  e=(2, 1, 20, 0, 45, 1, 1, 0), lse=True),
    'paged-relu-power': E(entry='paged', norm='relu-power', Lq=2, e=(0, 7, 70, 0, 0, 0, 0, 3),
                          lse=True),
    'paged-sinks': E(entry='paged', norm='sinks', heads=(1, 3), Lq=2,
                     e=(1, 5, 60, 10, 0, 0, 0, 0), lse=True, p=(0, 0, 5, 0)),
    'paged-batch': E(entry='paged', e=(1, 2, 9, 9, 0, 0, 0, 0), defect='paged-batch'),
    'paged-dim': E(entry='paged', e=(0, 2, 9, 0, 0, 0, 0, 0), defect='paged-dim'),
    'paged-alias': E(entry='paged', Lq=2, e=(0, 16, 40, 0, 0, 0, 0, 0), defect='paged-alias'),
    'paged-exhausted': E(entry='paged', e=(1, 4, 20, 9, 0, 2, 0, 3), defect='paged-exhausted'),
    'paged-exhausted-assign': E(entry='paged', e=(1, 4, 20, 9, 0, 2, 1, 3),
                                defect='paged-exhausted'),
    'paged-repeated': E(entry='paged', e=(0, 2, 9, 0, 0, 0, 1, 0), defect='paged-repeated'),
    'paged-sigmoid-stat': E(entry='paged', norm='sigmoid', e=(0, 2, 9, 0, 0, 0, 0, 0),
                            lse=True, defect='lse-without-stat'),
    # attention() on a KvCache (e: spare capacity, two cuts of the appends).
    'cache-appends': E(entry='cache', heads=(2, 4), Lq=3, Lk=60, e=(1, 20, 45, 0, 0, 0, 0, 0),
                       lse=True),
    'cache-rope': E(entry='cache', mod='rope', D=16, Lq=5, Lk=40, e=(0, 10, 30, 0, 0, 0, 0, 0),
                    p=(0, 1, 0, 0)),
    'cache-fope-gqa': E(entry='cache', mod='fope', heads=(1, 2), D=8, Lq=2, Lk=30,
                        e=(2, 5, 5, 0, 0, 0, 0, 0), p=(0, 4, 0, 0)),
    'cache-mixed': E(entry='cache', profile='f16/bf16/f32->f16', Lq=1, Lk=523,
                     e=(0, 100, 200, 0, 0, 0, 0, 0)),
    'cache-full': E(entry='cache', Lk=20, e=(0, 10, 15, 0, 0, 0, 0, 0), defect='cache-full'),
    'cache-batch': E(entry='cache', B=2, Lk=20, e=(0, 10, 15, 0, 0, 0, 0, 0),
                     defect='cache-batch'),
    # The sparsity drivers (e: block or window, topk or share of full routes).
    'moba': E(entry='moba', heads=(1, 2), Lq=20, Lk=64, e=(2, 1, 0, 0, 0, 0, 0, 0), lse=True),
    'moba-long': E(entry='moba', Lq=8, Lk=299, e=(4, 3, 0, 0, 0, 0, 0, 0), threads=2),
    'moba-routes-offset': E(entry='moba', Lq=4, Lk=20, e=(2, 1, 0, 0, 0, 0, 0, 0),
                            defect='routes-offset'),
    'moba-routes-block': E(entry='moba', Lq=4, Lk=20, e=(2, 1, 0, 0, 0, 0, 0, 0),
                           defect='routes-block'),
    'moba-routes-list': E(entry='moba', Lq=4, Lk=20, e=(2, 1, 0, 0, 0, 0, 0, 0),
                          defect='routes-list'),
    'moba-sinks': E(entry='moba', Lq=4, Lk=20, defect='policy-size'),
    'all-or-here': E(entry='all_or_here', heads=(2, 4), Lq=24, Lk=64, e=(3, 2, 0, 0, 0, 0, 0, 0),
                     lse=True),
    'all-or-here-sinks': E(entry='all_or_here', norm='sinks', Lq=10, Lk=299,
                           e=(4, 1, 0, 0, 0, 0, 0, 0), lse=True, p=(0, 0, 1, 0)),
    'all-or-here-window-zero': E(entry='all_or_here', Lq=4, Lk=20, defect='window-zero'),
    'all-or-here-routes': E(entry='all_or_here', Lq=4, Lk=20, defect='routes-list'),
    # Policies refused by the calls.
    'attention-tapa-scale': E(mod='tapa', scale=0.5, defect='scale-refused'),
    'attention-lssar-scale': E(norm='lssar', defect='scale-refused'),
    'attention-alibi-slopes': E(mod='alibi', heads=(1, 2), defect='policy-size'),
    'attention-softplus-l1-counts': E(norm='softplus-l1', defect='policy-size'),
    'attention-rope-table-short': E(mod='rope', D=8, Lq=4, Lk=10, defect='table-short'),
    'decode-fope-table-short': E(entry='decode', mod='fope', D=8, Lq=1, Lk=10,
                                 defect='table-short'),
    'attention-sigmoid-stat': E(norm='sigmoid', lse=True, defect='lse-without-stat'),
    # Bf16 products through the other entries.
    'varlen-bf16-products': E(entry='varlen', products='bf16', lse=True,
                              e=(2, 8 | 9 << 4, 5 | 12 << 4, 7 | 3 << 4, 0, 2, 0, 0)),
    'paged-bf16-products': E(entry='paged', products='bf16', Lq=20, e=(1, 4, 40, 70, 0, 1, 0, 9),
                             lse=True),
    'merge-bf16-products': E(entry='merge', products='bf16', Lq=20, Lk=60,
                             e=(2, 20, 40, 0, 0, 0, 0, 0), lse=True),
    'attention-bf16-products-rope': E(mod='rope', products='bf16', heads=(2, 4), Lq=24, Lk=60,
                                      D=32, lse=True),
    # attention_backward() (e: d_o's non-finite element + 1 and its value; e[2] & 1: batch 0).
    'backward-softmax-causal': E(entry='backward', heads=(2, 4), Lq=12, Lk=30, D=16, Dv=8),
    'backward-sinks-window': E(entry='backward', norm='sinks', left=3, Lq=10, Lk=20, p=(0, 0, 2, 0),
                               threads=2),
    'backward-sigmoid': E(entry='backward', norm='sigmoid', right='max', Lq=8, Lk=24),
    'backward-relu-power': E(entry='backward', norm='relu-power', Lq=9, Lk=17, p=(1, 0, 0, 0)),
    'backward-softcap': E(entry='backward', mod='softcap', Lq=6, Lk=40, D=24, p=(1, 0, 0, 0)),
    'backward-alibi': E(entry='backward', mod='alibi', heads=(1, 2), Lq=7, Lk=33),
    'backward-rope-offset': E(entry='backward', mod='rope', Lq=8, Lk=20, D=16, q_offset=3,
                              bshd='1010'),
    'backward-fope': E(entry='backward', mod='fope', heads=(1, 2), Lq=6, Lk=18, D=16,
                       p=(0, 4 | 8, 0, 0)),
    'backward-products-invalid': E(entry='backward', Lq=4, Lk=8, defect='products-invalid'),
    'backward-sigmoid-stat': E(entry='backward', norm='sigmoid', Lq=4, Lk=8,
                               defect='lse-without-stat'),
    # Issue 40, W3: NaN in row 2 of d_o under Causal: dK / dV of keys 3-7 stay finite.
    'issue40-w3-backward-nan-d-o-row': E(entry='backward', Lq=8, Lk=8, D=16, e=(2 * 16 + 1, 0, 0,
                                                                                 0, 0, 0, 0, 0)),
    'issue40-w3-backward-inf-d-o-window': E(entry='backward', left=3, Lq=12, Lk=12, D=8, Dv=8,
                                 e=(5 * 8 + 3, 1, 0, 0, 0, 0, 0, 0)),
    # Issue 40, E2: the backward of an empty batch with the forward's options.
    'issue40-e2-backward-empty-batch': E(entry='backward', Lq=4, Lk=8, e=(0, 0, 1, 0, 0, 0, 0, 0)),
    # attention() / decode() on a q8_0 / q4_0 KvCache (e: spare capacity, cuts, e[3]: 1 q4_0,
    # 4 decode(), 8 keys near q8_0's bound).
    'quant-q8-attention': E(entry='quant', heads=(2, 4), Lq=12, Lk=60, e=(1, 20, 45, 0, 0, 0, 0, 0),
                            lse=True),
    'quant-q4-decode-rope': E(entry='quant', mod='rope', Lq=2, Lk=299,
                              e=(0, 100, 200, 1 | 4, 0, 0, 0, 0), lse=True),
    'quant-q8-softcap-sinks': E(entry='quant', norm='sinks', mod='softcap', heads=(1, 2), Lq=5,
                                Lk=40, e=(2, 10, 30, 4, 0, 0, 0, 0), p=(1, 0, 3, 0)),
    # Issue 40: quantize_row(x, -32, out) is an Error, not a silent no-op.
    'issue40-quantize-row-negative-count': E(entry='quant', defect='quantize-count'),
    # Issue 40, W2: keys of +-7e6 turned by RoPE as a q8_0 cache stores them: an Error, or
    # finite rows.
    'issue40-w2-q8-rope-huge-keys': E(entry='quant', mod='rope', Lq=1, Lk=40, D=32,
                                      e=(0, 0, 0, 8, 0, 0, 0, 0)),
    # linear_attention() (e[0], e[1]: a NaN query element + 1; e[4]: map (1 Relu, 2 Taylor2),
    # 4 non-causal, 8 unnormalized, 16 recurrent, 32 decay; e[5]: the chunk; e[6]: gammas).
    'linear-elu-causal': E(entry='linear', heads=(2, 4), Lk=40, D=16, Dv=8,
                           e=(0, 0, 0, 0, 0, 3, 0, 0)),
    'linear-relu-noncausal-decay': E(entry='linear', Lq=10, Lk=30, D=12,
                                     e=(0, 0, 0, 0, 1 | 4 | 32, 4, 1, 0), threads=2),
    'linear-taylor2-recurrent': E(entry='linear', Lk=20, D=4, e=(0, 0, 0, 0, 2 | 16, 0, 0, 0)),
    'linear-elu-unnormalized-decay': E(entry='linear', Lk=50, D=8, e=(0, 0, 0, 0, 8 | 32, 2, 2, 0)),
    'linear-products-invalid': E(entry='linear', Lk=8, defect='products-invalid'),
    # Issue 40, W4: EluPlusOne, D 16, a NaN query: its row NaN, as the reference's.
    'issue40-w4-linear-elu-nan-query': E(entry='linear', Lk=20, D=16,
                                         e=(3 * 16 + 6, 0, 0, 0, 0, 0, 0, 0)),
    # Issue 40, V3: the output inside the LinearState.
    'issue40-v3-linear-output-in-state': E(entry='linear', Lk=8, D=8, defect='linear-alias'),
    # linear_attention_backward().
    'linear-backward-elu': E(entry='linear_backward', heads=(1, 2), Lk=24, D=8,
                             e=(0, 0, 0, 0, 0, 3, 0, 0)),
    'linear-backward-taylor2-noncausal': E(entry='linear_backward', Lq=6, Lk=12, D=3,
                                           e=(0, 0, 0, 0, 2 | 4 | 32, 0, 1, 0)),
    'linear-backward-elu-recurrent-unnormalized': E(entry='linear_backward', Lk=16, D=8,
                                                    e=(0, 0, 0, 0, 8 | 16, 0, 0, 0)),
    # Issue 40, V1: linear_attention_backward() with Products(5).
    'issue40-v1-linear-backward-products': E(entry='linear_backward', Lk=8,
                                             defect='products-invalid'),
    # Issue 40, U1: PagedKv::assign() of a length near INT64_MAX (pages_for() overflowed).
    'issue40-u1-paged-assign-huge-length': E(entry='paged', e=(0, 2, 9, 0, 0, 0, 1, 0),
                                             defect='paged-huge-length'),
    # Issue 40, FoPE: FopePadding::ReferenceCode at negative query positions (q_offset -25):
    # the fast path as the reference.
    'issue40-fope-reference-code-negative': E(mod='fope', Lq=24, Lk=3, D=16, q_offset=-4,
                                              p=(0, 8 | 16, 0, 0)),
}


# Issue 40's inputs whose fix has not landed yet: the committed corpus must pass, so these
# are written only with `--pending DIR` (into DIR), to be checked again as the fixes land.
PENDING = set()  # seeds of defects not fixed yet (written by --pending DIR, not to corpus/)


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
    pending = sys.argv[2] if len(sys.argv) == 3 and sys.argv[1] == '--pending' else None
    os.makedirs(out, exist_ok=True)
    if pending:
        os.makedirs(pending, exist_ok=True)
    seeds = [('seed-' + n, encode(**f)) for n, f in SEEDS.items()]
    seeds += [('seed-entry-' + n, encode_entry(**f)) for n, f in ENTRY_SEEDS.items()]
    written = 0
    for name, data in seeds:
        where = pending if name in PENDING else out
        if where:
            with open(os.path.join(where, name), 'wb') as f:
                f.write(data)
            written += where == out
    print(f'{written} seeds in {out}' + (f', {len(PENDING)} pending in {pending}' if pending
                                         else f' ({len(PENDING)} pending left out)'),
          file=sys.stderr)


if __name__ == '__main__':
    main()
