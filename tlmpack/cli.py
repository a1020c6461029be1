"""The tlmpack command line. Every error that is the user's prints as one line with exit code 2.

That covers tlmpack's typed errors, click's own usage errors (a bad option value, a missing
argument) and the file system's (a folder that is a file), checked before any long work starts;
`tlmpack --debug …` shows the traceback instead.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import click

EXIT_USER_ERROR = 2
_MAX_LINE = 2000


def _user_errors() -> tuple[type[BaseException], ...]:
    from .errors import TlmpackBuildError
    from .runtime.errors import TlmpackError

    return (TlmpackBuildError, TlmpackError, OSError)


def one_line(message: str) -> str:
    """A message as one line: its lines joined with " | ", cut to a readable length."""
    text = " | ".join(line.strip() for line in str(message).splitlines() if line.strip())
    return text if len(text) <= _MAX_LINE else text[: _MAX_LINE - 1] + "…"


def _fail(message: str) -> None:
    click.echo(f"error: {one_line(message)}", err=True)
    sys.exit(EXIT_USER_ERROR)


def _os_error_line(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}"


def friendly_errors(command):
    """Turns tlmpack's typed errors (and OSError) into one line and exit code 2; --debug shows the traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except _user_errors() as e:
            if click.get_current_context().find_root().params.get("debug"):
                raise
            _fail(_os_error_line(e) if isinstance(e, OSError) else str(e))

    return wrapper


class OneLineGroup(click.Group):
    """The root group: click's usage errors print as one line with exit code 2, like tlmpack's own."""

    def main(self, *args, **kwargs):  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        except click.ClickException as e:
            message = e.format_message()
            ctx = getattr(e, "ctx", None)
            if isinstance(e, click.UsageError) and ctx is not None:
                message += f" (see: {ctx.command_path} --help)"
            _fail(message)
        sys.exit(rv if isinstance(rv, int) else 0)


def _progress(started: float):
    def say(message: str) -> None:
        click.echo(f"[{time.perf_counter() - started:6.1f}s] {message}", err=True)

    return say


def path_problem(path: Path, folder: bool) -> str | None:
    """Why `path` cannot be written as a folder (folder=True) or a file, or None; checked before long work."""
    if path.exists():
        if folder and not path.is_dir():
            return f"{path} is a file, not a folder"
        if not folder and path.is_dir():
            return f"{path} is a folder; name the file to write"
        place = path if folder else path.parent
        if not os.access(place, os.W_OK):
            return f"{path}: cannot write in {place} (permission denied)"
        return None
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                return f"{path}: {parent} is a file, not a folder"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{path}: cannot create it in {parent} (permission denied)"
            return None
    return None


def _writable(folder: bool):
    """A click callback refusing an output path that cannot be written, before the command runs."""
    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            problem = path_problem(Path(value), folder)
            if problem:
                raise click.BadParameter(problem, ctx=ctx, param=param)
        return value
    return check


def _device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from .runtime.preflight import Device

    try:
        Device.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return value


def _printable(text: object) -> str:
    """A name from an artifact (untrusted) as printable text: control characters are escaped."""
    s = str(text)
    return s if s.isprintable() else s.encode("unicode_escape").decode("ascii")


COMPILER_MODULES = {"tvm": "apache-tvm", "jinja2": "jinja2", "safetensors": "safetensors",
                    "threadpoolctl": "threadpoolctl", "onnx": "onnx", "torch": "torch"}


def missing_compiler_modules(model: str) -> list[str]:
    """The compiler's packages that `build MODEL` needs and this environment lacks."""
    needed = ["tvm", "jinja2", "safetensors", "threadpoolctl", "onnx" if model.endswith(".onnx") else "torch"]
    return [COMPILER_MODULES[m] for m in needed if importlib.util.find_spec(m) is None]


@click.group(cls=OneLineGroup)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="tlmpack")
def main(debug: bool) -> None:
    """tlmpack: compile a model ahead of time into a self-contained artifact."""


@main.command()
@click.argument("model")
@click.option("-t", "--target", "targets", default="x86", show_default=True, help="Comma-separated targets.")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False), callback=_writable(False),
              help="The .tar to write.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:D0xD1…",
              help="Pin an input's shape, e.g. x:1x3x224x224 (repeatable).")
@click.option("--batch", "batch", default=None, metavar="B1,B2,…",
              help="Dynamic batch: one artifact with a plan per listed batch size (axis 0 of every input must be "
                   "symbolic in the ONNX model); it runs any batch up to the largest, padded or split.")
@click.option("--max-batch", "max_batch", default=None, type=click.IntRange(min=1),
              help="Dynamic batch with plans for the powers of two up to this batch, and it.")
@click.option("--cpu", default=None, help="LLVM CPU name for x86 (default: this machine's).")
@click.option("--cores", default=None, type=click.IntRange(min=1),
              help="The x86 target's cores: kernels split their parallel loops for them (default: this machine's; "
                   "a cross build with --cpu needs it).")
@click.option("--cache", "cache", default=None, metavar="L1D,L2,L3",
              help="The x86 target's caches in KiB: L1d and L2 per core, L3 in all (default: this machine's, or for "
                   "--cpu a typical part of that CPU).")
@click.option("--fast-math/--exact-math", "fast_math", default=True, show_default=True,
              help="Vectorisable erf/exp/tanh approximations (TVM FastMathTransform), checked within 1e-4 "
                   "of onnxruntime/torch on x86 and CUDA; --exact-math keeps libm's functions.")
@click.option("--scheduler", default="auto", show_default=True,
              type=click.Choice(["auto", "tlm", "heuristic", "ranked", "baseline", "dlight"]),
              help="Who picks the schedules: auto (tlm on x86 for this machine's CPU; heuristic on CUDA and for "
                   "another --cpu, where the TLM lost to the rules on whole models and layers), tlm (the Tensor Language Model, no search; the rules where it is "
                   "unsure or the task is unlike its training), heuristic (compile-time rules from the hardware "
                   "description), ranked (CUDA: a learned cost model picks among the rules' point, its edits and "
                   "the TLM's samples, measuring nothing; tlm on x86), or baseline/dlight (the first release's fixed x86 rules and TVM dlight on CUDA). "
                   "tlm and heuristic pre-pack x86 weights.")
@click.option("--tlm-weights", "tlm_weights", multiple=True, metavar="TARGET=FILE",
              help="Schedule TARGET with these TLM weights (tlmpack tlm train/adapt) instead of the shipped ones.")
@click.option("--tune", default=0, show_default=True, type=click.IntRange(min=0),
              help="Measure this many candidates per x86 task on this machine (the TLM's top-k plus the rules' "
                   "point) and keep the fastest (chosen_by: search). 0: no measurement. Each candidate is timed "
                   "as the build would run it, its weight pre-packed for its own tiling.")
@click.option("--cuda-arch", "cuda_archs", default=None, metavar="sm_XX[,sm_YY…]",
              help="GPU archs for the cuda target: a cubin each, PTX for the lowest (default: sm_90).")
@click.option("--disable-rules", default=None, metavar="RULE[,RULE…]",
              help="Switch heuristic rules off by name (default: $TLMPACK_DISABLE_RULES, else none); recorded.")
@click.option("--cuda-pipeline/--no-cuda-pipeline", default=None,
              help="CUDA matmul: prefer the pipelined sketch (default: $TLMPACK_CUDA_PIPELINE, else off); recorded.")
@click.option("--pad-extents/--no-pad-extents", "pad_extents", default=True, show_default=True,
              help="Compute matmuls whose extents have no useful factorisation (197 tokens, a 50257-wide LM head) "
                   "over the next multiple the target prefers and slice back; exact.")
@friendly_errors
def build(model: str, targets: str, output: str, input_shapes: tuple[str, ...], cpu: str | None,
          cores: int | None, cache: str | None, scheduler: str, tlm_weights: tuple[str, ...], tune: int, cuda_archs: str | None, fast_math: bool,
          disable_rules: str | None, cuda_pipeline: bool | None, pad_extents: bool = True, batch: str | None = None,
          max_batch: int | None = None) -> None:
    """Build MODEL (.onnx, .pt2, or package.module:factory) into an artifact."""
    missing = missing_compiler_modules(model)
    if missing:
        _fail(f"tlmpack build needs the compiler, and this environment lacks {', '.join(missing)}; "
              f"install it with: pip install 'tlmpack[compiler]'")
    from .build import BuildOptions
    from .build import build as build_artifact
    from .frontend.batch import parse_batches
    from .specs import parse_input_shapes

    options = BuildOptions(targets=tuple(t.strip() for t in targets.split(",") if t.strip()), cpu=cpu,
                           input_shapes=parse_input_shapes(input_shapes), scheduler=scheduler,
                           cuda_archs=tuple(a.strip() for a in (cuda_archs or "").split(",") if a.strip()),
                           fast_math=fast_math, tune=tune, tlm_weights=_parse_weights(tlm_weights),
                           cuda_pipeline=cuda_pipeline, cores=cores, cache_kib=_parse_cache(cache), pad_extents=pad_extents,
                           disabled_rules=None if disable_rules is None else
                           tuple(r.strip() for r in disable_rules.split(",") if r.strip()),
                           batches=parse_batches(batch, max_batch))
    build_artifact(model, Path(output), options, _progress(time.perf_counter()))


def _parse_cache(text: str | None) -> tuple[int, int, int] | None:
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise click.BadParameter(f"{text!r}: expected three positive KiB sizes, L1D,L2,L3 (e.g. 48,2048,32768)",
                                 param_hint="--cache")
    return tuple(int(p) for p in parts)


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
    """Show an artifact's inputs, outputs, targets and the schedule of each subgraph (nothing is extracted)."""
    from .runtime.errors import ArtifactError
    from .runtime.preflight import manifest_of

    manifest = manifest_of(artifact)
    if as_json:
        click.echo(json.dumps(manifest, indent=1, sort_keys=True))
        return
    try:
        lines = _describe(manifest)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{artifact}: manifest.json has a malformed field ({type(e).__name__}: {e})") from None
    for line in lines:
        click.echo(line)


def _describe(manifest: dict) -> list[str]:
    """inspect's lines; the manifest is validated only where the runtime relies on it, so read it with care."""
    p = _printable
    model = manifest.get("model") or {}
    out = [f"{p(model.get('name'))} ({p(model.get('format'))}, sha256 "
           f"{p(model.get('source_sha256', model.get('sha256')))[:12]}…) tlmpack {p(manifest.get('tlmpack_version'))} "
           f"TVM {p(manifest.get('tvm_version'))}"]
    for kind in ("inputs", "outputs"):
        for spec in manifest[kind]:
            out.append(f"  {kind[:-1]:6} {p(spec['name']):24} {spec['dtype']:8} {tuple(spec['shape'])}")
    for t in manifest["targets"]:
        if t.get("kind") == "cuda":
            ptx = f" + PTX {p(t['ptx_arch'])}+" if t.get("ptx") else ""
            need = int(t.get("min_driver_version", 0))
            out.append(f"  target {p(t['id']):6} SASS {','.join(map(p, t.get('archs', [])))}{ptx}, driver >= "
                       f"{need // 1000}.{need % 1000 // 10}, {p(t.get('launches', '?'))} launches")
        else:
            out.append(f"  target {p(t['id']):6} {p(t.get('cpu'))} features={','.join(map(p, t.get('cpu_features', [])))}")
    tlm = manifest.get("tlm") if isinstance(manifest.get("tlm"), dict) else {}
    for target, model in sorted(tlm.items()):
        if isinstance(model, dict):
            out.append(f"  tlm    {p(target):6} {p(model.get('id'))} (sha256 {p(str(model.get('sha256', ''))[:16])}…)")
    mem = manifest.get("memory") or {}
    out.append(f"  arena {float(mem.get('arena_bytes', 0)) / 2**20:.2f} MiB (unplanned "
               f"{float(mem.get('unplanned_bytes', 0)) / 2**20:.2f} MiB), "
               f"weights {float(mem.get('weights_bytes', 0)) / 2**20:.2f} MiB")
    out += _describe_batch_plans(manifest.get("batch_plans") or [])
    subgraphs = manifest.get("subgraphs") or []
    out.append(f"  {len(subgraphs)} subgraphs:")
    for sg in subgraphs:
        for s in sg["schedules"]:
            decisions = " ".join(
                "x".join(map(str, v)) if isinstance(v, list) else str(v) for _, v in s["decisions"]
            )
            out.append(f"    {p(sg['id']):44} x{p(sg['calls']):<3} {p(s['target']):4} {p(s['chosen_by']):10} "
                       f"sketch {p(s['sketch']):2}  {p(decisions)}")
    return out


def _describe_batch_plans(plans: list) -> list[str]:
    """inspect's lines for a dynamic-batch artifact: each plan, and how each batch in between runs."""
    from .runtime.batching import COST_UNIT, cover

    out = []
    for plan in plans:
        parts = []
        for target in ("cuda", "x86"):
            if isinstance(plan.get(target), dict):
                t = plan[target]
                steps = t.get("launches", t.get("kernel_calls", "?"))
                word = "launches" if "launches" in t else "kernel calls"
                parts.append(f"{target} {_printable(steps)} {word}, arena {float(t.get('arena_bytes', 0)) / 2**20:.2f} MiB")
        # costs in ns from the plans' work (runtime/batching.py); older artifacts': sample units x COST_UNIT
        counted = any(isinstance(plan.get(t), dict) and "work" in plan[t] for t in ("cuda", "x86"))
        costs = ", ".join(f"{_printable(k)} {float(v) / 1e3:.1f} us" if counted else f"{_printable(k)} {float(v) / COST_UNIT:g}"
                          for k, v in sorted((plan.get("cost") or {}).items()))
        out.append(f"  batch plan {_printable(plan.get('batch')):>4}: {'; '.join(parts)} (estimated cost {costs})")
    if plans:
        for target in sorted({k for p in plans for k in (p.get("cost") or {})}):
            costs = {int(p["batch"]): int(p["cost"][target]) for p in plans}
            largest = max(costs)
            between = [b for b in range(1, min(largest, 32) + 1) if b not in costs]
            runs = [f"{b}→{'+'.join(map(str, cover(b, costs)))}" for b in between]
            if runs:
                out.append(f"  {_printable(target)} runs other batches as: {' '.join(runs)}"
                           + (" …" if largest > 32 else ""))
    return out


NPY_MAGIC = b"\x93NUMPY"


def parse_feed(items: tuple[str, ...]) -> dict:
    """--input NAME=@FILE.npy values as arrays, with one line for a file that is not one array in .npy form."""
    import numpy as np

    from .runtime.errors import InputError

    feed = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.startswith("@") or len(value) < 2:
            raise InputError(f"--input {item!r}: expected NAME=@FILE.npy")
        if name in feed:
            raise InputError(f"--input {name}: given twice")
        path = Path(value[1:])
        try:
            with open(path, "rb") as f:
                magic = f.read(len(NPY_MAGIC))
        except OSError as e:
            raise InputError(f"--input {name}: cannot read {path} ({e.strerror or e})") from None
        if magic != NPY_MAGIC:
            what = "a .npz archive" if magic.startswith(b"PK") else "not a .npy file"
            raise InputError(f"--input {name}: {path} is {what}; expected one array saved with numpy.save")
        try:
            feed[name] = np.load(path, allow_pickle=False)
        except ValueError as e:
            reason = ("it holds Python objects, which tlmpack does not read" if "allow_pickle" in str(e)
                      else f"a damaged .npy file ({e})")
            raise InputError(f"--input {name}: {path}: {reason}") from None
        except (OSError, EOFError) as e:
            raise InputError(f"--input {name}: {path}: a damaged .npy file ({e})") from None
    return feed


def _random_feed(model, feed: dict) -> dict:
    """Seeded random values for every input the feed lacks, of the input's dtype and shape."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = dict(feed)
    largest = model.batch_plans[-1] if model.batch_plans else 0  # a dynamic batch: its largest plan
    for spec in (s.with_batch(largest) for s in model.inputs):
        if spec.name in out:
            continue
        kind = np.dtype(spec.dtype).kind
        if kind == "b":
            out[spec.name] = rng.integers(0, 2, size=spec.shape).astype(spec.dtype)
        elif kind in "iu":
            out[spec.name] = rng.integers(0, 100, size=spec.shape).astype(spec.dtype)
        else:
            out[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    return out


def _output_files(names: list[str]) -> list[str]:
    """A safe, distinct file name for every output (names come from the artifact: no '/' or '..' in them)."""
    files: list[str] = []
    for name in names:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "output"
        candidate, n = base, 1
        while candidate in files:
            n += 1
            candidate = f"{base}_{n}"
        files.append(candidate)
    return [f"{f}.npy" for f in files]


def _load_for_cli(artifact: str, device: str, threads: int | None, inputs: tuple[str, ...], random_inputs: bool):
    """Loads the model and builds its feed, refusing a feed that lacks an input before anything runs."""
    from . import runtime
    from .runtime.errors import InputError

    feed = parse_feed(inputs)
    model = runtime.load(artifact, device=device, num_threads=threads)
    if random_inputs:
        feed = _random_feed(model, feed)
    names = [s.name for s in model.inputs]
    unknown = [n for n in feed if n not in names]
    if unknown:
        model.close()
        raise InputError(f"--input {unknown[0]}: this model has no input {unknown[0]!r}; its inputs are: "
                         f"{', '.join(names) or '(none)'}")
    missing = [n for n in names if n not in feed]
    if missing:
        model.close()
        raise InputError(f"no value for input{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}; "
                         f"pass --input NAME=@FILE.npy or --random-inputs")
    return model, feed


_THREADS = click.IntRange(min=1)


@main.command()
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--input", "inputs", multiple=True, metavar="NAME=@FILE.npy", help="An input (repeatable).")
@click.option("--random-inputs", is_flag=True, help="Feed seeded random inputs instead.")
@click.option("--device", default="cpu", show_default=True, callback=_device, help="auto, cpu, cuda or cuda:N.")
@click.option("--threads", type=_THREADS, default=None, help="Worker threads, at least 1 (default: all cores).")
@click.option("--save", type=click.Path(file_okay=False), default=None, callback=_writable(True),
              help="Write outputs as .npy here.")
@friendly_errors
def run(artifact: str, inputs: tuple[str, ...], random_inputs: bool, device: str, threads: int | None,
        save: str | None) -> None:
    """Run an artifact once and print a summary of each output."""
    import numpy as np

    model, feed = _load_for_cli(artifact, device, threads, inputs, random_inputs)
    with model:
        started = time.perf_counter()
        outputs = model.run(None, feed)
        elapsed = (time.perf_counter() - started) * 1e3
    files = _output_files([s.name for s in model.outputs])
    if save:
        Path(save).mkdir(parents=True, exist_ok=True)
    for spec, value, file in zip(model.outputs, outputs, files, strict=True):
        flat = value.reshape(-1)
        stats = (f"mean={float(flat.mean()):.6g} std={float(flat.std()):.6g}" if flat.size else "empty")
        click.echo(f"{_printable(spec.name)} {spec.dtype} {tuple(value.shape)} "
                   f"first={np.array2string(flat[:6], precision=5)} {stats}")
        if save:
            np.save(Path(save) / file, value)
    click.echo(f"ran in {elapsed:.2f} ms on {model.device}", err=True)


@main.command()
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--device", default="auto", show_default=True, callback=_device, help="auto, cpu, cuda or cuda:N.")
@friendly_errors
def check(artifact: str, device: str) -> None:
    """Check that this machine can run ARTIFACT (files, CPU features, GPU, driver) without loading its code.

    Prints one fact per line and every problem; exits 2 when there is a problem.
    """
    from . import runtime

    report = runtime.check(artifact, device=device)
    for line in report.lines():
        click.echo(one_line(line))
    if not report.ok:
        sys.exit(EXIT_USER_ERROR)


from .training.cli import tlm  # noqa: E402  (the dataset commands live in their own module)

main.add_command(tlm)

from .cli_bench import bench  # noqa: E402  (tlmpack bench: tlmpack/runtime/bench.py)

main.add_command(bench)

if __name__ == "__main__":
    main()
