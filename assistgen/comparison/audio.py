"""Speech input: checked from its metadata before decoding, then decoded, downmixed and resampled to 16 kHz mono."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from ..choices import file_size_bytes, limits_from_env
from .tasks import SAMPLE_RATE, InputError

MIN_SECONDS = 0.1
SILENCE_PEAK = 1e-4
MAX_SAMPLE_RATE = 192_000   # a small file at a huge rate would decode to gigabytes
BLOCK_FRAMES = 2**18        # decoded and down-mixed a block at a time: no file's channels are held all at once


def duration_text(seconds: float) -> str:
    """A length as a person says it: '45 s', '10 min', '2 min 30 s'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min" + (f" {rest} s" if rest else "")


FORMATS = "WAV, FLAC, MP3, OGG/Opus, M4A/AAC, WebM or MP4"
# What FFmpeg may open an upload as: containers of recorded sound (and video), never a playlist or another format
# that reads further files or URLs (HLS, concat), and only from the file itself
FFMPEG_OPTIONS = {"protocol_whitelist": "file", "enable_drefs": "0",   # no MOV references to other files either
                  "format_whitelist": "mov,mp4,m4a,3gp,matroska,webm,aac,asf,amr,ogg,mp3,wav,w64,flac,caf,aiff,avi"}


def size_text(size: int) -> str:
    """A file's size as a person reads it: '40 KB', '25.0 MB'."""
    return f"{size / 2**10:.0f} KB" if size < 2**20 else f"{size / 2**20:.1f} MB"


def load_audio(path: str | os.PathLike | None, *, max_seconds: float | None = None,
               max_file_size: str | int | None = None) -> np.ndarray:
    """float32 mono samples at 16 kHz. Raises InputError with what to do for missing, too large (past
    `max_file_size`, where given: a server's), undecodable, too long, too short or silent audio. The size and the
    length (from the file's header) are checked before anything is decoded."""
    max_seconds = limits_from_env().max_audio_s if max_seconds is None else max_seconds
    if path is None or str(path).strip() == "":
        raise InputError("no audio: upload a clip or record one with the microphone")
    path = Path(path)
    if not path.is_file():
        raise InputError(f"the audio file {path.name!r} is missing; upload it again")
    if max_file_size is not None and (size := path.stat().st_size) > (allowed := file_size_bytes(max_file_size)):
        raise InputError(f"the file is {size_text(size)}; the limit is {size_text(allowed)} "
                         "(ASSISTGEN_MAX_FILE_SIZE): trim it or export it compressed (FLAC, MP3)")
    mono, rate = _decode(path, max_seconds)
    seconds = len(mono) / rate
    if seconds > max_seconds:  # formats whose header does not state a length
        raise InputError(f"the recording is longer than the {duration_text(max_seconds)} limit: trim it or split it")
    if seconds < MIN_SECONDS:
        raise InputError(f"the clip is {seconds * 1000:.0f} ms long; record at least {MIN_SECONDS:.1f} s of speech")
    if not np.isfinite(mono).all():
        raise InputError(f"{path.name!r} holds samples that are not numbers (damaged); export it again")
    if float(np.abs(mono).max()) < SILENCE_PEAK:
        raise InputError("the clip is silent: check the microphone or pick another file")
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


def _too_long(duration: float | None, max_seconds: float) -> None:
    if duration is not None and duration > max_seconds:
        raise InputError(f"the recording is {duration_text(duration)} long; the limit is {duration_text(max_seconds)} "
                         "(ASSISTGEN_MAX_AUDIO_SECONDS): trim it or split it")


def _check_rate(rate: int) -> None:
    if rate > MAX_SAMPLE_RATE:
        raise InputError(f"the recording is sampled at {rate:,} Hz; the most this app reads is {MAX_SAMPLE_RATE:,} "
                         "Hz: export it at 48 kHz or lower")


def _check_complete(path: Path, decoded: int, expected: int, rate: int) -> None:
    if decoded == 0:
        raise InputError(f"{path.name!r} holds no audio samples: record again, or pick a clip with sound in it")
    if decoded < 0.9 * expected:  # e.g. an MP3 cut short: its header promises more than is there
        raise InputError(f"{path.name!r} is damaged or truncated: its header promises {expected / rate:.1f} s but "
                         f"only {decoded / rate:.1f} s can be decoded; export it again")


def _decode(path: Path, max_seconds: float) -> tuple[np.ndarray, int]:
    """(mono samples, float32, the channels averaged; sample rate), at most `max_seconds` + 1 s of them: libsndfile
    for WAV, FLAC, MP3 and OGG (Vorbis, Opus); FFmpeg (PyAV) for what it cannot read, such as a phone's M4A (AAC), a
    browser's WebM recording or a video's sound track."""
    try:
        info = sf.info(str(path))
    except Exception:
        return _decode_with_ffmpeg(path, max_seconds)
    _check_rate(info.samplerate)
    _too_long(info.frames / info.samplerate if info.samplerate and info.frames > 0 else None, max_seconds)
    limit = int((max_seconds + 1) * info.samplerate)
    try:
        with sf.SoundFile(str(path)) as file:
            blocks, decoded = [], 0
            while decoded < limit:
                block = file.read(min(BLOCK_FRAMES, limit - decoded), dtype="float32", always_2d=True)
                if not len(block):
                    break
                blocks.append(block.mean(axis=1))
                decoded += len(block)
            rate = file.samplerate
    except Exception:
        raise InputError(f"{path.name!r} is damaged or truncated and cannot be decoded; export it again") from None
    mono = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
    _check_complete(path, len(mono), min(info.frames, limit) if info.frames > 0 else 0, rate)
    return mono, rate


def _decode_with_ffmpeg(path: Path, max_seconds: float) -> tuple[np.ndarray, int]:
    undecodable = InputError(f"{path.name!r} is damaged, or not audio this app can decode; use {FORMATS}")
    try:
        import av
    except ImportError:   # an install without PyAV: libsndfile's formats only
        raise undecodable from None
    try:   # an absolute path: a name with a colon ("take:2.m4a") would read as a protocol
        container = av.open(str(path.resolve()), options=FFMPEG_OPTIONS)
    except Exception:
        raise undecodable from None
    with container:
        if not container.streams.audio:
            raise InputError(f"{path.name!r} has no sound track; upload a recording with sound")
        stream = container.streams.audio[0]
        rate = stream.rate
        if not rate:
            raise undecodable
        _check_rate(rate)
        duration = _stated_seconds(container, stream)
        _too_long(duration, max_seconds)
        limit = int((max_seconds + 1) * rate)
        chunks, decoded, resampler, shape = [], 0, None, None

        def mono(frames) -> list[np.ndarray]:   # channels averaged, as libsndfile's samples are
            return [out.to_ndarray().reshape(-1, len(out.layout.channels)).mean(axis=1) for out in frames]
        try:
            for frame in container.decode(stream):
                # float32 at the first frame's rate; a stream whose layout or rate changes midway gets a resampler
                # for its new frames
                if (frame.format.name, frame.layout.name, frame.sample_rate) != shape:
                    if resampler is not None:
                        chunks += mono(resampler.resample(None))
                    resampler = av.AudioResampler(format="flt", layout=frame.layout.name, rate=rate)
                    shape = (frame.format.name, frame.layout.name, frame.sample_rate)
                new = mono(resampler.resample(frame))
                chunks += new
                decoded += sum(len(c) for c in new)
                if decoded > limit:
                    break
            if resampler is not None:
                chunks += mono(resampler.resample(None))
        except MemoryError:
            raise
        except Exception:
            if not chunks:
                raise undecodable from None
            raise InputError(f"{path.name!r} is damaged or truncated and cannot be decoded; export it again") from None
    samples = np.concatenate(chunks)[:limit] if chunks else np.zeros(0, np.float32)
    _check_complete(path, len(samples), min(int(duration * rate), limit) if duration else 0, rate)
    return samples, rate


# Containers whose length FFmpeg guesses from the bitrate of the first packets (a raw AAC or AMR stream, an MP3
# without an index): a quiet start made a 40 s clip read as 17 minutes. Their length is known only once decoded.
_GUESSED_LENGTH = {"aac", "amr", "mp3"}


def _stated_seconds(container, stream) -> float | None:
    """The sound track's length as its container states it: the stream's own (a video may run longer than its sound),
    else the container's; None where there is none, or only a guess."""
    if set(container.format.name.split(",")) & _GUESSED_LENGTH:
        return None
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return container.duration / 1e6 if container.duration else None   # microseconds
