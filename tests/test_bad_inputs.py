"""The bad-input suite: artifacts, feeds, command lines and builds that a careless user or an attacker gives.

Every case must end in a refusal that is one line naming the problem (a typed error from the API,
`error: …` and exit code 2 from the CLI), or in the right answer: never a crash, a hang (every
subprocess has a timeout) or a silently different result. The artifacts are the fabricated one of
tests/fixtures_runtime (a hand-written plan, no TVM), built once per session and copied per case.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures_runtime"))
import fabricate  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120
X = np.arange(6, dtype=np.float32).reshape(2, 3)
K = np.array([3], dtype=np.int32)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to compile the fake plan")


# ---- fixtures and helpers ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fabricated artifact folder, built once (its plan is compiled with gcc)."""
    return fabricate.make_artifact(tmp_path_factory.mktemp("bad_inputs") / "model")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TLMPACK_CACHE", str(d))  # for the CLI subprocesses too
    return d


@pytest.fixture
def art(tmp_path: Path, template: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "model"))


@pytest.fixture
def tar(art: Path, tmp_path: Path) -> Path:
    return fabricate.make_tar(art, tmp_path / "model.tar")


@pytest.fixture
def model(art: Path):
    with rt.load(art) as m:
        yield m


def cli(*args: str | os.PathLike[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tlmpack.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(REPO)))


PROGRESS = re.compile(r"^\[\s*\d+\.\ds\] ")  # build's progress lines, before its error


def assert_refused(proc: subprocess.CompletedProcess, *words: str, progress: bool = False) -> str:
    """Exit code 2 and one line on stderr, `error: …`, naming every word given (after build progress lines)."""
    lines = proc.stderr.splitlines()
    if progress:
        lines = [line for line in lines if not PROGRESS.match(line)]
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout, (proc.stdout, proc.stderr)
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def assert_one_line(exc: BaseException, *words: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    for w in words:
        assert w in text, (w, text)


def flip_byte(path: Path, at: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_manifest(art: Path, change: Callable[[dict], None]) -> None:
    """Changes the manifest and re-records SHA256SUMS, as a consistent but wrong artifact would be."""
    m = fabricate.read_manifest(art)
    change(m)
    fabricate.write_manifest(art, m)


def raw_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


# ---- artifacts: every way to be broken or hostile ------------------------------------------------------

def _damaged_header(art: Path, tmp: Path) -> Path:
    tar = fabricate.make_tar(art, tmp / "model.tar")
    data = bytearray(tar.read_bytes())
    with tarfile.open(tar) as tf:
        second = tf.getmembers()[3].offset  # a header in the middle of the archive
    data[second + 20] ^= 0xFF  # its name: the header checksum no longer matches
    tar.write_bytes(bytes(data))
    return tar


def _truncated(art: Path, tmp: Path) -> Path:
    tar = fabricate.make_tar(art, tmp / "model.tar")
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    return tar


def _tar_without(name: str) -> Callable[[Path, Path], Path]:
    def make(art: Path, tmp: Path) -> Path:
        (art / name).unlink()
        return fabricate.make_tar(art, tmp / "model.tar")
    return make


def _write(rel: str, data: bytes) -> Callable[[Path, Path], Path]:
    def make(art: Path, tmp: Path) -> Path:
        (art / rel).write_bytes(data)
        return art
    return make


def _manifest(change: Callable[[dict], None]) -> Callable[[Path, Path], Path]:
    def make(art: Path, tmp: Path) -> Path:
        edit_manifest(art, change)
        return art
    return make


def _manifest_json(value: object) -> Callable[[Path, Path], Path]:
    """A manifest.json of other bytes, with SHA256SUMS agreeing, so the parser itself is what refuses."""
    def make(art: Path, tmp: Path) -> Path:
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        (art / "manifest.json").write_bytes(raw)
        sums = [line for line in (art / "SHA256SUMS").read_text().splitlines() if not line.endswith("  manifest.json")]
        sums.append(f"{fabricate.sha256(art / 'manifest.json')}  manifest.json")
        (art / "SHA256SUMS").write_text("\n".join(sorted(sums, key=lambda s: s[66:])) + "\n")
        return art
    return make


def _sums(transform: Callable[[str], str]) -> Callable[[Path, Path], Path]:
    def make(art: Path, tmp: Path) -> Path:
        sums = art / "SHA256SUMS"
        sums.write_text(transform(sums.read_text()))
        return art
    return make


def _tampered_manifest(art: Path, tmp: Path) -> Path:
    m = fabricate.read_manifest(art)
    m["outputs"][0]["shape"] = [3, 2]
    (art / "manifest.json").write_text(json.dumps(m))  # SHA256SUMS still vouches for the old one
    return art


def _extra_file(art: Path, tmp: Path) -> Path:
    (art / "x86" / "evil.so").write_bytes(b"\x7fELF not listed anywhere")
    return art


def _symlink(art: Path, tmp: Path) -> Path:
    os.symlink("/etc/passwd", art / "passwd")
    return art


def _link_instead_of_listed(art: Path, tmp: Path) -> Path:
    (art / "weights.bin").unlink()
    os.symlink("/dev/zero", art / "weights.bin")
    return art


def _hostile_member(info: tarfile.TarInfo, data: bytes = b"") -> Callable[[Path, Path], Path]:
    def make(art: Path, tmp: Path) -> Path:
        return fabricate.make_tar(art, tmp / "model.tar", [(info, data)])
    return make


def _tar_info(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", size: int = 1) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, size if kind == tarfile.REGTYPE else 0
    return info


def _duplicate_member(art: Path, tmp: Path) -> Path:
    data = (art / "weights.bin").read_bytes()
    info = _tar_info("weights.bin", size=len(data))
    return fabricate.make_tar(art, tmp / "model.tar", [(info, bytes(len(data)))])


def _not_regular(art: Path, tmp: Path) -> Path:
    fifo = tmp / "model.fifo"
    os.mkfifo(fifo)
    return fifo


def _empty_folder(art: Path, tmp: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


def _rehashed(rel: str, data: bytes | Callable[[bytes], bytes]) -> Callable[[Path, Path], Path]:
    """A file replaced and every hash re-recorded: only the runtime's own checks can refuse it."""
    def make(art: Path, tmp: Path) -> Path:
        p = art / rel
        p.chmod(0o644)
        p.write_bytes(data(p.read_bytes()) if callable(data) else data)
        fabricate.rehash(art, fabricate.read_manifest(art))
        return art
    return make


def _flipped(rel: str) -> Callable[[Path, Path], Path]:
    def make(art: Path, tmp: Path) -> Path:
        flip_byte(art / rel, 3)
        return art
    return make


def _deep_json() -> bytes:
    return b"[" * 100_000 + b"]" * 100_000


ARTIFACT_CASES: dict[str, tuple[Callable[[Path, Path], Path], type[Exception], tuple[str, ...]]] = {
    "empty-file": (lambda a, t: _write_file(t / "m.tar", b""), rt.ArtifactError, ("empty file",)),
    "random-bytes": (lambda a, t: _write_file(t / "m.tar", np.random.default_rng(1).bytes(5000)), rt.ArtifactError,
                     ("not a readable tar archive",)),
    "damaged-tar-header": (_damaged_header, rt.ArtifactError, ("the archive is damaged",)),
    "truncated-tar": (_truncated, rt.ArtifactError, ("damaged",)),
    "tar-without-manifest": (_tar_without("manifest.json"), rt.ArtifactError, ("manifest.json",)),
    "tar-without-sha256sums": (_tar_without("SHA256SUMS"), rt.ArtifactError, ("no SHA256SUMS", "not a tlmpack artifact")),
    "tar-of-something-else": (lambda a, t: raw_tar(t / "m.tar", [("README", b"hello")]), rt.ArtifactError,
                              ("no manifest.json and no SHA256SUMS",)),
    "manifest-not-json": (_manifest_json(b"{not json"), rt.ArtifactError, ("manifest.json", "not valid JSON")),
    "manifest-a-list": (_manifest_json([1, 2]), rt.ArtifactError, ("expected a JSON object, found list",)),
    "manifest-nested-deeply": (_manifest_json(_deep_json()), rt.ArtifactError, ("not valid JSON",)),
    "manifest-huge": (_manifest_json(b" " * (17 << 20) + b"{}"), rt.ArtifactError, ("expected at most",)),
    "manifest-not-utf8": (_manifest_json(b"\xff\xfe{}"), rt.ArtifactError, ("not valid JSON",)),
    "manifest-of-another-format": (_manifest(lambda m: m.update(format="onnx")), rt.ArtifactError,
                                   ("format is 'onnx', expected 'tlmpack'",)),
    "format-version-newer": (_manifest(lambda m: m.update(format_version=99)), rt.ArtifactError,
                             ("format_version 99", "upgrade tlmpack")),
    "format-version-older": (_manifest(lambda m: m.update(format_version=1)), rt.ArtifactError,
                             ("format_version 1", "rebuild it")),
    "format-version-a-string": (_manifest(lambda m: m.update(format_version="1")), rt.ArtifactError,
                                ("format_version '1' is not supported",)),
    "format-version-true": (_manifest(lambda m: m.update(format_version=True)), rt.ArtifactError,
                            ("format_version True",)),
    "manifest-tampered": (_tampered_manifest, rt.ArtifactError, ("manifest.json: sha256 mismatch",)),
    "sha256sums-without-manifest": (_sums(lambda s: "".join(x for x in s.splitlines(True) if "manifest.json" not in x)),
                                    rt.ArtifactError, ("does not list manifest.json",)),
    "sha256sums-malformed-line": (_sums(lambda s: s + "deadbeef  weights.bin\n"), rt.ArtifactError,
                                  ("SHA256SUMS", "is not '<sha256>  <path>'")),
    "sha256sums-not-hex": (_sums(lambda s: s + "z" * 64 + "  extra.bin\n"), rt.ArtifactError, ("is not '<sha256>  <path>'",)),
    "sha256sums-lists-a-file-twice": (_sums(lambda s: s + s.splitlines(True)[0]), rt.ArtifactError, ("a second time",)),
    "sha256sums-missing": (lambda a, t: ((a / "SHA256SUMS").unlink(), a)[1], rt.ArtifactError, ("no SHA256SUMS",)),
    "sha256sums-not-utf8": (lambda a, t: _write_file(a / "SHA256SUMS", (a / "SHA256SUMS").read_bytes() + b"\xff\n").parent,
                            rt.ArtifactError, ("SHA256SUMS", "not UTF-8")),
    "unlisted-file": (_extra_file, rt.ArtifactError, ("x86/evil.so", "not listed in SHA256SUMS")),
    "symlink-in-folder": (_symlink, rt.ArtifactError, ("passwd", "not listed")),
    "listed-file-is-a-link": (_link_instead_of_listed, rt.ArtifactError, ("weights.bin", "a link")),
    "weights-flipped": (_flipped("weights.bin"), rt.ArtifactError, ("weights.bin", "sha256 mismatch")),
    "weights-truncated-and-rehashed": (_rehashed("weights.bin", lambda b: b[:32]), rt.ArtifactError,
                                       ("weights.bin", "expected 64 bytes")),
    "weights-changed-and-rehashed": (_rehashed("weights.bin", lambda b: bytes(len(b))), rt.ArtifactError,
                                     ("weights.bin", "sha256 mismatch")),
    "model-library-flipped": (_flipped("x86/model.so"), rt.ArtifactError, ("x86/model.so: sha256 mismatch",)),
    "model-library-not-elf": (_rehashed("x86/model.so", b"not an ELF file"), rt.IncompatibleTargetError,
                              ("x86/model.so", "cannot load")),
    "model-library-missing": (lambda a, t: ((a / "x86" / "model.so").unlink(), a)[1], rt.ArtifactError,
                              ("x86/model.so: listed in manifest.json but missing",)),
    "files-entry-escapes": (_manifest(lambda m: m["files"].update({"../evil": "0" * 64})), rt.ArtifactError,
                            ("'../evil' escapes the artifact folder",)),
    "files-entry-absolute": (_manifest(lambda m: m["files"].update({"/etc/passwd": "0" * 64})), rt.ArtifactError,
                             ("is an absolute path",)),
    "files-lists-sha256sums": (_manifest(lambda m: m["files"].update({"SHA256SUMS": "0" * 64})), rt.ArtifactError,
                               ("cannot hash itself",)),
    "files-empty": (_manifest(lambda m: m.update(files={})), rt.ArtifactError, ("'files' must be a non-empty object",)),
    "targets-empty": (_manifest(lambda m: m.update(targets=[])), rt.ArtifactError, ("'targets' must be a non-empty list",)),
    "target-of-unknown-kind": (_manifest(lambda m: m["targets"][0].update(kind="tpu")), rt.IncompatibleTargetError,
                               ("no x86 target",)),
    "target-file-not-hashed": (_manifest(lambda m: m["targets"][0]["files"].append("x86/other.so")), rt.ArtifactError,
                               ("x86/other.so", "not hashed")),
    "cpu-feature-missing": (_manifest(lambda m: m["targets"][0].update(cpu_features=["avx9000"])),
                            rt.IncompatibleTargetError, ("avx9000",)),
    "input-dtype-unknown": (_manifest(lambda m: m["inputs"][0].update(dtype="complex64")), rt.ArtifactError,
                            ("dtype 'complex64'",)),
    "input-dtype-a-list": (_manifest(lambda m: m["inputs"][0].update(dtype=["float32"])), rt.ArtifactError,
                           ("dtype ['float32']",)),
    "model-not-an-object": (_manifest(lambda m: m.update(model="resnet")), rt.ArtifactError,
                            ("'model' must be an object",)),
    "input-shape-negative": (_manifest(lambda m: m["inputs"][0].update(shape=[-1, 3])), rt.ArtifactError,
                             ("shape [-1, 3]",)),
    "input-names-repeat": (_manifest(lambda m: m["inputs"][1].update(name="x")), rt.ArtifactError, ("appears twice",)),
    "outputs-empty": (_manifest(lambda m: m.update(outputs=[])), rt.ArtifactError, ("'outputs' must be a non-empty list",)),
    "manifest-disagrees-with-plan": (_manifest(lambda m: m["outputs"][0].update(shape=[3, 2])), rt.ArtifactError,
                                     ("disagree about output 0",)),
    "tar-entry-escapes": (_hostile_member(_tar_info("../evil"), b"x"), rt.ArtifactError, ("escapes the artifact folder",)),
    "tar-entry-absolute": (_hostile_member(_tar_info("/tmp/evil"), b"x"), rt.ArtifactError, ("is an absolute path",)),
    "tar-symlink": (_hostile_member(_tar_info("x86/l.so", tarfile.SYMTYPE, "model.so")), rt.ArtifactError,
                    ("is a symbolic link",)),
    "tar-hardlink": (_hostile_member(_tar_info("w2.bin", tarfile.LNKTYPE, "weights.bin")), rt.ArtifactError,
                     ("is a hard link",)),
    "tar-device": (_hostile_member(_tar_info("null", tarfile.CHRTYPE)), rt.ArtifactError, ("is a character device",)),
    "tar-fifo": (_hostile_member(_tar_info("pipe", tarfile.FIFOTYPE)), rt.ArtifactError, ("is a FIFO",)),
    "tar-duplicate-entry": (_duplicate_member, rt.ArtifactError, ("'weights.bin' appears twice",)),
    "not-a-regular-file": (_not_regular, rt.ArtifactError, ("not a regular file or folder",)),
    "no-such-path": (lambda a, t: t / "nope.tar", rt.ArtifactError, ("no such file or directory",)),
    "empty-folder": (_empty_folder, rt.ArtifactError, ("no manifest.json", "not a tlmpack artifact")),
}


def _write_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", list(ARTIFACT_CASES))
def test_bad_artifact_is_refused_in_one_line_naming_the_problem(case: str, art: Path, tmp_path: Path) -> None:
    make, error, words = ARTIFACT_CASES[case]
    path = make(art, tmp_path)
    with pytest.raises(error) as e:
        rt.load(path, device="cpu")
    assert_one_line(e.value, *words)


def test_damaged_tar_header_is_not_mistaken_for_a_missing_manifest(art: Path, tmp_path: Path) -> None:
    tar = _damaged_header(art, tmp_path)
    with pytest.raises(rt.ArtifactError) as e:
        rt.load(tar)
    assert "not a tlmpack artifact" not in str(e.value) and "damaged" in str(e.value)


def test_tar_that_hides_a_member_behind_a_damaged_header_leaves_nothing_in_the_cache(
        art: Path, tmp_path: Path, cache: Path) -> None:
    with pytest.raises(rt.ArtifactError):
        rt.load(_damaged_header(art, tmp_path))
    assert not list((cache / "artifacts").glob("*"))


def test_tampered_cache_entry_is_caught_on_the_next_load(tar: Path, cache: Path) -> None:
    with rt.load(tar) as m:
        cached = m.path
    lib = cached / "x86" / "model.so"
    lib.chmod(0o644)
    flip_byte(lib, 100)
    with pytest.raises(rt.ArtifactError, match=r"x86/model\.so: sha256 mismatch"):
        rt.load(tar)


def test_cached_files_are_read_only(tar: Path) -> None:
    with rt.load(tar) as m:
        assert not os.access(m.path / "weights.bin", os.W_OK) or os.geteuid() == 0
        assert (m.path / "weights.bin").stat().st_mode & 0o222 == 0


def test_load_leaves_no_private_copy_behind(art: Path, cache: Path) -> None:
    rt.load(art).close()
    assert not list((cache / "open").glob("*"))


def test_check_reports_a_flipped_weight_byte_without_loading_the_c_runtime(art: Path) -> None:
    flip_byte(art / "weights.bin", 3)
    report = rt.check(art)
    assert len(report.problems) == 1
    assert_one_line(report.problems[0], "weights.bin: sha256 mismatch")


# ---- feeds: wrong values never run, odd but valid ones give the right answer ---------------------------

def expected(x: np.ndarray = X, k: np.ndarray = K) -> tuple[np.ndarray, np.ndarray]:
    y = x + fabricate.WEIGHTS
    return y, y * k[0]


FEED_CASES: dict[str, tuple[Callable[[rt.Model], object], type[Exception], tuple[str, ...]]] = {
    "wrong-dtype": (lambda m: m.run(None, {"x": X.astype(np.float64), "k": K}), rt.InputError,
                    ("input 'x'", "expected dtype float32, got float64")),
    "wrong-shape": (lambda m: m.run(None, {"x": X.reshape(3, 2), "k": K}), rt.InputError,
                    ("expected shape (2, 3), got (3, 2)",)),
    "scalar-for-a-vector": (lambda m: m.run(None, {"x": X, "k": np.int32(3)}), rt.InputError,
                            ("input 'k'", "expected shape (1,), got ()")),
    "missing-input": (lambda m: m.run(None, {"x": X}), rt.InputError, ("missing input 'k'",)),
    "unknown-input": (lambda m: m.run(None, {"x": X, "k": K, "q": K}), rt.InputError, ("unknown input 'q'",)),
    "unknown-output": (lambda m: m.run(["w"], {"x": X, "k": K}), rt.InputError, ("unknown output 'w'",)),
    "output-names-a-string": (lambda m: m.run("y", {"x": X, "k": K}), rt.InputError, ("not the string 'y'",)),
    "feed-not-a-dict": (lambda m: m.run(None, [X, K]), rt.InputError, ("feed must be a dict",)),
    "floats-for-an-int-input": (lambda m: m.run(None, {"x": X, "k": [2.5]}), rt.InputError,
                                ("input 'k'", "expected dtype int32, got float64")),
    "int-out-of-range": (lambda m: m.run(None, {"x": X, "k": [2**40]}), rt.InputError, ("does not fit in int32",)),
    "object-array": (lambda m: m.run(None, {"x": np.array([[1, 2, 3], [4, 5, "a"]], dtype=object), "k": K}),
                     rt.InputError, ("expected dtype float32, got object",)),
    "big-endian-array": (lambda m: m.run(None, {"x": X.astype(">f4"), "k": K}), rt.InputError,
                         ("float32 (big-endian)",)),
    "bool-for-float": (lambda m: m.run(None, {"x": X > 2, "k": K}), rt.InputError, ("got bool",)),
    "strings": (lambda m: m.run(None, {"x": np.array([["a"] * 3] * 2), "k": K}), rt.InputError, ("expected dtype float32",)),
    "given-twice": (lambda m: m({"x": X, "k": K}, x=X), rt.InputError, ("input 'x' given twice",)),
    "positional-array": (lambda m: m(X), rt.InputError, ("pass inputs by name",)),
    "cuda-output-from-cpu-model": (lambda m: m.run(None, {"x": X, "k": K}, output_device="cuda"), rt.InputError,
                                   ("runs on cpu",)),
    "unknown-output-device": (lambda m: m.run(None, {"x": X, "k": K}, output_device="tpu"), ValueError,
                              ("output_device must be 'cpu' or 'cuda'",)),
}


@pytest.mark.parametrize("case", list(FEED_CASES))
def test_bad_feed_is_refused_in_one_line_naming_the_input(case: str, model: rt.Model) -> None:
    call, error, words = FEED_CASES[case]
    with pytest.raises(error) as e:
        call(model)
    assert_one_line(e.value, *words)


def test_model_still_runs_correctly_after_refused_feeds(model: rt.Model) -> None:
    for call, error, _ in FEED_CASES.values():
        with pytest.raises(error):
            call(model)
    y, z = model.run(None, {"x": X, "k": K})
    np.testing.assert_array_equal(y, expected()[0])
    np.testing.assert_array_equal(z, expected()[1])


def test_nan_and_inf_inputs_propagate_instead_of_being_refused(model: rt.Model) -> None:
    x = X.copy()
    x[0, 0], x[1, 2] = np.nan, np.inf
    y, z = model.run(None, {"x": x, "k": K})
    ey, ez = expected(x)
    np.testing.assert_array_equal(y, ey)
    np.testing.assert_array_equal(z, ez)


def test_non_contiguous_and_misaligned_inputs_give_the_same_answer(model: rt.Model) -> None:
    strided = np.asfortranarray(X)
    buf = np.zeros(X.size * 4 + 1, dtype=np.uint8)[1:].view(np.float32).reshape(2, 3)  # not 4-byte aligned
    buf[...] = X
    for x in (strided, buf, X[:, ::-1][:, ::-1]):
        y, z = model.run(None, {"x": x, "k": K})
        np.testing.assert_array_equal(z, expected()[1])


def test_closed_model_refuses_to_run(art: Path) -> None:
    m = rt.load(art)
    m.close()
    with pytest.raises(rt.TlmpackError) as e:
        m.run(None, {"x": X, "k": K})
    assert_one_line(e.value, "closed")


@pytest.mark.parametrize("threads", [0, -1, True, 2.5, "2"])
def test_bad_num_threads_is_a_value_error(art: Path, threads: object) -> None:
    with pytest.raises(ValueError, match="num_threads must be a positive integer"):
        rt.load(art, num_threads=threads)  # type: ignore[arg-type]


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "", 0])
def test_bad_device_is_a_value_error(art: Path, device: object) -> None:
    with pytest.raises(ValueError, match="device must be"):
        rt.load(art, device=device)  # type: ignore[arg-type]


# ---- the command line ------------------------------------------------------------------------------------

def test_cli_run_with_an_unknown_device_is_one_line(tar: Path) -> None:
    assert_refused(cli("run", tar, "--random-inputs", "--device", "tpu"), "--device", "'tpu'")


@pytest.mark.parametrize("threads", ["0", "-3", "many"])
def test_cli_run_with_bad_threads_is_one_line(tar: Path, threads: str) -> None:
    assert_refused(cli("run", tar, "--random-inputs", "--threads", threads), "--threads")


def test_cli_run_save_under_a_file_is_refused_before_running(tar: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    line = assert_refused(cli("run", tar, "--random-inputs", "--save", tmp_path / "file" / "out"), "is a file")
    assert "--save" in line


def test_cli_run_save_onto_a_file_is_one_line(tar: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert_refused(cli("run", tar, "--random-inputs", "--save", tmp_path / "file"), "--save")


def test_cli_input_that_is_not_npy_says_so_without_numpys_pickle_text(tar: Path, tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(np.random.default_rng(0).bytes(100))
    line = assert_refused(cli("run", tar, "--input", f"x=@{tmp_path / 'x.bin'}", "--random-inputs"),
                          "--input x", "is not a .npy file")
    assert "pickle" not in line


def test_cli_input_npz_archive_says_so(tar: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", x=X)
    assert_refused(cli("run", tar, "--input", f"x=@{tmp_path / 'x.npz'}"), "a .npz archive")


def test_cli_input_with_python_objects_is_refused(tar: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    line = assert_refused(cli("run", tar, "--input", f"x=@{tmp_path / 'x.npy'}"), "holds Python objects")
    assert "allow_pickle" not in line


def test_cli_input_truncated_npy_is_one_line(tar: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", X)
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(data[: len(data) - 8])
    assert_refused(cli("run", tar, "--input", f"x=@{tmp_path / 'x.npy'}"), "--input x", "damaged .npy")


def test_cli_input_missing_file_is_one_line(tar: Path, tmp_path: Path) -> None:
    assert_refused(cli("run", tar, "--input", f"x=@{tmp_path / 'none.npy'}"), "--input x", "cannot read")


@pytest.mark.parametrize("item", ["x", "x=file.npy", "=@x.npy", "x=@"])
def test_cli_malformed_input_option_is_one_line(tar: Path, item: str) -> None:
    assert_refused(cli("run", tar, "--input", item), "expected NAME=@FILE.npy")


def test_cli_input_given_twice_is_one_line(tar: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", X)
    assert_refused(cli("run", tar, "--input", f"x=@{tmp_path / 'x.npy'}", "--input", f"x=@{tmp_path / 'x.npy'}"),
                   "given twice")


def test_cli_input_of_the_wrong_dtype_names_the_input(tar: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", X.astype(np.float64))
    assert_refused(cli("run", tar, "--input", f"x=@{tmp_path / 'x.npy'}", "--random-inputs"),
                   "input 'x'", "expected dtype float32, got float64")


def test_cli_input_of_an_unknown_name_lists_the_inputs(tar: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", X)
    assert_refused(cli("run", tar, "--input", f"nope=@{tmp_path / 'x.npy'}"), "no input 'nope'", "its inputs are: x, k")


def test_cli_run_without_inputs_says_how_to_give_them(tar: Path) -> None:
    assert_refused(cli("run", tar), "no value for inputs 'x', 'k'", "--random-inputs")


@pytest.mark.parametrize("command", ["run", "inspect", "check"])
def test_cli_on_an_empty_file_is_one_line(command: str, tmp_path: Path) -> None:
    (tmp_path / "m.tar").write_bytes(b"")
    proc = cli(command, tmp_path / "m.tar")
    if command == "check":
        assert proc.returncode == 2 and "empty file" in proc.stdout, proc.stdout + proc.stderr
    else:
        assert_refused(proc, "empty file")


@pytest.mark.parametrize("command", ["run", "inspect"])
def test_cli_on_a_damaged_tar_says_the_archive_is_damaged(command: str, art: Path, tmp_path: Path) -> None:
    assert_refused(cli(command, _damaged_header(art, tmp_path)), "the archive is damaged")


def test_cli_inspect_refuses_a_manifest_sha256sums_does_not_vouch_for(art: Path, tmp_path: Path) -> None:
    tar = fabricate.make_tar(_tampered_manifest(art, tmp_path), tmp_path / "model.tar")
    assert_refused(cli("inspect", tar), "manifest.json is not the one SHA256SUMS vouches for")


def test_cli_inspect_escapes_control_characters_in_names(art: Path) -> None:
    edit_manifest(art, lambda m: m["inputs"][0].update(name="x\x1b[2J"))
    proc = cli("inspect", art)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\\x1b[2J" in proc.stdout


def test_cli_inspect_of_a_manifest_with_malformed_subgraphs_is_one_line(art: Path) -> None:
    edit_manifest(art, lambda m: m.update(subgraphs=[{"id": "k0"}]))
    assert_refused(cli("inspect", art), "manifest.json has a malformed field")


def test_cli_check_of_a_tampered_artifact_exits_2_and_names_the_file(art: Path) -> None:
    flip_byte(art / "weights.bin")
    proc = cli("check", art)
    assert proc.returncode == 2 and "problem: weights.bin: sha256 mismatch" in proc.stdout, proc.stdout


def test_cli_save_keeps_output_files_inside_the_folder(art: Path, tmp_path: Path) -> None:
    edit_manifest(art, lambda m: m["outputs"][0].update(name="../../escaped"))
    proc = cli("run", art, "--random-inputs", "--save", tmp_path / "out")
    # the plan names the output 'y', so the manifest is refused; with a consistent name the file stays inside
    assert_refused(proc, "disagree about output 0")
    assert not (tmp_path / "escaped.npy").exists() and not (tmp_path.parent / "escaped.npy").exists()


def test_cli_output_file_names_cannot_escape_the_save_folder() -> None:
    from tlmpack.cli import _output_files

    assert _output_files(["../../etc/x", "a/b", "..", "y", "y"]) == [
        "_.._etc_x.npy", "a_b.npy", "output.npy", "y.npy", "y_2.npy"]


def test_cli_run_save_writes_every_output(tar: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "k.npy", K)
    proc = cli("run", tar, "--input", f"x=@{tmp_path / 'x.npy'}", "--input", f"k=@{tmp_path / 'k.npy'}",
               "--save", tmp_path / "out" / "sub")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "sub" / "y.npy"), expected()[0])
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "sub" / "z.npy"), expected()[1])


@pytest.mark.parametrize("args,words", [
    (["frobnicate"], ("No such command 'frobnicate'",)),
    (["run", "--bogus"], ("No such option", "--bogus")),
    (["run"], ("Missing argument 'ARTIFACT'",)),
    (["run", "/nonexistent/model.tar"], ("does not exist",)),
    (["bench", "/nonexistent/model.tar"], ("does not exist",)),
    (["inspect", "/nonexistent/model.tar"], ("does not exist",)),
])
def test_cli_usage_error_is_one_line(args: list[str], words: tuple[str, ...]) -> None:
    assert_refused(cli(*args), *words)


def test_cli_bench_with_zero_runs_is_one_line(tar: Path) -> None:
    assert_refused(cli("bench", tar, "--runs", "0"), "--runs")


def test_cli_check_with_an_unknown_device_is_one_line(tar: Path) -> None:
    assert_refused(cli("check", tar, "--device", "tpu"), "--device")


def test_cli_debug_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "m.tar").write_bytes(b"")
    proc = cli("--debug", "run", tmp_path / "m.tar")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "ArtifactError" in proc.stderr


# ---- build: refused before the long part, in one line ------------------------------------------------------

def test_build_output_under_a_file_is_refused_before_the_build(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "m.onnx").write_bytes(b"x")
    line = assert_refused(cli("build", tmp_path / "m.onnx", "-o", tmp_path / "file" / "m.tar"), "is a file")
    assert "--output" in line


def test_build_output_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"x")
    assert_refused(cli("build", tmp_path / "m.onnx", "-o", tmp_path), "--output")


def test_build_without_the_compiler_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"x")
    hide_tvm = ("import importlib.util as u, sys; real = u.find_spec; "
                "u.find_spec = lambda n, *a: None if n == 'tvm' else real(n, *a); "
                "from tlmpack.cli import main; main(sys.argv[1:])")
    proc = subprocess.run([sys.executable, "-c", hide_tvm, "build", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.tar")],
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert_refused(proc, "apache-tvm", "pip install 'tlmpack[compiler]'")


def test_build_of_a_garbage_pt2_is_one_line_without_torchs_traceback(tmp_path: Path) -> None:
    (tmp_path / "g.pt2").write_bytes(np.random.default_rng(0).bytes(3000))
    assert_refused(cli("build", tmp_path / "g.pt2", "-o", tmp_path / "g.tar"), "not a torch.export program",
                   "not a zip archive", progress=True)


def test_build_of_a_zip_that_is_not_a_pt2_is_one_line(tmp_path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(tmp_path / "z.pt2", "w") as z:
        z.writestr("hello.txt", "not a program")
    line = assert_refused(cli("build", tmp_path / "z.pt2", "-o", tmp_path / "z.tar"), "not a torch.export program",
                          progress=True)
    assert "warnings above" not in line


@pytest.mark.parametrize("args,words", [
    (["missing.onnx"], ("missing.onnx",)),
    (["garbage.onnx"], ("garbage.onnx",)),
    (["model.txt"], ("not a model tlmpack reads",)),
    (["garbage.onnx", "-t", "tpu"], ("unknown target", "tpu")),
    (["garbage.onnx", "--cuda-arch", "sm_90"], ("--cuda-arch is for the cuda target",)),
    (["garbage.onnx", "--input-shape", "x:abc"], ("x:abc",)),
    (["garbage.onnx", "--scheduler", "magic"], ("--scheduler",)),
    (["nomodule.nothere:factory"], ("cannot import the factory",)),
    (["garbage.onnx", "--disable-rules", "x86-magic"], ("unknown rule 'x86-magic'",)),
])
def test_bad_build_is_one_line(args: list[str], words: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "garbage.onnx").write_bytes(np.random.default_rng(0).bytes(500))
    (tmp_path / "model.txt").write_text("hello")
    assert_refused(cli("build", *args, "-o", tmp_path / "out.tar", cwd=tmp_path), *words, progress=True)


def test_a_folder_artifact_loads_when_the_cache_cannot_be_written(art: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("x")  # a cache under a file cannot be created, even by root
    monkeypatch.setenv("TLMPACK_CACHE", str(tmp_path / "file" / "cache"))
    with rt.load(art) as m:
        np.testing.assert_array_equal(m(x=X, k=K)[1], expected()[1])


def test_a_tar_with_an_unwritable_cache_says_to_set_tlmpack_cache(tar: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("TLMPACK_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(rt.ArtifactError) as e:
        rt.load(tar)
    assert_one_line(e.value, "cannot create the cache folder", "TLMPACK_CACHE")


def test_the_c_runtime_gets_only_the_files_it_opens() -> None:
    from tlmpack.runtime.stage import files_to_open

    files = {"weights.bin": "0" * 64, "x86/model.so": "1" * 64, "x86/weights.bin": "2" * 64, "cuda/plan.so": "3" * 64}
    manifest = {"files": files}
    assert files_to_open(manifest, {"files": ["x86/model.so"]}) == ["weights.bin", "x86/model.so"]
    assert files_to_open(manifest, {"files": ["x86/model.so", "x86/weights.bin"]}) == ["x86/model.so", "x86/weights.bin"]
    assert files_to_open(manifest, {"files": ["cuda/plan.so"]}) == ["cuda/plan.so", "weights.bin"]


def test_a_tampered_tar_cannot_poison_the_cache_for_the_genuine_one(art: Path, tmp_path: Path, cache: Path) -> None:
    genuine = fabricate.make_tar(art, tmp_path / "genuine.tar")
    flip_byte(art / "weights.bin", 7)  # the same SHA256SUMS, other weights
    tampered = fabricate.make_tar(art, tmp_path / "tampered.tar")
    with pytest.raises(rt.ArtifactError) as e:
        rt.load(tampered)
    assert_one_line(e.value, "tampered.tar: weights.bin: sha256 mismatch")
    assert not list((cache / "artifacts").glob("*"))
    with rt.load(genuine) as m:
        np.testing.assert_array_equal(m(x=X, k=K)[1], expected()[1])


def test_a_library_swapped_after_the_checks_is_not_the_one_loaded(art: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tlmpack.runtime import model as model_module

    checked = model_module.check

    def check_then_swap(*args: object, **kwargs: object):
        report = checked(*args, **kwargs)
        flip_byte(art / "x86" / "model.so", 200)  # what a writer of the folder could do between check and open
        return report

    monkeypatch.setattr(model_module, "check", check_then_swap)
    with pytest.raises(rt.ArtifactError) as e:
        rt.load(art)
    assert_one_line(e.value, "x86/model.so: sha256 mismatch")
