"""The upload profile benchmark: every stage timed for every preset, the sizes it reports."""

from benchmarks import upload_profile


def test_every_stage_of_every_preset_is_timed_and_lean_sends_8_bytes_a_value(tmp_path):
    frame = upload_profile.main(
        ["--params", "8192", "--clients", "2", "--repeats", "1", "--out", str(tmp_path)]
    )
    assert list(frame.columns) == [
        f"{p} ({path})" for p in ("compact", "wide", "lean") for path in ("TenSEAL", "native")
    ]
    for column in frame.columns:
        stages = [s for s in frame[column].dropna().index if ":" in s]
        assert len(stages) >= 8 and (frame.loc[stages, column] > 0).all(), column
    # two full chunks: the one-prime preset's upload and aggregate are 8 B a value (and
    # the headers); compact's aggregate is two polynomials over two primes
    for path in ("TenSEAL", "native"):
        assert 8.0 < frame.loc["upload bytes per value", f"lean ({path})"] < 8.5
        assert 8.0 < frame.loc["aggregate bytes per value", f"lean ({path})"] < 8.5
        assert frame.loc["aggregate bytes per value", f"compact ({path})"] > 3 * 8.0
    # compact compresses on both paths (its primes leave the top bits zero)
    assert frame.loc["upload bytes per value", "compact (native)"] < 14
    assert (tmp_path / "upload_profile.md").read_text().count("| decryptor:") == 3
