"""What a malicious client can build without any compression library: SEAL headers, zstd
frames of raw or RLE blocks (RFC 8878), and the byte offsets inside an uncompressed SEAL 4.x
ciphertext. Written from the formats, not from the code under test."""

from __future__ import annotations

import struct

SEAL_HEADER = struct.Struct("<HBBBBHQ")  # magic, header size, major, minor, compr, reserved, size
SEAL_MAGIC = 0xA15E
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BLOCK_MAX = 128 << 10  # zstd's largest block
# uncompressed ciphertext: parms_id(32) is_ntt(1) size(8) N(8) L(8) scale(8) correction(8),
# then the data array's own SEAL header (16), its count (8) and data
CT_SIZE_AT, CT_N_AT, CT_L_AT, CT_SCALE_AT = 33, 41, 49, 57
CT_DATA_HEADER_AT, CT_COUNT_AT = 73, 89


def seal_blob(
    body: bytes,
    compr_mode: int = 2,
    size: int | None = None,
    version: tuple[int, int] = (4, 1),
    magic: int = SEAL_MAGIC,
    header_size: int = 16,
    reserved: int = 0,
) -> bytes:
    """A SEAL header (claiming ``size``, by default the true length) and ``body``."""
    total = SEAL_HEADER.size + len(body) if size is None else size
    return SEAL_HEADER.pack(magic, header_size, *version, compr_mode, reserved, total) + body


def frame_header(window_log: int = 17) -> bytes:
    """Frame header without content size, checksum or dictionary; window 2^window_log."""
    return ZSTD_MAGIC + bytes([0x00, (window_log - 10) << 3])


def block(kind: int, size: int, last: bool, content: bytes) -> bytes:
    """kind 0 raw (content is the bytes), 1 RLE (content is the one byte repeated size times)."""
    return ((size << 3) | (kind << 1) | int(last)).to_bytes(3, "little") + content


def zstd_raw_frame(raw: bytes) -> bytes:
    """``raw`` as a valid zstd frame of uncompressed blocks: any content, no compressor."""
    chunks = [raw[i : i + BLOCK_MAX] for i in range(0, len(raw), BLOCK_MAX)] or [b""]
    return frame_header() + b"".join(
        block(0, len(c), i == len(chunks) - 1, c) for i, c in enumerate(chunks)
    )


def zstd_rle_bomb(nbytes: int, block_size: int = BLOCK_MAX) -> bytes:
    """A zstd frame of ``nbytes`` made of RLE blocks: 4 bytes inflate to ``block_size``."""
    n = max(1, (nbytes - len(frame_header())) // 4)
    return frame_header() + b"".join(block(1, block_size, i == n - 1, b"\0") for i in range(n))


def bomb_upload(nbytes: int = 65_730) -> bytes:
    """The review's forged upload: ``nbytes`` with a valid SEAL header, inflating to ~2 GB."""
    return seal_blob(zstd_rle_bomb(nbytes - SEAL_HEADER.size))


def with_u64(data: bytes, offset: int, value: int) -> bytes:
    out = bytearray(data)
    out[offset : offset + 8] = struct.pack("<Q", value % (1 << 64))
    return bytes(out)
