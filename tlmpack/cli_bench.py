"""`tlmpack bench`: the click command over tlmpack.runtime.bench (kept out of cli.py)."""

from __future__ import annotations

import json

import click


@click.command("bench")
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: all cores).")
@click.option("--runs", type=click.IntRange(min=1), default=50, show_default=True, help="Timed warm runs.")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True, help="Untimed runs first.")
@click.option("--profile", is_flag=True, help="Profile as many runs again: per-kernel table, time outside kernels.")
@click.option("--top", type=click.IntRange(min=1), default=25, show_default=True,
              help="Kernels shown in the table (--json has them all).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Write the last profiled run as a Chrome trace (implies --profile).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench(artifact: str, device: str, threads: int | None, runs: int, warmup: int, profile: bool, top: int,
          trace: str | None, as_json: bool) -> None:
    """Time ARTIFACT over warm runs (min/median/p90) and, with --profile, show where a run's time goes."""
    from .cli import friendly_errors
    from .runtime import bench as rb

    @friendly_errors
    def go() -> None:
        try:
            result = rb.bench(artifact, device=device, threads=threads, runs=runs, warmup=warmup,
                              profile=profile or trace is not None)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--device") from None
        if trace is not None:
            rb.write_chrome_trace(result, trace)
        click.echo(json.dumps(result.to_json(), indent=1) if as_json else rb.format_report(result, top))

    go()
