"""The MLX-affine codec (formats/affine.py, docs/FORMATS.md §2 and §11): hand-computed bytes, an independent
per-group re-computation of the mse search in plain Python floats, and the codec's promises (never worse than the
min-max fit, codes the nearest for the scalars written, the layout colibri's c/affine_quant.h reads)."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import affine

BF16 = np.dtype(ml_dtypes.bfloat16)


def _bf16_bits(values) -> list[int]:
    return [int(x) for x in np.asarray(values, np.float32).astype(BF16).view(np.uint16).reshape(-1)]


def test_rtn_bytes_hand_computed_exact_group():
    # mn 0, mx 7.5: s = 7.5 / 15 = 0.5, b = 0; codes w / 0.5
    w = np.array([[0, 1, 2, 3, 4, 5, 6, 7.5]], np.float32)
    codes, scalars = affine.encode(w, 4, 8)
    assert codes.tobytes() == bytes([0x20, 0x64, 0xA8, 0xFC])  # q[2k] | q[2k+1] << 4: 0,2 4,6 8,10 12,15
    assert scalars.dtype == BF16 and scalars.shape == (2, 1, 1)
    assert scalars.view(np.uint16).reshape(-1).tolist() == [0x3F00, 0x0000]  # bf16 0.5, 0.0
    np.testing.assert_array_equal(affine.decode(codes, scalars, 1, 8, 4, 8), w)


def test_rtn_bytes_hand_computed_rounding():
    # mn = 1 + 2^-8 is halfway between the bf16 neighbours 1 and 1 + 2^-7: nearest even gives b = 1.0;
    # mx - mn = 15 exactly: s = 1.0. Codes rint(w - 1): 0.0039 -> 0, 1.5 -> 2 and 4.5 -> 4, 7.5 -> 8 (half to
    # even), 15.0039 -> 15.
    w = np.array([[1.00390625, 2.5, 4.0, 5.5, 7.0, 8.5, 10.0, 16.00390625]], np.float32)
    codes, scalars = affine.encode(w, 4, 8)
    assert codes.tobytes() == bytes([0x20, 0x43, 0x86, 0xF9])
    assert scalars.view(np.uint16).reshape(-1).tolist() == [0x3F80, 0x3F80]
    want = np.array([1, 3, 4, 5, 7, 9, 10, 16], np.float32)
    np.testing.assert_array_equal(affine.decode(codes, scalars, 1, 8, 4, 8)[0], want)


def test_eight_bit_bytes_and_words():
    # 8 bits: one code per byte; a U32 word holds 4 codes, the lowest input in the lowest byte (little-endian)
    w = np.arange(16, dtype=np.float32).reshape(1, 16) * 0.25 - 1.0  # mn -1, mx 2.75: s = 3.75/255
    codes, scalars = affine.encode(w, 8, 16)
    s = float(np.float32(np.float32(3.75) / np.float32(255)).astype(BF16))
    q = [int(np.rint(np.float32(x + 1.0) / np.float32(s))) for x in w[0]]
    assert codes.reshape(-1).tolist() == q
    words = struct.unpack("<4I", codes.tobytes())
    assert words[0] == q[0] | q[1] << 8 | q[2] << 16 | q[3] << 24
    assert scalars.view(np.uint16).reshape(-1).tolist() == _bf16_bits([s, -1.0])


def test_four_bit_word_order_matches_colibri_reader():
    # c/affine_quant.h: code of input j = (word[j / 8] >> (4 * (j % 8))) & 15
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 64)).astype(np.float32)
    codes, _ = affine.encode(w, 4, 32)
    words = np.frombuffer(codes.tobytes(), "<u4").reshape(3, 8)
    q = affine.unpack(codes, 3, 64, 4)
    for j in range(64):
        np.testing.assert_array_equal((words[:, j // 8] >> (4 * (j % 8))) & 15, q[:, j])


def test_scalars_are_scales_then_biases_row_major():
    w = np.stack([np.linspace(-1, 1, 64), np.linspace(0, 3, 64)]).astype(np.float32)
    _, scalars = affine.encode(w, 4, 32)
    sb = scalars.astype(np.float32)
    for o in range(2):
        for g in range(2):
            grp = w[o, 32 * g : 32 * g + 32]
            assert sb[0, o, g] == np.float32((grp.max() - grp.min()) / np.float32(15)).astype(BF16).astype(
                np.float32
            )
            assert sb[1, o, g] == np.float32(grp.min()).astype(BF16).astype(np.float32)


def _err(w, s, b, q) -> float:
    total = 0.0
    for x, c in zip(w, q, strict=True):
        v = np.float32(np.float32(np.float32(s) * np.float32(c)) + np.float32(b))
        total += (float(v) - float(x)) ** 2
    return total


def _codes(w, s, b, top) -> list[int]:
    if s <= 0:
        return [0] * len(w)
    return [
        int(min(max(np.rint(np.float32(np.float32(x) - np.float32(b)) / np.float32(s)), 0), top)) for x in w
    ]


def _bf(x) -> float:
    return float(np.float32(x).astype(BF16))


def _search_one(w: list[float], bits: int) -> tuple[float, float, list[int]]:
    """The mse rules of formats/affine.py for one group, in Python ints and floats."""
    top = (1 << bits) - 1
    f = [np.float32(x) for x in w]
    mn, mx = min(f), max(f)
    rng = np.float32(mx - mn)
    s, b = _bf(np.float32(rng / np.float32(top))), _bf(mn)
    q = _codes(f, s, b, top)
    best = _err(f, s, b, q)
    e = int(np.frexp(max(abs(x) for x in f))[1])
    qw = [int(np.rint(float(x) * 2.0 ** (16 - e))) for x in f]
    n = len(f)
    for d in affine.OFFSETS:
        if rng <= 0:
            break
        t = np.float32(np.float32(top + d) / rng)
        l = [int(min(max(np.rint(np.float32(np.float32(x - mn) * t)), 0), top)) for x in f]
        L, LL = sum(l), sum(c * c for c in l)
        W, LW = sum(qw), sum(c * v for c, v in zip(l, qw, strict=True))
        D = n * LL - L * L
        if D <= 0:
            continue
        ts = _bf(np.float32((n * LW - L * W) / D * 2.0 ** (e - 16)))
        tb = _bf(np.float32((LL * W - L * LW) / D * 2.0 ** (e - 16)))
        if not (ts > 0 and np.isfinite(ts) and np.isfinite(tb)):
            continue
        tq = _codes(f, ts, tb, top)
        err = _err(f, ts, tb, tq)
        if err < best:
            best, s, b, q = err, ts, tb, tq
    return s, b, q


@pytest.mark.parametrize("bits", [4, 8])
def test_mse_matches_an_independent_per_group_computation(bits):
    rng = np.random.default_rng(11 + bits)
    groups = [rng.standard_normal(32) * 0.02, rng.laplace(size=32), rng.standard_t(3, size=32) * 5,
              np.r_[np.zeros(31), 1.0], np.full(32, 0.3), np.zeros(32), rng.uniform(2, 3, 32)]  # fmt: skip
    w = np.stack(groups).astype(np.float32)
    s, b, q = affine.fit_groups(w, bits, "mse")
    for i, g in enumerate(w):
        ws, wb, wq = _search_one([float(x) for x in g], bits)
        assert (float(s[i]), float(b[i])) == (ws, wb), i
        assert q[i].tolist() == wq, i


@pytest.mark.parametrize("bits", [4, 8])
def test_mse_never_worse_than_minmax_and_codes_nearest(bits):
    rng = np.random.default_rng(5)
    w = (rng.standard_t(4, size=(512, 64)) * 0.01).astype(np.float32)
    s0, b0, q0 = affine.fit_groups(w, bits, "rtn")
    s1, b1, q1 = affine.fit_groups(w, bits, "mse")
    e0 = affine.squared_error(w, s0, b0, q0)
    e1 = affine.squared_error(w, s1, b1, q1)
    assert (e1 <= e0).all()
    assert (e1 < e0).mean() > 0.5  # the search finds a better fit for most groups of heavy-tailed weights
    # every code is the nearest of 0..top for the scalars written (no other code decodes closer), up to the
    # float32 rounding of (w - b) / s: a few units in the last place of a code, times s
    top = (1 << bits) - 1
    grid = (s1[:, None, None] * np.arange(top + 1, dtype=np.float32)[None, None, :]).astype(np.float32)
    grid = (grid + b1[:, None, None]).astype(np.float32)
    dist = np.abs(grid.astype(np.float64) - w[:, :, None].astype(np.float64))
    chosen = np.take_along_axis(dist, q1[:, :, None], axis=2)[..., 0]
    assert (chosen <= dist.min(axis=2) + 4e-5 * s1[:, None]).all()


def test_decode_is_float32_scale_times_code_plus_bias():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((4, 128)).astype(np.float32)
    codes, scalars = affine.encode(w, 4, 64, "mse")
    sb = scalars.astype(np.float32)
    q = affine.unpack(codes, 4, 128, 4)
    d = affine.decode(codes, scalars, 4, 128, 4, 64)
    for o in range(4):
        for i in range(128):
            s, b = sb[0, o, i // 64], sb[1, o, i // 64]
            assert d[o, i] == np.float32(np.float32(s * np.float32(q[o, i])) + b)


def test_groups_must_be_whole_words():
    with pytest.raises(ValueError, match="multiple of 8"):
        affine.fit_groups(np.zeros((1, 12), np.float32), 4)


# ------------------------------------------------------------------------------ the kernel (kernels/affine.py)
def _groups(rng, kind: str) -> np.ndarray:
    """Groups of 64 of one kind: Gaussian at several magnitudes, heavy tails, exact ties, constant groups,
    float32 subnormals and values near float32's largest (a range that overflows to inf)."""
    g = rng.standard_normal((48, 64))
    if kind == "scales":
        g *= 10.0 ** rng.integers(-30, 30, size=(48, 1))
    elif kind == "tails":
        g = rng.standard_t(2, size=(48, 64))
    elif kind == "ties":
        g = np.round(g * 8) / 4
    elif kind == "constant":
        g = np.repeat(rng.standard_normal((48, 1)), 64, axis=1)
    elif kind == "subnormal":
        g *= 1e-40
    elif kind == "huge":
        g = np.sign(g) * 3e38 * np.minimum(np.abs(g), 1)
    return g.astype(np.float32)


@pytest.mark.parametrize("kind", ["scales", "tails", "ties", "constant", "subnormal", "huge"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("quantizer", ["rtn", "mse"])
def test_kernel_fit_is_byte_identical_to_numpy(kernel_drivers, kind, bits, quantizer):
    from colitools.formats.kernels import affine as kernel

    w = _groups(np.random.default_rng(hash((kind, bits)) % 2**32), kind)
    want = affine.fit_groups(w, bits, quantizer)
    got = kernel.fit_groups(w, bits, quantizer)
    for a, b in zip(want, got, strict=True):
        assert np.asarray(a).astype(np.float64).tobytes() == np.asarray(b).astype(np.float64).tobytes()
    if kind == "huge":  # ranges past float32's: no affine scale holds them, and encoding says so
        from colitools.formats.errors import EncodeError
        from colitools.formats.registry import by_name

        assert not np.isfinite(want[0]).all()
        row = int(np.flatnonzero(~np.isfinite(want[0]))[0])  # one group per row here
        with pytest.raises(EncodeError, match=rf"tensor t\.w: affine\d-g64: the group at \[{row}, 0\] spans more"):
            by_name(f"affine{bits}").encode(w, 64, name="t.w", quantizer=quantizer)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_formats_fast_path_equals_the_reference_on_any_thread_count(kernel_drivers, threads, monkeypatch):
    """``Format.encode(fast=True)`` of the affine formats (the kernel fit past the dispatcher's small-tensor
    cut) against the numpy reference, and a NaN named by the tensor and its first position."""
    from colitools.formats import kernels
    from colitools.formats.errors import EncodeError
    from colitools.formats.registry import by_name

    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)
    kernels.set_threads(threads)
    try:
        w = np.random.default_rng(threads).standard_t(3, size=(96, 256)).astype(np.float32)
        for name in ("affine4", "affine8"):
            for q in ("rtn", "mse", "mse-positive"):
                fast = by_name(name).encode(w, 64, fast=True, quantizer=q)
                slow = by_name(name).encode(w, 64, fast=False, quantizer=q)
                assert fast[0].tobytes() == slow[0].tobytes() and fast[1].tobytes() == slow[1].tobytes()
        w[17, 200] = np.nan
        with pytest.raises(EncodeError, match=r"tensor t\.w: non-finite value nan at \[17, 200\]"):
            by_name("affine4").encode(w, 64, name="t.w", fast=True, quantizer="mse")
    finally:
        kernels.set_threads(None)
