"""``pipetrain profile`` and ``pipetrain probe``: measure the model's layers and this machine's links."""

from __future__ import annotations

import argparse

from rich.markup import escape

from pipetrain import api
from pipetrain.cli.common import graph_of, save_text
from pipetrain.cli.consoles import console, out
from pipetrain.cli.validate import check_probe_args, check_profile_args
from pipetrain.errors import UserError
from pipetrain.plan.memory import OptimizerName

__all__ = ["cmd_probe", "cmd_profile"]


def cmd_profile(args: argparse.Namespace) -> None:
    graph = graph_of(args)
    check_profile_args(args, graph)
    profile = api.profile_model(graph, args.batch, estimate=args.estimate, progress=True, repeats=args.repeats,
                                loss=args.loss, device=args.device, precision=args.precision)
    save_text(args.out, profile.to_json(), "profile")
    if profile.noise is not None and not profile.noise.unstable:  # an unstable one was logged as a warning
        console.print(f"[dim]{escape(profile.noise.describe())}[/dim]")
    from pipetrain.viz.plan_tables import profile_table

    out.print(profile_table(profile))


def cmd_probe(args: argparse.Namespace) -> None:
    from pipetrain.calibrate.machine import probe_workload
    from pipetrain.calibrate.overhead import probe_local_cluster

    graph = None if args.model is None else graph_of(args)
    check_probe_args(args, graph)
    if args.optimizer is not None and not args.calibrate:
        raise UserError("--optimizer is the optimizer --calibrate's runs train with: add --model M --calibrate, "
                        "or drop --optimizer")
    optimizer: OptimizerName = args.optimizer or "sgd"
    model = None if graph is None else probe_workload(graph, args.batch)
    cluster = probe_local_cluster(args.ranks, probes=args.probes, action_overhead_s=args.overhead, model=model)
    calibration, profile = None, None
    if model is not None and args.calibrate:
        from pipetrain.calibrate.fit import calibrate_cluster
        from pipetrain.calibrate.machine import calibration_profile_path, write_calibration_record

        profile = api.profile_model(model[0], args.batch, progress=True)
        out.print(f"calibrating on {model[0].name}: three short runs of it on {args.ranks} ranks, training with "
                  f"{optimizer} ...")
        calibration = calibrate_cluster(model[0], profile, cluster, args.batch, optimizer=optimizer)
        cluster = calibration.apply(cluster)
        save_text(calibration_profile_path(args.out), profile.to_json(),
                  "the profile the calibration holds for (`plan --cluster` this cluster prices with it)")
        console.print(f"[dim]wrote the calibration's optimizer: {write_calibration_record(args.out, optimizer)}[/dim]")
    save_text(args.out, cluster.to_json(), "cluster")
    if graph is not None:
        from pipetrain.calibrate.machine import keep_probe

        kept = keep_probe(graph, args.batch, cluster, profile, optimizer)
        console.print(f"[dim]kept for `pipetrain plan --model {escape(str(args.model))} --batch {args.batch} --ranks "
                      f"{args.ranks}` and the demo to reuse: {escape(str(kept))}[/dim]")
    link = cluster.intra_node
    how = "measured" if args.overhead is None else "given"
    out.print(
        f"link: latency {link.latency_s * 1e6:.0f} µs, bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s; "
        f"two ranks computing at once each run at {cluster.concurrency_speed(2):.2f}× their speed alone "
        f"(median of {args.probes} probes{'' if model is None else f', on {model[0].name} work'}); "
        f"{cluster.action_overhead_s * 1e6:.0f} µs per action ({how if calibration is None else 'calibrated'})"
    )
    host = cluster.message_host
    out.print(f"each message costs its ranks (host work, besides the link): sending {host.send_s * 1e6:.0f} µs + "
              f"{host.send_per_byte_s * 1e12:.0f} µs/MB, receiving {host.recv_s * 1e6:.0f} µs + "
              f"{host.recv_per_byte_s * 1e12:.0f} µs/MB")
    if calibration is not None:
        out.print(f"calibrated on {args.model}: {calibration.describe()}")
    if cluster.collective is not None:
        two = cluster.collective
        out.print(f"all-reduce over 2 ranks: {2 * two.latency_s * 1e6:.0f} µs + "
                  f"{two.bandwidth_bytes_per_s / 1e9:.2f} GB/s (ring step: latency {two.latency_s * 1e6:.0f} µs)")
