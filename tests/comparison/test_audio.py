"""Speech files as people bring them: a phone's M4A, a browser's WebM recording, a video's sound track, in stereo or
mono, decoded to the same 16 kHz mono samples as the WAV they were made from (libsndfile reads WAV, FLAC, MP3 and
OGG; FFmpeg, through PyAV, the rest)."""
from __future__ import annotations

import re
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from assistgen.comparison.audio import load_audio
from assistgen.comparison.tasks import InputError
from helpers import encode_audio as encode, speech_wav


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> tuple[np.ndarray, Path]:
    """An espeak-ng sentence: (16 kHz samples × 1 channel, its WAV)."""
    wav = speech_wav(tmp_path_factory.mktemp("speech") / "speech.wav")
    samples, rate = sf.read(str(wav), dtype="float32", always_2d=True)
    assert rate == 16000
    return samples, wav


def similarity(a: np.ndarray, b: np.ndarray, max_lag: int = 1600) -> float:
    """The largest normalised correlation of two signals within ±`max_lag` samples (codecs add a little delay)."""
    n = min(len(a), len(b)) - max_lag
    best = 0.0
    for lag in range(-max_lag, max_lag + 1, 8):
        x, y = a[max_lag:max_lag + n - max_lag], b[max_lag + lag:max_lag + lag + n - max_lag]
        best = max(best, float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-12)))
    return best


@pytest.mark.parametrize("name, codec, container", [("memo.m4a", "aac", "mp4"), ("recording.webm", "libopus", "webm"),
                                                    ("clip.aac", "aac", "adts")])
def test_compressed_recordings_decode_to_the_speech_they_hold(speech, tmp_path, name, codec, container):
    samples, wav = speech
    reference = load_audio(wav)
    decoded = load_audio(encode(samples, 16000, tmp_path / name, codec, container))
    assert abs(len(decoded) - len(reference)) < 0.15 * 16000   # AAC adds its encoder delay, 1024 samples,
    # and pads its last frame
    assert similarity(reference, decoded) > 0.9


def test_a_stereo_recording_is_downmixed_like_a_stereo_wav(speech, tmp_path):
    samples, _ = speech
    stereo = np.concatenate([samples, np.zeros_like(samples)], axis=1)   # speech on the left, silence on the right
    wav = tmp_path / "stereo.wav"
    sf.write(str(wav), stereo, 16000)
    from_wav = load_audio(wav)
    from_m4a = load_audio(encode(stereo, 16000, tmp_path / "stereo.m4a", "aac", "mp4"))
    assert similarity(from_wav, from_m4a) > 0.9
    assert np.sqrt(np.mean(from_m4a ** 2)) == pytest.approx(np.sqrt(np.mean(from_wav ** 2)), rel=0.1)


def test_a_videos_sound_track_is_transcribed_and_a_silent_video_is_refused(speech, tmp_path):
    samples, wav = speech
    film = load_audio(encode(samples, 16000, tmp_path / "film.mp4", "aac", "mp4", video=True))
    assert similarity(load_audio(wav), film) > 0.9
    silent = encode(np.zeros((0, 1), np.float32), 16000, tmp_path / "silent-film.mp4", "aac", "mp4", video=True)
    with pytest.raises(InputError, match="no sound track"):
        load_audio(silent)


def test_an_m4a_past_the_limit_is_refused_from_its_header_before_decoding(speech, tmp_path, monkeypatch):
    samples, _ = speech
    memo = encode(samples, 16000, tmp_path / "memo.m4a", "aac", "mp4")

    def no_decode(*args, **kwargs):
        raise AssertionError("the audio was decoded")

    monkeypatch.setattr(av, "AudioResampler", no_decode)
    with pytest.raises(InputError, match=r"the limit is 1 s"):
        load_audio(memo, max_seconds=1)


def test_damaged_compressed_files_get_a_clear_error(speech, tmp_path):
    samples, _ = speech
    data = encode(samples, 16000, tmp_path / "recording.webm", "libopus", "webm").read_bytes()
    cut = tmp_path / "cut.webm"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(InputError, match="damaged or truncated"):
        load_audio(cut)
    memo = encode(samples, 16000, tmp_path / "memo.m4a", "aac", "mp4").read_bytes()
    for name, content in (("cut.m4a", memo[:len(memo) // 2]), ("notes.m4a", b"not a recording at all\n" * 40)):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(InputError, match="not audio this app can decode; use WAV, FLAC, MP3"):
            load_audio(tmp_path / name)


def test_a_playlist_that_points_at_other_files_is_refused_unread(speech, tmp_path):
    samples, _ = speech
    encode(samples, 16000, tmp_path / "clip.aac", "aac", "adts")
    seconds = len(samples) / 16000   # as stated, so that FFmpeg's HLS demuxer would play clip.aac through it whole
    (tmp_path / "list.m3u8").write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:{int(seconds) + 1}\n#EXTINF:{seconds:.3f},\n"
                                        "clip.aac\n#EXT-X-ENDLIST\n")
    with pytest.raises(InputError, match="not audio this app can decode"):
        load_audio(tmp_path / "list.m3u8")


def test_a_raw_aac_stream_whose_start_is_quiet_is_not_taken_for_a_long_one(speech, tmp_path):
    """FFmpeg guesses a raw AAC stream's length from its first packets' bitrate: a quiet start read as minutes."""
    samples, _ = speech
    quiet_then_speech = np.concatenate([np.full((16000 * 30, 1), 1e-4, np.float32), samples] * 1)
    decoded = load_audio(encode(quiet_then_speech, 16000, tmp_path / "clip.aac", "aac", "adts"), max_seconds=60)
    assert abs(len(decoded) / 16000 - len(quiet_then_speech) / 16000) < 0.15


def test_a_video_longer_than_its_sound_is_judged_by_its_sound(speech, tmp_path):
    samples, wav = speech
    film = encode(samples, 16000, tmp_path / "film.mp4", "aac", "mp4", video=True, video_seconds=12)
    decoded = load_audio(film, max_seconds=8)   # the picture's 12 s are past the limit, the sound's 3.6 s are not
    assert similarity(load_audio(wav), decoded) > 0.9


def test_a_stream_whose_layout_changes_midway_decodes_whole(speech, tmp_path, monkeypatch):
    samples, _ = speech
    first = encode(samples, 16000, tmp_path / "a.aac", "aac", "adts")
    stereo = np.repeat(samples, 2, axis=1)
    second = encode(stereo, 16000, tmp_path / "b.aac", "aac", "adts")
    (tmp_path / "take:2.aac").write_bytes(first.read_bytes() + second.read_bytes())
    monkeypatch.chdir(tmp_path)
    decoded = load_audio("take:2.aac")   # a colon in a relative name, as a phone may name a take, is no protocol
    assert abs(len(decoded) - 2 * len(samples)) < 0.3 * 16000


def test_a_file_whose_rate_would_decode_to_gigabytes_is_refused_from_its_header(tmp_path, monkeypatch):
    # 8 channels at 655 kHz: a few kilobytes of FLAC per second of a steady tone, gigabytes once decoded
    path = tmp_path / "bomb.flac"
    sf.write(str(path), np.full((65535, 8), 0.1, np.float32), 655350)
    monkeypatch.setattr(sf.SoundFile, "read", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(InputError, match="sampled at 655,350 Hz; the most this app reads is 192,000 Hz"):
        load_audio(path)


def test_many_channels_are_downmixed_block_by_block_as_all_at_once(tmp_path, monkeypatch):
    from assistgen.comparison import audio
    rng = np.random.default_rng(0)
    samples = (0.1 * rng.standard_normal((40000, 6))).astype(np.float32)
    path = tmp_path / "six.wav"
    sf.write(str(path), samples, 16000, subtype="FLOAT")
    monkeypatch.setattr(audio, "BLOCK_FRAMES", 4096)
    assert np.array_equal(load_audio(path), samples.mean(axis=1))


@pytest.mark.parametrize("samples, needle", [
    (np.zeros((0, 1), np.float32), "holds no audio samples: record again, or pick a clip with sound in it"),
    (np.full((16000, 1), np.nan, np.float32), "holds samples that are not numbers (damaged); export it again"),
])
def test_an_empty_or_damaged_wav_says_what_to_do(tmp_path, samples, needle):
    path = tmp_path / "take.wav"
    sf.write(str(path), samples, 16000, subtype="FLOAT")
    with pytest.raises(InputError, match=re.escape(needle)):
        load_audio(path)
