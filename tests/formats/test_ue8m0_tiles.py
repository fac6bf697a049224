"""fp8-e4m3-e8m0-t32 (ord 101) and -r32 (ord 102), docs/FORMATS.md §2.10 / §2.11 / §3: hand-computed byte vectors,
the scale-shape resolution with its collisions, and colibri's own decoders restated.

The rules come from colibri's ``c/deepseek_v41.c`` (JustVugg/colibri a4306c8): ``w8_load`` (``{name}.weight`` of
``O*I`` bytes, ``{name}.scale`` of ``ceil(O/32)*ceil(I/32)`` bytes) and ``mv8`` (row ``o`` reads tile row
``o / 32``, column tile ``base / 32``, ``e4m3_decode(code) * ue8m0(byte)``); ``engram_row`` (row ``id``: ``head_dim``
bytes at ``id*head_dim``, ``head_dim/32`` scale bytes at ``id*head_dim/32``); and its Vulkan upload ``vk_mul`` /
``c/shaders/qmatmul.comp`` fmt 12 (one f32 scale per 32 inputs of a row, expanded from the tile bytes). The
quantizer rule is DeepSeek's (``fast_round_scale``, as fp8-e4m3-e8m0's). Every expected byte was worked out by
hand (comments), never read off the encoder.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import resolver
from colitools.formats.errors import ResolveError
from colitools.formats.registry import (
    FORMATS,
    UE8M0_FP8_FORMATS,
    Fp8E4m3E8m0,
    Fp8E4m3E8m0R32,
    Fp8E4m3E8m0T32,
    by_name,
)

T32, R32 = Fp8E4m3E8m0T32, Fp8E4m3E8m0R32


def _w33x2() -> np.ndarray:
    """[33, 2]: row 0 = [1.0, -0.5], rows 1..31 zero (tile row 0), row 32 = [3.0, 0] (tile row 1)."""
    w = np.zeros((33, 2), np.float32)
    w[0] = [1.0, -0.5]
    w[32] = [3.0, 0.0]
    return w


def test_registered_under_their_ordinals_and_names():
    assert FORMATS[101] is T32 and FORMATS[102] is R32 and FORMATS[9] is Fp8E4m3E8m0
    assert by_name("fp8-e4m3-e8m0-t32") is T32 and by_name("fp8-e4m3-e8m0-r32") is R32
    assert T32.label() == "fp8-e8m0-t32" and R32.label() == "fp8-e8m0-r32"
    assert T32.option_names() == ("fp8-e8m0-t32",) and R32.option_names() == ("fp8-e8m0-r32",)
    for f in (T32, R32):  # DeepSeek's spelling: <base>.weight F8_E4M3 + <base>.scale F8_E8M0, no stamp
        assert f.tensor_names("a.wq_a.weight") == ("a.wq_a.weight", "a.wq_a.scale")
        assert (f.weight_dtype, f.scale_dtype) == ("F8_E4M3", "F8_E8M0")
        assert f.matmul_kind is None  # the runtime's fp8 kernel takes 128x128 blocks only


def test_t32_bytes_by_hand():
    # tile (0, 0): amax 1.0 -> 1/448 = 2^-8.807 -> k = -8 -> byte 0x77; w * 2^8: 256 = 2^8 -> e4m3 exponent
    # 8 + 7 = 15 -> 0 1111 000 = 0x78; -128 = -2^7 -> 1 1110 000 = 0xF0
    # tile (1, 0): amax 3.0 -> 3/448 = 2^-7.22 -> k = -7 -> byte 0x78; 3 * 2^7 = 384 = 1.5 * 2^8 -> 0 1111 100 = 0x7C
    codes, scale = T32.encode(_w33x2(), fast=True)
    want = bytearray(66)
    want[0:2] = bytes([0x78, 0xF0])
    want[64:66] = bytes([0x7C, 0x00])
    assert codes.tobytes() == bytes(want) and codes.shape == (33, 2)
    assert scale.tobytes() == bytes([0x77, 0x78]) and scale.shape == (2, 1) == T32.scale_shape(33, 2)
    assert T32.decode(codes, scale, 33, 2).tolist() == _w33x2().tolist()


def test_r32_bytes_by_hand():
    # one byte per 32 inputs of each row: row 0 amax 1.0 -> 0x77 (codes 78 F0, as above); rows 1..31 all zero:
    # amax floored at 1e-4 -> 1e-4/448 = 2^-22.09 -> k = -22 -> byte 0x69, codes 0; row 32 amax 3.0 -> 0x78, 7C 00
    codes, scale = R32.encode(_w33x2(), fast=False)
    assert codes.tobytes()[:2] == bytes([0x78, 0xF0]) and codes.tobytes()[64:] == bytes([0x7C, 0x00])
    assert scale.tobytes() == bytes([0x77, *[0x69] * 31, 0x78]) and scale.shape == (33, 1) == R32.scale_shape(33, 2)
    assert R32.decode(codes, scale, 33, 2).tolist() == _w33x2().tolist()


def test_partial_edge_tiles_and_byte_counts():
    # [40, 70]: tiles ceil(40/32) x ceil(70/32) = 2 x 3 = 6 bytes; row groups 40 x 3 = 120; 128 blocks 1 x 1
    assert (T32.scale_nbytes(40, 70), R32.scale_nbytes(40, 70), Fp8E4m3E8m0.scale_nbytes(40, 70)) == (6, 120, 1)
    assert T32.weight_nbytes(40, 70) == R32.weight_nbytes(40, 70) == 40 * 70
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((40, 70)) * 0.03).astype(np.float32)
    for f in (T32, R32):
        codes, scale = f.encode(w)
        back = f.decode(codes, scale, 40, 70)
        assert np.all(np.abs(back - w) <= np.abs(w) * 2.0**-3 + 2.0**-16)  # e4m3: 3 mantissa bits


def _mv8_decode(codes: np.ndarray, tiles: np.ndarray, O: int, I: int) -> np.ndarray:
    """c/deepseek_v41.c ``mv8`` per element: row o, column i -> tile byte ``(o/32)*tiles_i + i/32``."""
    e4m3 = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(O, I)
    tiles_i = -(-I // 32)
    flat = tiles.reshape(-1)
    out = np.empty((O, I), np.float32)
    for o in range(O):
        for i in range(I):
            out[o, i] = e4m3[o, i] * np.float32(2.0 ** (int(flat[(o // 32) * tiles_i + i // 32]) - 127))
    return out


def _engram_row_decode(codes: np.ndarray, scales: np.ndarray, rows: int, head_dim: int) -> np.ndarray:
    """c/deepseek_v41.c ``engram_row``: row id's bytes at ``id*head_dim``, its scales at ``id*head_dim/32``."""
    e4m3 = codes.reshape(-1).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    flat, groups = scales.reshape(-1), head_dim // 32
    out = np.empty((rows, head_dim), np.float32)
    for r in range(rows):
        for g in range(groups):
            s = np.float32(2.0 ** (int(flat[r * groups + g]) - 127))
            out[r, g * 32 : (g + 1) * 32] = e4m3[r * head_dim + g * 32 : r * head_dim + (g + 1) * 32] * s
    return out


def _vulkan_fmt12_decode(codes: np.ndarray, tiles: np.ndarray, O: int, I: int, gs: int = 32) -> np.ndarray:
    """colibri's Vulkan fmt 12: ``vk_mul`` expands each tile byte to ``scales[o*groups + g] = ue8m0(tile)`` for
    its 32 rows, then ``qmatmul.comp`` multiplies ``e4m3(w) * scale[o*ng + i/gs]``."""
    groups = -(-I // 32)
    flat = tiles.reshape(-1)
    scales = np.array(
        [2.0 ** (int(flat[(o // 32) * groups + g]) - 127) for o in range(O) for g in range(groups)], np.float32
    )
    e4m3 = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(O, I)
    ng = -(-I // gs)
    return np.stack([e4m3[o] * scales[o * ng + np.arange(I) // gs] for o in range(O)])


@pytest.mark.parametrize("shape", [(33, 2), (64, 96), (70, 40)])
def test_t32_decodes_as_colibris_readers_do(shape):
    O, I = shape
    rng = np.random.default_rng(O * I)
    codes = rng.integers(0, 256, (O, I), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x10  # no NaN codes
    tiles = rng.integers(100, 140, T32.scale_shape(O, I), dtype=np.uint8)
    ours = T32.decode(codes, tiles, O, I)
    assert np.array_equal(ours, _mv8_decode(codes, tiles, O, I))
    assert np.array_equal(ours, _vulkan_fmt12_decode(codes, tiles, O, I))


def test_r32_decodes_as_engram_row_does():
    rows, hd = 37, 64
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 0x7E, (rows, hd), dtype=np.uint8)
    scales = rng.integers(100, 140, R32.scale_shape(rows, hd), dtype=np.uint8)
    assert np.array_equal(R32.decode(codes, scales, rows, hd), _engram_row_decode(codes, scales, rows, hd))


# ------------------------------------------------------------------------------------------- resolution (§3)
@pytest.mark.parametrize(
    ("O", "I", "fmt"),
    [(64, 64, Fp8E4m3E8m0), (64, 64, T32), (64, 64, R32), (300, 40, T32), (40, 300, R32), (129, 1, Fp8E4m3E8m0)],
)
def test_each_grid_resolves_by_its_scale_shape(O, I, fmt):
    got = resolver.resolve_fp8_e8m0("t", O * I, fmt.scale_nbytes(O, I), O, I, fmt.scale_shape(O, I))
    assert got.name == fmt.name and resolver.check_roundtrip("t", fmt.name, None, O, I, None).name == fmt.name
    assert resolver.stamp_for("t", fmt.name, O, I) is None  # never stamped


@pytest.mark.parametrize(
    ("O", "I", "coinciding"),
    [
        (32, 32, (Fp8E4m3E8m0, T32)),  # one 128 block, one 32x32 tile
        (5, 17, (Fp8E4m3E8m0, T32)),
        (1, 64, (T32, R32)),  # one row of two 32-input tiles / groups
        (1, 32, (Fp8E4m3E8m0, T32, R32)),  # one scale byte for the whole row
    ],
)
def test_coinciding_grids_read_the_same_values_and_resolve_by_precedence(O, I, coinciding):
    shapes = {f.scale_shape(O, I) for f in coinciding}
    assert len(shapes) == 1 and resolver.ue8m0_candidates(O, I, coinciding[0].scale_nbytes(O, I)) == list(
        coinciding
    )
    rng = np.random.default_rng(O + I)
    codes = rng.integers(0, 0x7E, (O, I), dtype=np.uint8)
    scale = rng.integers(110, 130, shapes.pop(), dtype=np.uint8)
    values = [f.decode(codes, scale, O, I) for f in coinciding]
    assert all(np.array_equal(values[0], v) for v in values[1:])  # the collision is label only, never values
    for f in coinciding:  # the reader reports the first of UE8M0_FP8_FORMATS; the writer accepts it back
        assert resolver.check_roundtrip("t", f.name, None, O, I, None).name == coinciding[0].name
    assert UE8M0_FP8_FORMATS.index(coinciding[0]) < UE8M0_FP8_FORMATS.index(coinciding[-1])


def test_a_scale_that_fits_no_grid_is_one_line_naming_every_grid():
    with pytest.raises(ResolveError) as exc:
        resolver.resolve_fp8_e8m0("layers.0.attn.wq_a.weight", 64 * 64, 3, 64, 64, (3, 1))
    msg = str(exc.value)
    assert "\n" not in msg and "layers.0.attn.wq_a.weight" in msg
    assert "fp8-e8m0 [1, 1] = 1" in msg and "fp8-e8m0-t32 [2, 2] = 4" in msg and "fp8-e8m0-r32 [64, 2] = 128" in msg
    with pytest.raises(ResolveError):  # weight bytes not O*I
        resolver.resolve_fp8_e8m0("t", 64 * 63, 4, 64, 64, (2, 2))
