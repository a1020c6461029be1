"""The C runtime (runtime_c/) over a fake artifact: a hand-written plan with two packed kernels.

tests/c/fake_plan.c stands in for x86/model.so (TVM kernels + generated plan); tests/c/test_runtime.c
drives libtlmrt.so over it and prints what the checks here look at.

With TLMRT_SANITIZE set (e.g. "address,undefined"; tests/c/ci_sanitize.sh does), libtlmrt.so, the test
programs and the fake model libraries are all built with those sanitizers, and any report fails the test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_C = ROOT / "runtime_c"
TESTS_C = ROOT / "tests" / "c"
CC = os.environ.get("CC", "gcc")
SANITIZE = os.environ.get("TLMRT_SANITIZE", "")
SAN_FLAGS = (f"-fsanitize={SANITIZE}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer") if SANITIZE else ()
N = 1000
SCALE_OFFSET = 4032

pytestmark = pytest.mark.skipif(shutil.which(CC) is None, reason=f"needs a C compiler ({CC})")


def _cc(*args: str | Path) -> None:
    proc = subprocess.run([CC, *SAN_FLAGS, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


needs_plain_build = pytest.mark.skipif(bool(SANITIZE), reason="checks the plain build.sh library, not a sanitized one")


def _weights() -> bytes:
    data = bytearray(struct.pack(f"<{N}f", *(i * 0.25 for i in range(N))))
    data += bytes(SCALE_OFFSET - len(data))
    data += struct.pack("<f", 2.0)
    return bytes(data)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("libtlmrt")
    if SANITIZE:
        _cc("-std=c11", "-O1", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-o", out / "libtlmrt.so",
            *sorted(RUNTIME_C.glob("*.c")), "-lpthread", "-ldl")
        return out
    proc = subprocess.run(
        ["bash", str(RUNTIME_C / "build.sh"), str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def test_bin(lib_dir: Path) -> Path:
    exe = lib_dir / "test_runtime"
    _cc(
        "-std=c11",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{RUNTIME_C}",
        TESTS_C / "test_runtime.c",
        "-o",
        exe,
        f"-L{lib_dir}",
        "-ltlmrt",
        f"-Wl,-rpath,{lib_dir}",
        "-lpthread",
    )
    return exe


@pytest.fixture(scope="session")
def model_so(tmp_path_factory: pytest.TempPathFactory):
    """Builds x86/model.so from fake_plan.c with extra -D flags, once per set of flags."""
    root = tmp_path_factory.mktemp("model_so")
    built: dict[tuple[str, ...], Path] = {}

    def build(*defines: str, weights_sha: str | None = None) -> Path:
        flags = (f'-DFAKE_WEIGHTS_SHA="{weights_sha or _sha256(_weights())}"', *defines)
        if flags not in built:
            out = root / f"model{len(built)}.so"
            _cc(
                "-std=c11",
                "-O2",
                "-fPIC",
                "-shared",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Wl,-Bsymbolic",
                f"-I{RUNTIME_C}",
                *flags,
                TESTS_C / "fake_plan.c",
                "-o",
                out,
            )
            built[flags] = out
        return built[flags]

    return build


def write_sums(art: Path) -> None:
    files = sorted(p for p in art.rglob("*") if p.is_file() and p.name not in ("SHA256SUMS", "manifest.json"))
    lines = [f"{_sha256(p.read_bytes())}  {p.relative_to(art).as_posix()}\n" for p in files]
    (art / "SHA256SUMS").write_text("".join(lines))


@pytest.fixture
def artifact(tmp_path: Path, model_so):
    """An artifact directory with the fake model; extra -D flags pick a broken plan variant."""

    def make(*defines: str) -> Path:
        art = tmp_path / "art"
        (art / "x86").mkdir(parents=True)
        shutil.copyfile(model_so(*defines), art / "x86" / "model.so")
        (art / "weights.bin").write_bytes(_weights())
        (art / "manifest.json").write_text("{}\n")
        write_sums(art)
        return art

    return make


def run(test_bin: Path, art: Path, threads: int = 2, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(test_bin), str(art), str(threads), *extra], capture_output=True, text=True, timeout=120
    )


def line(out: str, prefix: str) -> str:
    found = [x for x in out.splitlines() if x.startswith(prefix)]
    assert found, out
    return found[0]


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("threads", [0, 1, 2, 4])
def test_fake_model_runs_every_parallel_task_once(test_bin, artifact, threads):
    proc = run(test_bin, artifact(), threads)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ALL_OK" in proc.stdout


def test_wrong_input_size_names_input_expected_and_given_bytes(test_bin, artifact):
    proc = run(test_bin, artifact())
    assert proc.returncode == 0, proc.stdout
    msg = line(proc.stdout, "WRONG_SIZE:")
    assert "(x)" in msg and "expected 4000 bytes, given 3996" in msg


def test_kernel_error_names_kernel_step_and_message(test_bin, artifact):
    proc = run(test_bin, artifact())
    assert proc.returncode == 0, proc.stdout
    msg = line(proc.stdout, "KERNEL:")
    assert "kernel fake_add (step 0) failed: ValueError: fake_add: sentinel input" in msg


def test_runs_without_file_verification(test_bin, artifact):
    proc = run(test_bin, artifact(), 2, "--no-verify")
    assert proc.returncode == 0, proc.stdout


def test_flipped_weights_byte_is_a_sha256_mismatch(test_bin, artifact):
    art = artifact()
    flip_byte(art / "weights.bin", 100)
    proc = run(test_bin, art)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    msg = line(proc.stdout, "OPEN_FAILED")
    assert "status=3" in msg and "weights.bin: sha256 mismatch (expected " in msg and "corrupted" in msg


def test_flipped_weights_byte_is_caught_by_the_plan_without_verification(test_bin, artifact):
    art = artifact()
    flip_byte(art / "weights.bin", 100)
    write_sums(art)  # SHA256SUMS agrees with the corrupted file; the plan's digest does not
    for extra in ((), ("--no-verify",)):
        proc = run(test_bin, art, 2, *extra)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        msg = line(proc.stdout, "OPEN_FAILED")
        assert "status=3" in msg and "from the plan" in msg, msg


def test_truncated_weights_names_expected_size(test_bin, artifact):
    art = artifact()
    (art / "weights.bin").write_bytes(_weights()[:-4])
    proc = run(test_bin, art, 2, "--no-verify")
    assert proc.returncode == 3
    assert "expected 4036 bytes (the plan's weights_bytes), found 4032" in line(proc.stdout, "OPEN_FAILED")


def test_flipped_model_so_byte_is_refused_before_loading(test_bin, artifact):
    art = artifact()
    flip_byte(art / "x86" / "model.so", 200)
    proc = run(test_bin, art)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    msg = line(proc.stdout, "OPEN_FAILED")
    assert "status=3" in msg and "x86/model.so: sha256 mismatch (expected " in msg


def test_missing_sha256sums_is_an_artifact_error(test_bin, artifact):
    art = artifact()
    (art / "SHA256SUMS").unlink()
    proc = run(test_bin, art)
    assert "status=3" in line(proc.stdout, "OPEN_FAILED") and "SHA256SUMS" in proc.stdout


@pytest.mark.parametrize("bad", ["../outside", "/etc/passwd", "x86/../weights.bin"])
def test_sha256sums_path_escaping_the_artifact_is_refused(test_bin, artifact, bad):
    art = artifact()
    with open(art / "SHA256SUMS", "a") as f:
        f.write(f"{'0' * 64}  {bad}\n")
    proc = run(test_bin, art)
    msg = line(proc.stdout, "OPEN_FAILED")
    assert "status=3" in msg and "refusing" in msg, msg


def test_sha256sums_must_list_the_model_library(test_bin, artifact):
    art = artifact()
    sums = (art / "SHA256SUMS").read_text().splitlines(keepends=True)
    (art / "SHA256SUMS").write_text("".join(x for x in sums if "model.so" not in x))
    msg = line(run(test_bin, art).stdout, "OPEN_FAILED")
    assert "status=3" in msg and "not x86/model.so" in msg


def test_malformed_sha256sums_line_is_quoted(test_bin, artifact):
    art = artifact()
    (art / "SHA256SUMS").write_text("deadbeef weights.bin\n")
    msg = line(run(test_bin, art).stdout, "OPEN_FAILED")
    assert "status=3" in msg and "line 1" in msg and "deadbeef weights.bin" in msg


def test_missing_model_library_is_an_io_error_without_verification(test_bin, artifact):
    art = artifact()
    (art / "x86" / "model.so").unlink()
    msg = line(run(test_bin, art, 2, "--no-verify").stdout, "OPEN_FAILED")
    assert "status=2" in msg and "x86/model.so" in msg


@pytest.mark.parametrize(
    ("define", "status", "words"),
    [
        ("-DFAKE_BAD_OFFSET", 3, ["plan tensor 3", "within the arena (12352 bytes)"]),
        ("-DFAKE_MISALIGNED", 3, ["plan tensor 2", "multiple of 64, found 4000"]),
        ("-DFAKE_BAD_ARG", 3, ["plan step 1 (fake_scale) argument 3", "expected 0..5, found 99"]),
        ("-DFAKE_ABI_VERSION=2", 4, ["plan ABI version 2", "reads version 1"]),
        ("-DFAKE_UNSUPPORTED_HOOK", 4, ["uses the TVM context hook __TVMFFIFunctionCall"]),
    ],
)
def test_inconsistent_plan_is_refused_with_a_sentence(test_bin, artifact, define, status, words):
    proc = run(test_bin, artifact(define))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    msg = line(proc.stdout, "OPEN_FAILED")
    assert f"status={status}" in msg, msg
    for w in words:
        assert w in msg, msg


@needs_plain_build
def test_library_exports_only_the_public_api(lib_dir):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm")
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(lib_dir / "libtlmrt.so")], capture_output=True, text=True, check=True
    ).stdout
    names = {x.split()[-1] for x in out.splitlines() if x.strip()}
    assert names and all(n.startswith("tlmrt_") for n in names), names
    header = (RUNTIME_C / "tlmrt.h").read_text()
    assert all(f"{n}(" in header for n in names), names


@needs_plain_build
def test_build_is_reproducible(lib_dir, tmp_path):
    proc = subprocess.run(
        ["bash", str(RUNTIME_C / "build.sh"), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "libtlmrt.so").read_bytes() == (lib_dir / "libtlmrt.so").read_bytes()


@needs_plain_build
def test_no_memory_errors_under_valgrind(test_bin, artifact):
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("needs valgrind")
    proc = subprocess.run(
        [
            valgrind,
            "-q",
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            str(test_bin),
            str(artifact()),
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _fill_pattern(i: int, n: int) -> list[float]:
    """examples/run_model.c's fill pattern for a float32 input (see examples/README.md)."""
    s = (0x12345678 + i * 0x9E3779B9) & 0xFFFFFFFF
    out = []
    for _ in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out.append((s >> 8) / 2**23 - 1.0)
    return out


def test_run_model_example_prints_and_writes_outputs(lib_dir, artifact, tmp_path):
    exe = lib_dir / "run_model"
    _cc(
        "-std=c11",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{RUNTIME_C}",
        ROOT / "examples" / "run_model.c",
        "-o",
        exe,
        f"-L{lib_dir}",
        "-ltlmrt",
        f"-Wl,-rpath,{lib_dir}",
    )
    art = artifact()
    out_dir = tmp_path / "outs"
    out_dir.mkdir()
    proc = subprocess.run(
        [str(exe), "-o", str(out_dir), "-t", "2", "-n", "3", str(art)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "input 0: x float32 [1000] 4000 bytes" in proc.stdout
    assert "output 1 hits int32 [64] first: 1 1 0 0 0 0 0 0 sum 4 mean 0.0625" in proc.stdout

    x = struct.unpack(f"<{N}f", struct.pack(f"<{N}f", *_fill_pattern(0, N)))
    w = struct.unpack(f"<{N}f", _weights()[: 4 * N])
    y = struct.unpack(f"<{N}f", (out_dir / "out_0.bin").read_bytes())
    want = struct.unpack(f"<{N}f", struct.pack(f"<{N}f", *((x[j] + w[j]) for j in reversed(range(N)))))
    assert y == tuple(v * 2 for v in want)
    assert f"first: {y[0]:.6g} {y[1]:.6g}" in line(proc.stdout, "output 0 y")

    short = tmp_path / "short.bin"
    short.write_bytes(bytes(12))
    proc = subprocess.run([str(exe), str(art), str(short)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "input x expects 4000 bytes, the file has 12" in proc.stderr


@pytest.fixture(scope="session")
def threads_bin(lib_dir: Path) -> Path:
    exe = lib_dir / "test_threads"
    _cc("-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", f"-I{RUNTIME_C}", TESTS_C / "test_threads.c", "-o", exe,
        f"-L{lib_dir}", "-ltlmrt", f"-Wl,-rpath,{lib_dir}", "-lpthread")
    return exe


@pytest.mark.parametrize("variant", [(), ("-DFAKE_NO_BARRIER",)], ids=["static-pool", "dynamic-pool"])
def test_one_model_takes_eight_threads_at_once_and_runs_after_fork(threads_bin, artifact, variant):
    proc = subprocess.run([str(threads_bin), str(artifact(*variant)), "2", "8", "1000"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "THREADS: 8 threads x 1000 runs" in proc.stdout and "FORK: the child ran the model" in proc.stdout
    assert "FORK_BUSY: the child forked during runs ran the model" in proc.stdout


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_fake_model_without_barrier_hook_runs_every_task_once(test_bin, artifact, threads):
    proc = run(test_bin, artifact("-DFAKE_NO_BARRIER"), threads)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ALL_OK" in proc.stdout
