#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_attention into tests/fuzz/corpus/ (run by hand; the
test runs the committed files, never this script). Each seed is one named case in the
byte format of decode() in fuzz_attention.cpp; keep the two in step. Files named
regression-* are inputs the fuzzer found and are not written here."""
import os
import sys

CAPS = [1e-38, 'FLT_MIN', 1e-3, 0.5, 1, 5, 20, 30, 50, 1e4, 1e30, 'FLT_MAX', 'inf', 'nan', -1, 0]
SCALES = [1, 0.125, 0.5, 2, -1, 1e-3, 1e-30, 1e-45, 1e30, 'FLT_MAX', 'inf', '-inf', 'nan', 0,
          '-0', 10]
HUGE_OFFSETS = ['2^62', '-2^62', '2^62+1', '-2^62-1', 'max', 'min', '2^40', '-2^40']
THREADS = [0, 1, 2, 3, 4, 1, 2, -1]
MAGS = [1, 1, 1, 1, 1, 1, 0.5, 2, 3, 0.1, 10, 30, 100, 1e4, 1e20, 3e38]
SPECIALS = ['nan', 'inf', '-inf', 65504, -1e30, 3e38, 0, 1e-40]
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
           specials=()):
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
    b.append(int(lse) | THREADS.index(threads) << 1)
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
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
    os.makedirs(out, exist_ok=True)
    for name, fields in SEEDS.items():
        with open(os.path.join(out, 'seed-' + name), 'wb') as f:
            f.write(encode(**fields))
    print(f'{len(SEEDS)} seeds in {out}', file=sys.stderr)


if __name__ == '__main__':
    main()
