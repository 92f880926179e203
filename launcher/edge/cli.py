"""The command line: the only module that imports click and turns errors into exit codes.

    safe-serve MODEL --engine vllm [options] [-- ENGINE FLAGS...]     plan, launch, watch
    safe-serve serve MODEL ...                                        the same, explicitly
    safe-serve plan MODEL --engine vllm|sglang [--gpu NAME ...] [--json] [-- FLAGS...]
    safe-serve fit MODEL --concurrency N --tokens L [--gpu NAME ...] [--json]
    safe-serve gpus [--json]
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import click

from launcher.common import inputs, stopsignals
from launcher.common.errors import ExitCode, SafeServeError, UnsupportedModel, UsageError, WontFit
from launcher.common.vocab import Device, DivergenceMode
from launcher.edge import cli_hints
from launcher.engines import ENGINES
from launcher.plan import presets
from launcher.plan.request import PlanOptions, build_request, engine_args_after_dashes

ENV_PREFIX = "SAFE_SERVE_"
F = TypeVar("F", bound=Callable[..., Any])


class DefaultToServe(click.Group):
    """`safe-serve MODEL ...` means `safe-serve serve MODEL ...` (and `safe-serve --config F` too)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and (not args[0].startswith("-") or
                                                      args[0].partition("=")[0] == "--config"):
            self._not_a_typo(args[0])
            args = ["serve", *args]
        return super().parse_args(ctx, args)

    def _not_a_typo(self, word: str) -> None:
        """`safe-serve gpu` or `safe-serve stauts x` is a mistyped command, not a model to serve: exit 2
        naming the command (it was served: an NVML error, or model 'gpu' not found). A directory of that
        name, a repo id or `safe-serve serve WORD` still serves it."""
        import difflib

        if "/" in word or os.path.exists(word):
            return
        close = difflib.get_close_matches(word.lower(), sorted(self.commands), n=1, cutoff=0.75)
        if close:
            raise UsageError(f"no command {word!r}: did you mean `safe-serve {close[0]}`?",
                             hint=f"to serve a model named {word!r}: safe-serve serve {word}")


@click.group(cls=DefaultToServe, context_settings={"help_option_names": ["-h", "--help"]}, epilog=cli_hints.EPILOG)
@click.version_option(None, "-V", "--version", package_name="safe-serve", prog_name="safe-serve")
def cli() -> None:
    """Start vLLM or SGLang so that it fits in GPU memory, every time, and say why."""


def option(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    """click.option with its SAFE_SERVE_* variable (named after the long flag) shown in --help."""
    long = next(d for d in decls if d.startswith("--"))
    kwargs.setdefault("envvar", ENV_PREFIX + long[2:].replace("-", "_").upper())
    kwargs.setdefault("show_envvar", True)
    return click.option(*decls, **kwargs)


def choice(values: Sequence[str]) -> click.Choice[str]:
    return click.Choice(list(values), case_sensitive=False)


def config_option(func: Any) -> Any:
    """--config FILE: the command's options as YAML keys (as vLLM's --config), below the command
    line and the SAFE_SERVE_* variables."""
    return click.option("--config", "config_file", type=click.Path(dir_okay=False), is_eager=True,
                        expose_value=False, callback=_load_config, envvar=ENV_PREFIX + "CONFIG", show_envvar=True,
                        help="YAML file of this command's options (max-gpu-memory: 40GiB, engine-args: [...]); "
                             "the command line and SAFE_SERVE_* variables win.")(func)


def _load_config(ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    if not path:
        return
    from launcher.edge.config_file import load_config

    names = [p.name for p in ctx.command.params if p.name and p.name != "config_file"]
    ctx.default_map = {**(ctx.default_map or {}), **load_config(path, names)}


def plan_options(func: Any) -> Any:
    options = [
        click.argument("model"),
        option("--engine", type=choice(ENGINES), default=ENGINES[0], show_default=True,
               help="The engine to plan for and start."),
        option("--gpu", "gpu_specs", multiple=True,
               help="Plan for a hypothetical GPU: catalog name (rtx4090, a100-80gb), size (24GiB) "
                    "or count (2xH100)."),
        option("--device", type=choice([d.value for d in Device]), default=Device.CUDA.value, show_default=True,
               help="cuda: the GPUs NVML shows; cpu: vLLM's CPU backend on this host's memory."),
        option("--concurrency", type=int, default=None,
               help="Requests of the chosen length that must fit at once (default 1, or the preset's)."),
        option("--preset", type=choice(presets.names()), default=None, help=presets.help_text()),
        option("--max-gpu-memory", "max_gpu_memory", default=None,
               help="Cap what this server takes, as a size (40GiB, 40Gi) or a share of the GPU (50%), "
                    "so several can share a GPU."),
        option("--margin", default=None,
               help="Headroom left for other tenants, as a size (1GiB, 512Mi) or a share of the GPU (5%) "
                    "(default 256MiB, or the preset's)."),
        option("--engine-version", default=None, help="Plan for this engine version (default: installed)."),
        option("--trust-engine", is_flag=True,
               help="Start even where the geometry or the weight size is unknown, or the plan refuses; "
                    "the engine decides."),
        option("--json", "as_json", is_flag=True,
               help="Print JSON: the plan (safe-serve.plan/1), or on any failure one safe-serve.error/1 object."),
        option("--no-calibration", is_flag=True, help="Ignore what earlier starts measured."),
        click.argument("engine_args", nargs=-1, type=click.UNPROCESSED),
    ]
    for decorator in reversed(options):
        func = decorator(func)
    return config_option(func)


def plan_options_from(opts: Mapping[str, Any]) -> PlanOptions:
    """click's keyword arguments -> the typed options `launcher.plan.request` works from.

    Every value is checked here, before anything is probed, resolved or planned.
    """
    if opts.get("engine_version"):
        inputs.check_engine_version(opts["engine_version"])
    if opts.get("concurrency") is not None:
        inputs.check_concurrency(opts["concurrency"])
    inputs.check_device_and_gpus(opts.get("device") or "cuda", tuple(opts.get("gpu_specs") or ()))
    for option in ("margin", "max_gpu_memory"):
        if opts.get(option):
            inputs.check_size("--" + option.replace("_", "-"), opts[option])
    return PlanOptions(
        model=opts["model"], engine=opts.get("engine") or "vllm", gpu_specs=tuple(opts.get("gpu_specs") or ()),
        device=opts.get("device") or "cuda", concurrency=opts.get("concurrency"),
        max_gpu_memory=opts.get("max_gpu_memory"), margin=opts.get("margin"), preset=opts.get("preset"),
        engine_version=opts.get("engine_version"), trust_engine=bool(opts.get("trust_engine")),
        use_calibration=not opts.get("no_calibration"),
        engine_args=engine_args_after_dashes(opts.get("engine_args") or ()),
    )


@cli.command("plan")
@plan_options
def plan_command(**opts: Any) -> None:
    """Print the plan (budget table and flags) without starting anything."""
    from launcher.edge.render import plan_to_json, render_plan
    from launcher.plan.planner import make_plan

    request = build_request(plan_options_from(opts), os.environ)
    try:
        plan = make_plan(request, choices=True)
    except (WontFit, UnsupportedModel) as refusal:
        if opts["as_json"]:  # a refusal is data too: stdout gets the document, stderr the one line
            as_wont_fit = refusal if isinstance(refusal, WontFit) else WontFit(
                refusal.message, hint=refusal.hint, rule="unsupported-model")
            emit_json(as_wont_fit.to_json())
        raise
    if opts["as_json"]:
        emit_json(plan_to_json(plan, given=request.gpus))
    else:
        click.echo(render_plan(plan, given=request.gpus))


@cli.command("serve")
@plan_options
@option("--engine-cmd", default=None,
        help='Replace the engine executable, e.g. "python -m vllm.entrypoints.openai.api_server".')
@option("--dry-run", is_flag=True, help="Print the plan and the exact command line, then exit 0.")
@option("--on-divergence", type=choice([m.value for m in DivergenceMode]), default=DivergenceMode.RETUNE.value,
        show_default=True,
        help="When the engine's KV cache differs from the plan: restart with recomputed flags, stop (78), "
             "or only warn.")
@option("--tolerance", type=float, default=0.02, show_default=True,
        help="Relative KV-token difference from the plan that still counts as agreeing.")
@option("--max-retunes", type=int, default=2, show_default=True,
        help="Restarts with recomputed flags before giving up.")
@option("--watch-timeout", type=float, default=1800.0, show_default=True,
        help="Seconds to wait for the engine's KV report (retunes included); then exit 75.")
@option("--grace", type=float, default=30.0, show_default=True,
        help="Seconds between SIGTERM and SIGKILL when stopping the engine.")
@option("--lock-timeout", type=float, default=300.0, show_default=True,
        help="Seconds to wait for another start on the same GPU; then exit 75.")
@option("--ready-file", default=None,
        help="Written once the engine is verified and healthy (a startup probe's file); its directory "
             "must exist and be writable (checked at start, exit 2).")
@option("--health-failures", type=click.IntRange(min=0), default=3, show_default=True,
        help="After ready, this many failed /health probes in a row stop the engine (exit 70); 0: no check.")
@option("--health-interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
        help="Seconds between /health probes after ready.")
@option("--name", default=None,
        help="This instance's name in `safe-serve ps` and `safe-serve status NAME` (default: the model's "
             "last path part and the port, e.g. qwen2.5-7b-instruct-8000).")
@option("--log-format", type=choice(["console", "json"]), default=None,
        help="safe-serve's own log lines: console (colour only on a terminal, never with NO_COLOR) or "
             "json (default off a terminal); under journald each line carries its syslog priority.")
def serve_command(**opts: Any) -> None:
    """Plan, then start the engine with the planned flags and watch it."""
    from launcher.edge.render import render_plan
    from launcher.serve import ServeOptions
    from launcher.serve.logsetup import configure_logging
    from launcher.serve.start import dry_run_output, launch, prepare, take_start_lock

    options = plan_options_from(opts)
    for name in ("watch_timeout", "grace", "lock_timeout"):
        inputs.check_seconds("--" + name.replace("_", "-"), opts[name], allow_zero=name != "watch_timeout")
    inputs.check_tolerance(opts["tolerance"])
    inputs.check_max_retunes(opts["max_retunes"])
    if options.gpu_specs and not opts["dry_run"]:
        raise UsageError("--gpu plans for a hypothetical GPU: serve launches on the real one",
                         hint="add --dry-run to see the plan and command for that GPU, or drop --gpu")
    if opts.get("name"):
        inputs.check_instance_name(opts["name"])
    if opts.get("ready_file") and not opts["dry_run"]:
        inputs.check_ready_file(opts["ready_file"])
    configure_logging(opts.get("log_format"))
    if not opts["dry_run"]:  # a flag the engine refuses is exit 2 now, not after the lock wait and the probe
        _check_engine_args(options, opts.get("engine_cmd"))
    lock = None if opts["dry_run"] else take_start_lock(options, opts["lock_timeout"])
    prepared = prepare(options, os.environ, engine_cmd=opts.get("engine_cmd"))
    if opts["dry_run"]:
        click.echo(dry_run_output(prepared, as_json=opts["as_json"]))
        _JSON.written = opts["as_json"]
        return
    click.echo(render_plan(prepared.plan, list(prepared.shown), given=prepared.request.gpus), err=True)
    serve_options = ServeOptions(engine_cmd=opts.get("engine_cmd"), on_divergence=opts["on_divergence"],
                                 tolerance=opts["tolerance"], max_retunes=opts["max_retunes"],
                                 watch_timeout_s=opts["watch_timeout"], grace_s=opts["grace"],
                                 lock_timeout_s=opts["lock_timeout"], ready_file=opts.get("ready_file"),
                                 health_failures=opts["health_failures"], health_interval_s=opts["health_interval"])
    sys.exit(launch(prepared, serve_options, lock, os.environ, warn=lambda line: click.echo(line, err=True),
                    name=opts.get("name")))


def _check_engine_args(options: PlanOptions, engine_cmd: str | None) -> None:
    """The engine flags against the engine's argparse and --engine-cmd split into words (exit 2), as
    planning and the launch do them again later."""
    from launcher.engines import adapter
    from launcher.engines.flags import split_engine_cmd
    from launcher.engines.versions import installed_version

    if engine_cmd:
        split_engine_cmd(engine_cmd)
    version = options.engine_version or installed_version(options.engine)
    adapter(options.engine).check_engine_args(options.engine_args, version)


@cli.command("fit")
@click.argument("model")
@option("--concurrency", type=int, required=True, help="Requests that must run at once.")
@option("--tokens", type=int, required=True, help="Tokens per request (prompt + output).")
@option("--engine", type=choice(ENGINES), default=ENGINES[0], show_default=True, help="The engine to plan for.")
@option("--gpu", "gpu_specs", multiple=True, help="GPU types to consider (default: the whole catalog).")
@option("--engine-version", default=None, help="Plan for this engine version (default: installed).")
@option("--margin", default=None, help="Headroom left for other tenants, as a size or a share (default 256MiB).")
@option("--json", "as_json", is_flag=True,
        help="Print JSON (safe-serve.fit/1), or on any failure one safe-serve.error/1 object.")
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@config_option
def fit_command(**opts: Any) -> None:
    """The smallest configuration per GPU type that carries N requests of L tokens."""
    from launcher.edge.render import fit_to_json, render_fit
    from launcher.model.catalog import hypothetical_gpus, load_catalog
    from launcher.plan.fit import Workload, fit_report

    inputs.check_concurrency(opts["concurrency"])
    inputs.check_tokens(opts["tokens"])
    specs = opts["gpu_specs"] or tuple(g.name for g in load_catalog())
    gpus = tuple(hypothetical_gpus([spec])[0] for spec in specs)  # one device per GPU type: fit sets counts
    base = build_request(dataclasses.replace(plan_options_from({**opts, "gpu_specs": (specs[0],)}),
                                             use_calibration=False), os.environ)
    report = fit_report(base, Workload(opts["concurrency"], opts["tokens"]), gpus, asked=specs,
                        inverse=len(opts["gpu_specs"]) == 1)
    if opts["as_json"]:
        doc = fit_to_json(report.results, report.workload, base.model.name, base.engine, report.inverse)
        if report.refusal is not None:
            doc["refusal"] = report.refusal.to_json()
        emit_json(doc)
    else:
        click.echo(render_fit(report.results, report.workload, base.model.name, base.engine, report.inverse,
                              geometry=base.model.geometry))
    if report.refusal is not None:
        raise report.refusal


@cli.command("gpus")
@option("--json", "as_json", is_flag=True,
        help="Print the probe object the planner consumes (safe-serve.gpus/1), or one safe-serve.error/1.")
def gpus_command(as_json: bool) -> None:
    """What the probe sees: GPUs, free memory and the processes holding it."""
    from launcher.edge.gpus_view import inventory_to_json, render_inventory
    from launcher.probe import probe_inventory

    inventory = probe_inventory()  # ProbeError -> one line and 69 in main()
    if as_json:
        emit_json(inventory_to_json(inventory))
    else:
        click.echo(render_inventory(inventory))


@cli.command("ps")
@option("--json", "as_json", is_flag=True, help="Print safe-serve.ps/1: the status objects of every live instance.")
def ps_command(as_json: bool) -> None:
    """The running safe-serve instances (from their status files in the state directory)."""
    from launcher.common.paths import state_dir
    from launcher.edge.instances_view import ps_to_json, render_ps
    from launcher.serve.instances import running

    instances = list(running(state_dir(os.environ)))
    if as_json:
        emit_json(ps_to_json(instances))
    else:
        click.echo(render_ps(instances))


@cli.command("status")
@click.argument("name")
@option("--json", "as_json", is_flag=True, help="Print the instance's safe-serve.status/1 object.")
def status_command(name: str, as_json: bool) -> None:
    """One running instance: model, engine, GPUs, port, KV tokens planned and seen, retunes, state."""
    from launcher.common.errors import InstanceNotFound, UsageError
    from launcher.common.paths import state_dir
    from launcher.edge.instances_view import render_status
    from launcher.serve.instances import running

    instances = list(running(state_dir(os.environ)))
    found = [s for s in instances if s["name"] == name] or [s for s in instances if s["name"].startswith(name)]
    if len(found) > 1:  # a prefix of several names: the NAME given is too short, not missing (exit 2)
        raise UsageError(f"{name!r} matches {len(found)} running instances: "
                         f"{', '.join(s['name'] for s in found)}", hint="give more of the name")
    if not found:
        names = ", ".join(s["name"] for s in instances)
        raise InstanceNotFound(f"no running instance {name!r}",
                               hint=f"running: {names}" if names else "no instance is running")
    if as_json:
        emit_json(found[0])
    else:
        click.echo(render_status(found[0]))


@cli.command("help")
@click.argument("command", required=False)
@click.pass_context
def help_command(ctx: click.Context, command: str | None) -> None:
    """Show the help of safe-serve or of one COMMAND (`safe-serve help plan`)."""
    parent = ctx.parent or ctx
    if command is None:
        click.echo(cli.get_help(parent))
        return
    sub = cli.get_command(parent, command)
    if sub is None:
        import difflib

        close = difflib.get_close_matches(command, list(cli.commands), n=1)
        raise UsageError(f"no command {command!r}", hint=f"did you mean {close[0]}" if close else
                         "commands: " + ", ".join(sorted(cli.commands)))
    with click.Context(sub, info_name=command, parent=parent) as sub_ctx:
        click.echo(sub.get_help(sub_ctx))


@cli.command("models")
@option("--architectures", is_flag=True,
              help="List the architectures whose KV layout is verified against each engine instead.")
def models_command(architectures: bool) -> None:
    """List the model aliases in profiles/ (or, with --architectures, what each engine's layout is proven for)."""
    from launcher.model.resolve import list_aliases, load_profile

    if architectures:
        from launcher.engines import ENGINES, adapter

        for name in ENGINES:
            proof, rows = adapter(name).verified_architectures()
            click.echo(f"{proof}: {len(rows)} architectures")
            for architecture, detail in rows:
                click.echo(f"  {architecture:40} {detail}")
        click.echo("Any other architecture is planned with a warning and a wider error band.")
        return
    for alias in list_aliases():
        profile = load_profile(alias) or {}
        click.echo(f"{alias:32} {profile.get('repo', '')}")


# --------------------------------------------------------------------------- entry point


class _JsonOutput:
    """--json: every exit writes one object on stdout (a result, a refusal, or safe-serve.error/1)."""

    wanted = False
    written = False


_JSON = _JsonOutput()
ERROR_SCHEMA = "safe-serve.error/1"


def emit_json(doc: Mapping[str, Any]) -> None:
    click.echo(json.dumps(doc, indent=2))
    _JSON.written = True


def _wants_json(argv: Sequence[str]) -> bool:
    words = list(argv)[: list(argv).index("--")] if "--" in argv else list(argv)
    return "--json" in words or os.environ.get(ENV_PREFIX + "JSON", "").strip().lower() in ("1", "true", "yes")


def _fail(code: int, kind: str, reason: str, hint: str | None = None) -> NoReturn:
    """The one stdout object of a failed --json command (stderr has the line already)."""
    if _JSON.wanted and not _JSON.written:
        emit_json({"schema": ERROR_SCHEMA, "exit_code": code, "error": kind, "reason": reason, "hint": hint})
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; expected failures print one line and exit with their documented code.

    Saying the failure can fail too (`2>&1 | head -0`, the JSON error object `> /dev/full`): that is
    our own output failing, 141 or 74 as for a result, never a traceback."""
    args = list(argv) if argv is not None else sys.argv[1:]
    _JSON.wanted, _JSON.written = _wants_json(args), False
    try:
        _handled(args)
    except OSError as exc:
        _os_error(exc)


def _handled(args: list[str]) -> None:
    """The command, each expected failure printed as one line and exited with its documented code.

    One handler per kind of failure, most specific first (WontFit is a SafeServeError)."""
    try:
        _run(args)
    except WontFit as exc:
        _wont_fit(exc)
    except SafeServeError as exc:
        _refused(exc)
    except click.exceptions.Abort:
        click.echo("safe-serve: interrupted", err=True)
        _fail(int(ExitCode.INTERRUPTED), "Interrupted", "interrupted")
    except click.ClickException as exc:
        _usage_error(exc, args)
    except KeyboardInterrupt:
        _fail(int(ExitCode.INTERRUPTED), "Interrupted", "interrupted")
    except stopsignals.StopSignal as stop:  # before the engine started (lock wait, probe, plan)
        _stopped(stop)
    except OSError as exc:
        _os_error(exc)
    except Exception as exc:  # a bug of ours: still one line, and the traceback on request
        _internal_error(exc)
    sys.exit(0)


def _run(args: list[str]) -> None:
    """The command, with its output flushed here: a full disk or a closed pipe is said now, not at
    interpreter exit."""
    stdout = sys.stdout
    try:
        cli.main(args=args, prog_name="safe-serve", standalone_mode=False)
    except SystemExit as done:
        if done.code == 1 and sys.stdout is not stdout:  # click swallowed an EPIPE (core.py, main: exit 1)
            raise BrokenPipeError(errno.EPIPE, "the reader of our output went away") from None
        raise
    sys.stdout.flush()


def _wont_fit(exc: WontFit) -> NoReturn:
    """The refusal and the configurations that would fit, on stderr; the refusal object with --json."""
    from launcher.common.shown import clipped

    click.echo(f"safe-serve: will not fit: {clipped(str(exc))}", err=True)
    for alternative in exc.alternatives:
        click.echo(f"  would fit: {alternative}", err=True)
    if _JSON.wanted and not _JSON.written:
        doc = exc.to_json()
        emit_json({**doc, "reason": clipped(str(doc["reason"]))})
    sys.exit(int(exc.exit_code))


def _refused(exc: SafeServeError) -> NoReturn:
    from launcher.common.shown import clipped, printable

    click.echo(f"safe-serve: {printable(clipped(str(exc)))}", err=True)  # paths and names in it: one line
    _fail(int(exc.exit_code), type(exc).__name__, clipped(exc.message), exc.hint)


def _usage_error(exc: click.ClickException, args: list[str]) -> NoReturn:
    """click's own message, then for a usage error a hint naming the flag that was meant."""
    exc.show()
    hint = None
    if isinstance(exc, click.UsageError):
        hint = _usage_hint(exc, args)
        if hint:
            click.echo(f"hint: {hint}", err=True)
    code = int(ExitCode.USAGE) if isinstance(exc, click.UsageError) else exc.exit_code
    _fail(code, "UsageError", exc.format_message(), hint)


def _usage_hint(exc: click.UsageError, args: list[str]) -> str | None:
    from launcher.engines import adapter

    known = frozenset().union(*(adapter(name).accepted_flag_names() for name in ENGINES))
    typed = list(args)
    for name in ENGINES:  # the hint repeats the command line: secret values stay masked
        typed = adapter(name).shown_argv(typed)
    return cli_hints.usage_hint(exc, typed, known)


def _stopped(stop: stopsignals.StopSignal) -> NoReturn:
    click.echo(f"safe-serve: stopped on {stop.name} before the engine started", err=True)
    _fail(stopsignals.exit_code(stop), "Stopped", f"stopped on {stop.name} before the engine started")


def _os_error(exc: OSError) -> NoReturn:
    """Our own output failing exits 141 or 74 (`_output_failed`); any other OSError is a bug of ours."""
    if exc.errno not in OUTPUT_ERRNOS:
        _internal_error(exc)
    sys.exit(_output_failed(exc))


# Errors writing our own output: the reader went away (EPIPE), or the file cannot grow.
OUTPUT_ERRNOS = frozenset({errno.EPIPE, errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _output_failed(exc: OSError) -> int:
    """Our stdout failed: quiet 141 for a reader that left (`| head -1`), one line and 74 otherwise."""
    try:  # what is still buffered must not fail again at interpreter exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    if exc.errno == errno.EPIPE:
        return int(ExitCode.BROKEN_PIPE)
    try:
        click.echo(f"safe-serve: cannot write the output: {exc.strerror or exc}", err=True)
    except OSError:
        pass
    return int(ExitCode.IO_ERROR)


def _internal_error(exc: BaseException) -> NoReturn:
    if os.environ.get("SAFE_SERVE_DEBUG"):
        raise exc
    click.echo(f"safe-serve: internal error: {type(exc).__name__}: {str(exc)[:300]} "
               "(SAFE_SERVE_DEBUG=1 shows the traceback; please report it)", err=True)
    _fail(int(ExitCode.FAILURE), "InternalError", f"{type(exc).__name__}: {str(exc)[:300]}")
