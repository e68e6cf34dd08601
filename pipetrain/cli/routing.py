"""Which planner `pipetrain plan` runs for its ``--method`` and ``--planner``, read from the planner
specs (:mod:`pipetrain.planners.registry`) and the methods' traits (:mod:`pipetrain.plan.methods`).

    route = plan_route(args)          # PlanRoute(spec, method, run_by)
    route.spec.name                   # the planner
    route.method                      # what it is asked for (constraints.method), None: its own choice
    route.run_by                      # the method its plan then runs by (pipedream: a 1f1b plan's stages)

The rules, in the order they are checked (each refusal names the fix, before any profiling):

* ``--aux``/``--queue-depth`` only where the planner plans local learning (its methods' params);
  ``--vertical-sync`` only with a method that runs it;
* a method with each stage its own partition per pass (``uedp``): a micro-batch planner (default
  ``tidgap``; with ``--virtual-stages V``, the one whose method loops, ``interleaved-ga``);
* otherwise the micro-batch planners' flags (``--planner`` one of them, ``--seed``, ``--population``,
  ``--generations``) ask for ``--method uedp``; ``--virtual-stages`` asks for a multi-stage method;
* no ``--planner`` and no ``--method``: :data:`~pipetrain.planners.registry.DEFAULT_PLANNER` (``auto``
  within its time budget; ``pipetrain.cli.planning`` gives a flag auto does not take, ``--stages``,
  ``--micro``, ``--no-memory-cap``, to the ``balanced`` planner instead, as before auto was the default);
* no ``--planner``: the method's default planner (:func:`~pipetrain.planners.registry.planner_for`),
  or for an asynchronous method without one (``pipedream``, ``2bw``) its flush twin's (``plan_as``:
  the best 1f1b plan the method can run, then run by it: 2bw's has a micro-batch per stage);
* a ``--planner`` that plans the method is asked for it; one that takes ``--method`` and plans an
  asynchronous method takes only that; a method with another default planner names it; an
  asynchronous method is planned by the ``--planner`` as its flush twin, then run by it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, LocalParams, Method, SizeRule, WeightPolicy
from pipetrain.planners import DEFAULT_PLANNER, PLANNERS, PlannerSpec, default_planner, get_planner, planner_for

__all__ = ["PlanRoute", "check_local_flags", "check_vertical_sync", "how_planned", "listed", "plan_route", "unequal"]


@dataclass(frozen=True)
class PlanRoute:
    """What `plan` runs.

    Attributes:
        spec: the planner.
        method: the method asked of it (``constraints.method``); None: its own choice.
        run_by: the method its plan then runs by (same stages and micro-batches); None: as planned.
    """

    spec: PlannerSpec
    method: Method | None = None
    run_by: Method | None = None


def listed(methods: tuple[Method, ...] | list[Method], last: str = "or") -> str:
    """``a, b or c``: method names for messages."""
    names = [m.value for m in methods]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def unequal(method: Method | None) -> bool:
    """A method whose stages each cut the batch their own way per pass (UMPIPE's ``uedp``): the
    micro-batch planners choose those sizes."""
    return method is not None and METHODS[method].sizes is SizeRule.PER_PASS


def _named(args: argparse.Namespace) -> Method | None:
    return None if args.method is None else Method(args.method)


def _method_given(args: argparse.Namespace) -> str:
    """``--method M``, or that none was given, for messages."""
    return "no --method given" if args.method is None else f"--method is {args.method}"


def check_local_flags(args: argparse.Namespace, takes_heads: bool, method: str) -> None:
    """``--aux`` and ``--queue-depth`` go with local learning only (``method``: which method runs, for
    the message: ``--method is M``)."""
    if not takes_heads and (args.aux is not None or args.queue_depth is not None):
        local = listed([m for m, s in METHODS.items() if s.params is LocalParams])
        raise UserError(f"--aux and --queue-depth are for local learning ({method}): "
                        f"add --method {local} or drop them")


def check_vertical_sync(args: argparse.Namespace, method: Method | None, what: str) -> None:
    """``--vertical-sync`` goes with a method that runs that weight policy (``what``: the method as the
    message names it)."""
    if args.vertical_sync and (method is None or WeightPolicy.VERTICAL_SYNC not in METHODS[method].weights):
        owners = listed([m for m, s in METHODS.items() if WeightPolicy.VERTICAL_SYNC in s.weights])
        raise UserError(f"{what} does not take --vertical-sync; drop it (--vertical-sync applies to --method "
                        f"{owners})")


def plan_route(args: argparse.Namespace) -> PlanRoute:
    """The planner, method and re-run method `plan`'s ``--method`` and ``--planner`` select (module
    docstring); a UserError for combinations that do not go together."""
    method = _named(args)
    route = _unequal_route(args) if unequal(method) else _route(args, method)
    check_local_flags(args, route.spec.method_params() is LocalParams, _method_given(args))
    check_vertical_sync(args, route.run_by or route.method,
                        "a plan without --method" if args.method is None else f"--method {args.method}")
    return route


def _unequal_route(args: argparse.Namespace) -> PlanRoute:
    """``--method uedp``: a micro-batch planner; with ``--virtual-stages V``, the one whose plans loop."""
    if args.planner is not None and PLANNERS[args.planner].kind != "microbatch":
        raise UserError(f"--method {args.method} plans micro-batches with a micro-batch planner (tidgap, 1f1b-ga...); "
                        f"--planner auto already tries them; drop --method {args.method} or choose a micro-batch "
                        "planner")
    if args.virtual_stages is None:
        return PlanRoute(get_planner(args.planner) if args.planner else default_planner("microbatch"))
    looping = next(p for p in PLANNERS.values() if p.kind == "microbatch" and _loops(p))
    if args.virtual_stages < 2:
        raise UserError(f"--virtual-stages {args.virtual_stages} is one model chunk per rank: drop it for plain "
                        f"--method {args.method}, or give 2 or more for unequal micro-batches per virtual stage")
    if args.planner not in (None, looping.name):
        raise UserError(f"--method {args.method} --virtual-stages plans unequal micro-batches per virtual stage with "
                        f"the {looping.name} planner, not --planner {args.planner}; drop --planner or "
                        "--virtual-stages")
    return PlanRoute(looping)


def _loops(spec: PlannerSpec) -> bool:
    return any(METHODS[m].multi_stage for m in spec.methods)


def _route(args: argparse.Namespace, method: Method | None) -> PlanRoute:
    flags = ("planner", "seed", "population", "generations")
    given = [f"--{name}" for name in flags if getattr(args, name) is not None]
    if given and (args.planner is None or PLANNERS[args.planner].kind == "microbatch"):
        uedp = listed([m for m in METHODS if unequal(m)])
        raise UserError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for UMPIPE's unequal "
                        f"micro-batches: add --method {uedp} ({_method_given(args)})")
    if args.virtual_stages is not None and (method is None or not METHODS[method].multi_stage):
        chunked = [*(m for m, s in METHODS.items() if s.multi_stage), *(m for m in METHODS if unequal(m))]
        raise UserError(f"--virtual-stages is for --method {listed(chunked)}; add one or drop --virtual-stages")
    if args.planner is None:
        return _own_route(method)
    return _asked_route(get_planner(args.planner), method, args.vertical_sync)


def _default_planner(method: Method) -> PlannerSpec | None:
    """The planner ``plan --method`` runs for ``method`` by default, or None (an asynchronous method,
    planned as its flush twin)."""
    spec = planner_for(method)
    return spec if spec.default else None


def _asked(spec: PlannerSpec, method: Method, run_by: Method | None = None) -> PlanRoute:
    """``spec`` asked for ``method`` (unless it plans that one alone and takes no method)."""
    return PlanRoute(spec, None if spec.implies(method) else method, run_by)


def _own_route(method: Method | None) -> PlanRoute:
    if method is None:
        return PlanRoute(get_planner(DEFAULT_PLANNER))
    own = _default_planner(method)
    if own is not None:
        return _asked(own, method)
    twin = METHODS[method].plan_as
    assert twin is not None, f"method {method.value} has no default planner and no flush twin"
    return _asked(planner_for(twin), twin, method)


def _asked_route(spec: PlannerSpec, method: Method | None, vertical_sync: bool) -> PlanRoute:
    """``--planner`` with ``--method`` (module docstring)."""
    if method is None:
        return PlanRoute(spec)
    if spec.plans(METHODS[method]):
        if METHODS[method].flush:
            _refuse_method_for_async_planner(spec)
        return _asked(spec, method, method if vertical_sync else None)
    own = _default_planner(method)
    if own is not None:
        raise UserError(f"--method {method.value} is planned by --planner {own.name} and does not take --planner; "
                        f"drop it, or drop --method {method.value} to plan with --planner {spec.name}")
    _refuse_method_for_async_planner(spec)
    twin = METHODS[method].plan_as
    if twin is None or not spec.plans(METHODS[twin]):
        raise UserError(f"--method {method.value} runs the stages of a {twin.value if twin else 'synchronous'} plan, "
                        f"which --planner {spec.name} does not make; drop --planner")
    return _asked(spec, twin, method)


def _refuse_method_for_async_planner(spec: PlannerSpec) -> None:
    """A planner that takes ``--method`` and plans an asynchronous method takes ``--method`` only to ask
    for that one: its synchronous plans are its own choice (pipedream's DP simulated under gpipe and 1f1b)."""
    asynchronous = [m for m in spec.methods if not METHODS[m].flush]
    if "method" not in spec.accepts or not asynchronous:
        return
    synchronous = [m for m in spec.methods if METHODS[m].flush]
    choices = [*([listed(synchronous)] if synchronous else []), f"{listed(asynchronous)} when asked"]
    raise UserError(f"--planner {spec.name} chooses --method itself ({', or '.join(choices)}); drop --method or pass "
                    f"--method {listed(asynchronous)}")


def how_planned(method: Method) -> str:
    """How `plan --method` plans ``method``, for help texts."""
    if unequal(method):
        return (f"a micro-batch planner on the best equal plan's stages (default {default_planner('microbatch').name}; "
                "with --virtual-stages V, per virtual stage of an interleaved plan)")
    own = _default_planner(method)
    if own is not None:
        return f"--planner {own.name}"
    twin = METHODS[method].plan_as
    planners = [p.name for p in PLANNERS.values() if "method" in p.accepts and p.plans(METHODS[method])]
    return (f"the best {twin.value if twin else 'synchronous'} plan it can run, run by it, or with --planner "
            f"{'|'.join(planners)} that planner's own steady-state plan")
