"""The upload profile benchmark: every stage timed for every preset, the sizes it reports."""

from benchmarks import upload_profile


def test_every_stage_of_every_preset_is_timed_and_lean_sends_8_bytes_a_value(tmp_path):
    frame = upload_profile.main(
        ["--params", "8192", "--clients", "2", "--repeats", "1", "--out", str(tmp_path)]
    )
    assert list(frame.columns) == ["compact", "wide", "lean"]
    stages = [s for s in frame.index if ":" in s]
    assert len(stages) == 10 and (frame.loc[stages] > 0).all().all()
    # two full chunks: the one-prime preset's upload and aggregate are 8 B a value (and
    # the headers); compact's aggregate is two polynomials over two primes
    assert 8.0 < frame.loc["upload bytes per value", "lean"] < 8.5
    assert 8.0 < frame.loc["aggregate bytes per value", "lean"] < 8.5
    assert frame.loc["aggregate bytes per value", "compact"] > 3 * 8.0
    assert (tmp_path / "upload_profile.md").read_text().count("| decryptor:") == 3
