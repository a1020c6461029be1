"""The tlmpack command line. Errors that are the user's print as one line with exit code 2."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import click

EXIT_USER_ERROR = 2


def _user_errors() -> tuple[type[BaseException], ...]:
    from .errors import TlmpackBuildError
    from .runtime.errors import TlmpackError

    return (TlmpackBuildError, TlmpackError)


def friendly_errors(command):
    """Turns tlmpack's typed errors into one line and exit code 2; --debug shows the traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except _user_errors() as e:
            if click.get_current_context().find_root().params.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(EXIT_USER_ERROR)

    return wrapper


def _progress(started: float):
    def say(message: str) -> None:
        click.echo(f"[{time.perf_counter() - started:6.1f}s] {message}", err=True)

    return say


@click.group()
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="tlmpack")
def main(debug: bool) -> None:
    """tlmpack: compile a model ahead of time into a self-contained artifact."""


@main.command()
@click.argument("model")
@click.option("-t", "--target", "targets", default="x86", show_default=True, help="Comma-separated targets.")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False), help="The .tar to write.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:D0xD1…",
              help="Pin an input's shape, e.g. x:1x3x224x224 (repeatable).")
@click.option("--cpu", default=None, help="LLVM CPU name for x86 (default: this machine's).")
@click.option("--fast-math/--exact-math", "fast_math", default=True, show_default=True,
              help="Vectorisable erf/exp/tanh approximations (TVM FastMathTransform), checked within 1e-4 "
                   "of onnxruntime/torch on x86 and CUDA; --exact-math keeps libm's functions.")
@click.option("--scheduler", default="tlm", show_default=True,
              type=click.Choice(["tlm", "heuristic", "baseline", "dlight"]),
              help="Who picks the schedules: tlm (the Tensor Language Model, no search; the rules where it is "
                   "unsure or the task is unlike its training), heuristic (compile-time rules from the hardware "
                   "description), or baseline/dlight (the first release's fixed x86 rules and TVM dlight on CUDA). "
                   "tlm and heuristic pre-pack x86 weights.")
@click.option("--tlm-weights", "tlm_weights", multiple=True, metavar="TARGET=FILE",
              help="Schedule TARGET with these TLM weights (tlmpack tlm train/adapt) instead of the shipped ones.")
@click.option("--tune", default=0, show_default=True, type=click.IntRange(min=0),
              help="Measure this many candidates per x86 task on this machine (the TLM's top-k plus the rules' "
                   "point) and keep the fastest (chosen_by: search). 0: no measurement.")
@click.option("--cuda-arch", "cuda_archs", default=None, metavar="sm_XX[,sm_YY…]",
              help="GPU archs for the cuda target: a cubin each, PTX for the lowest (default: sm_90).")
@friendly_errors
def build(model: str, targets: str, output: str, input_shapes: tuple[str, ...], cpu: str | None,
          scheduler: str, tlm_weights: tuple[str, ...], tune: int, cuda_archs: str | None, fast_math: bool) -> None:
    """Build MODEL (.onnx, .pt2, or package.module:factory) into an artifact."""
    from .build import BuildOptions
    from .build import build as build_artifact
    from .specs import parse_input_shapes

    options = BuildOptions(targets=tuple(t.strip() for t in targets.split(",") if t.strip()), cpu=cpu,
                           input_shapes=parse_input_shapes(input_shapes), scheduler=scheduler,
                           cuda_archs=tuple(a.strip() for a in (cuda_archs or "").split(",") if a.strip()),
                           fast_math=fast_math, tune=tune, tlm_weights=_parse_weights(tlm_weights))
    build_artifact(model, Path(output), options, _progress(time.perf_counter()))


def _parse_weights(items: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in items:
        target, sep, path = item.partition("=")
        if not sep or target not in ("x86", "cuda") or not Path(path).is_file():
            raise click.BadParameter(f"{item!r}: expected x86=FILE or cuda=FILE with an existing file",
                                     param_hint="--tlm-weights")
        out[target] = path
    return out


@main.command()
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@friendly_errors
def inspect(artifact: str, as_json: bool) -> None:
    """Show an artifact's inputs, outputs, targets and the schedule of each subgraph."""
    manifest = _read_manifest(artifact)
    if as_json:
        click.echo(json.dumps(manifest, indent=1, sort_keys=True))
        return
    model = manifest.get("model", {})
    click.echo(f"{model.get('name')} ({model.get('format')}, sha256 {str(model.get('source_sha256', model.get('sha256')))[:12]}…) "
               f"tlmpack {manifest.get('tlmpack_version')} TVM {manifest.get('tvm_version')}")
    for kind in ("inputs", "outputs"):
        for spec in manifest[kind]:
            click.echo(f"  {kind[:-1]:6} {spec['name']:24} {spec['dtype']:8} {tuple(spec['shape'])}")
    for t in manifest["targets"]:
        if t.get("kind") == "cuda":
            ptx = f" + PTX {t['ptx_arch']}+" if t.get("ptx") else ""
            need = t.get("min_driver_version", 0)
            click.echo(f"  target {t['id']:6} SASS {','.join(t.get('archs', []))}{ptx}, driver >= "
                       f"{need // 1000}.{need % 1000 // 10}, {t.get('launches', '?')} launches")
        else:
            click.echo(f"  target {t['id']:6} {t.get('cpu')} features={','.join(t.get('cpu_features', []))}")
    mem = manifest.get("memory", {})
    click.echo(f"  arena {mem.get('arena_bytes', 0) / 2**20:.2f} MiB (unplanned {mem.get('unplanned_bytes', 0) / 2**20:.2f} MiB), "
               f"weights {mem.get('weights_bytes', 0) / 2**20:.2f} MiB")
    click.echo(f"  {len(manifest['subgraphs'])} subgraphs:")
    for sg in manifest["subgraphs"]:
        for s in sg["schedules"]:
            decisions = " ".join(
                "x".join(map(str, v)) if isinstance(v, list) else str(v) for _, v in s["decisions"]
            )
            click.echo(f"    {sg['id']:44} x{sg['calls']:<3} {s['target']:4} {s['chosen_by']:10} "
                       f"sketch {s['sketch']:2}  {decisions}")


def _read_manifest(artifact: str) -> dict:
    """Reads manifest.json from an artifact folder or straight out of the tar (nothing extracted)."""
    import tarfile

    from .runtime.errors import ArtifactError

    path = Path(artifact)
    try:
        if path.is_dir():
            return json.loads((path / "manifest.json").read_text())
        with tarfile.open(path) as tar:
            member = tar.extractfile("manifest.json")
            if member is None:
                raise KeyError("manifest.json")
            return json.loads(member.read())
    except (OSError, KeyError, tarfile.TarError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{artifact}: no readable manifest.json ({type(e).__name__}: {e})") from None


def _parse_feed(items: tuple[str, ...]) -> dict:
    import numpy as np

    from .runtime.errors import InputError

    feed = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.startswith("@"):
            raise InputError(f"--input {item!r}: expected NAME=@file.npy")
        try:
            feed[name] = np.load(value[1:], allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"--input {name}: cannot read {value[1:]} ({e})") from None
    return feed


@main.command()
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--input", "inputs", multiple=True, metavar="NAME=@FILE.npy", help="An input (repeatable).")
@click.option("--random-inputs", is_flag=True, help="Feed seeded random inputs instead.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--threads", type=int, default=None, help="Worker threads (default: all cores).")
@click.option("--save", type=click.Path(file_okay=False), default=None, help="Write outputs as .npy here.")
@friendly_errors
def run(artifact: str, inputs: tuple[str, ...], random_inputs: bool, device: str, threads: int | None,
        save: str | None) -> None:
    """Run an artifact once and print a summary of each output."""
    import numpy as np

    from . import runtime

    model = runtime.load(artifact, device=device, num_threads=threads)
    feed = _parse_feed(inputs)
    if random_inputs:
        rng = np.random.default_rng(0)
        for spec in model.inputs:
            if spec.name not in feed:
                if spec.dtype.startswith("int"):
                    feed[spec.name] = rng.integers(0, 100, size=spec.shape).astype(spec.dtype)
                else:
                    feed[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    started = time.perf_counter()
    outputs = model.run(None, feed)
    elapsed = (time.perf_counter() - started) * 1e3
    for spec, value in zip(model.outputs, outputs):
        flat = value.reshape(-1)
        click.echo(f"{spec.name} {spec.dtype} {tuple(value.shape)} first={np.array2string(flat[:6], precision=5)} "
                   f"mean={float(flat.mean()):.6g} std={float(flat.std()):.6g}")
        if save:
            Path(save).mkdir(parents=True, exist_ok=True)
            np.save(Path(save) / f"{spec.name}.npy", value)
    click.echo(f"ran in {elapsed:.2f} ms on {model.device}", err=True)


@main.command()
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@friendly_errors
def check(artifact: str, device: str) -> None:
    """Check that this machine can run ARTIFACT (files, CPU features, GPU, driver) without loading its code.

    Prints one fact per line and every problem; exits 2 when there is a problem.
    """
    from . import runtime

    try:
        report = runtime.check(artifact, device=device)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--device") from None
    for line in report.lines():
        click.echo(line)
    if not report.ok:
        sys.exit(EXIT_USER_ERROR)


from .training.cli import tlm  # noqa: E402  (the dataset commands live in their own module)

main.add_command(tlm)

from .cli_bench import bench  # noqa: E402  (tlmpack bench: tlmpack/runtime/bench.py)

main.add_command(bench)

if __name__ == "__main__":
    main()
