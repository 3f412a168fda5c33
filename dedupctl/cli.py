"""The ``dedupctl`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from operators import codec
from operators.errors import DedupError, InvalidRecordError
from ops import kafka_io
from ops.cpu_idle import run_cpu_idle
from ops.priority import yield_cpu
from ops.stacks import dump_stacks_on_signal
from settings import Settings, load_settings

logger = logging.getLogger("dedupctl")


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cmd_topics(cfg: Settings, args: argparse.Namespace) -> int:
    result = kafka_io.ensure_topics(cfg.kafka, cfg.topics.all(), args.partitions)
    for name, state in result.items():
        _out(f"{name}: {state}")
    return 0


def cmd_run(cfg: Settings, args: argparse.Namespace) -> int:
    from jobs.runner import run_locked

    overrides: dict[str, object] = {}
    if args.parallelism:
        overrides["parallelism"] = args.parallelism
    if args.checkpoint_dir:
        overrides["checkpoint_dir"] = args.checkpoint_dir
    cfg = cfg.with_overrides(flink=overrides)
    if cfg.flink.nice:  # before the mini-cluster's JVM starts: it and its Python workers inherit it
        logger.info("the job's mini-cluster: %s", yield_cpu(cfg.flink.nice))
    if cfg.flink.cpu_idle:
        logger.info("the job's mini-cluster: %s", run_cpu_idle())
    logger.info(
        "running the dedup job, parallelism %d, checkpoints in %s, REST on 127.0.0.1:%d",
        cfg.flink.parallelism, cfg.flink.checkpoint_uri(), cfg.flink.rest_port,
    )
    run_locked(cfg, args.resume, fresh=args.fresh)
    return 0


def cmd_stop(cfg: Settings, args: argparse.Namespace) -> int:
    from jobs.runner import record_savepoint
    from ops.flink_rest import RestClient

    rest = RestClient(args.rest or f"http://127.0.0.1:{cfg.flink.rest_port}")
    job_id = rest.job_id(args.job)
    target = str(Path(args.savepoint).resolve())
    location = rest.stop_with_savepoint(job_id, target)
    record_savepoint(cfg, location)
    _out(location)
    return 0


def _parse_event_time(value: object) -> object:
    if isinstance(value, str) and not value.lstrip("-").isdigit():
        from datetime import datetime

        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    if isinstance(value, str):
        return int(value)
    return value


def cmd_produce(cfg: Settings, args: argparse.Namespace) -> int:
    source = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
    records: list[tuple[bytes | None, bytes]] = []
    bad = 0
    with source:
        for lineno, line in enumerate(source, 1):
            if not line.strip():
                continue
            try:
                fields = json.loads(line)
                if not isinstance(fields, dict):
                    raise InvalidRecordError("a line must be a JSON object")
                fields["event_time"] = _parse_event_time(fields.get("event_time"))
                req = codec.request_from_fields(fields)
            except (json.JSONDecodeError, InvalidRecordError, ValueError) as exc:
                bad += 1
                sys.stderr.write(f"{args.file}:{lineno}: not produced: {exc}\n")
                continue
            records.append((req.user_id.encode("utf-8"), codec.encode_request(req)))
    prod = kafka_io.producer(cfg.kafka.client_config())
    n = kafka_io.produce_all(prod, args.topic or cfg.topics.requests, records)
    _out(f"produced {n} records to {args.topic or cfg.topics.requests}" + (f", {bad} lines rejected" if bad else ""))
    return 1 if bad else 0


def cmd_consume(cfg: Settings, args: argparse.Namespace) -> int:
    for msg in kafka_io.read_committed(
        cfg.kafka.client_config(), [args.topic], max_messages=args.max, idle_timeout_s=args.timeout
    ):
        _out(kafka_io.to_json(kafka_io.decode_message(msg, cfg.topics)))
    return 0


def cmd_demo(cfg: Settings, args: argparse.Namespace) -> int:
    from harness.demo import run_demo

    run_demo(cfg, _out, keep=args.keep)
    return 0


def cmd_chaos(cfg: Settings, args: argparse.Namespace) -> int:
    from harness.chaos import ChaosPlan, run_chaos

    plan = ChaosPlan(requests=args.requests, rate=args.rate, kills=args.kills,
                     broker_restarts=args.broker_restarts, rescales=args.rescales, seed=args.seed,
                     cluster=args.cluster, brokers=args.brokers, broker_kills=args.broker_kills,
                     progress_s=args.progress_seconds)
    return 0 if run_chaos(plan, _out).ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dedupctl", description="Notification dedup pipeline")
    parser.add_argument("--config", help="TOML config file (default: $DEDUP_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    from dedupctl import kafka_cmd

    kafka_cmd.add_parser(sub)

    p = sub.add_parser("topics", help="create every topic of the data contract")
    p.add_argument("action", choices=["create"])
    p.add_argument("--partitions", type=int)
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("run", help="run the job on the local mini-cluster (foreground)")
    p.add_argument("--parallelism", type=int)
    p.add_argument("--checkpoint-dir")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", metavar="latest|PATH",
                       help="restore from this checkpoint or savepoint (default: latest, the newest one of the"
                            " checkpoint directory and the savepoints `stop` recorded for it; none: empty state)")
    start.add_argument("--fresh", action="store_true",
                       help="start with empty state even though the checkpoint directory holds retained state")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("stop", help="stop the running job with a savepoint (REST API)")
    p.add_argument("--savepoint", required=True, metavar="DIR")
    p.add_argument("--job", help="job id (default: the only running job)")
    p.add_argument("--rest", help="REST address (default: http://127.0.0.1:<flink.rest_port>)")
    p.set_defaults(func=cmd_stop)

    from dedupctl import ops_cmd

    ops_cmd.add_status_parser(sub)
    ops_cmd.add_trace_parser(sub)

    p = sub.add_parser("produce", help="produce JSON lines of NotificationRequest fields")
    p.add_argument("file", help="file of JSON lines, or - for stdin")
    p.add_argument("--topic")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="print a topic's committed records as JSON lines")
    p.add_argument("topic")
    p.add_argument("--max", type=int)
    p.add_argument("--timeout", type=float, default=5.0, help="stop after this many idle seconds")
    p.set_defaults(func=cmd_consume)

    p = sub.add_parser("chaos", help="fault injection against the real job and broker")
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--rate", type=int, default=1000, help="records produced per second")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--broker-restarts", type=int, default=1, help="SIGTERM and restart the broker (one node of N)")
    p.add_argument("--brokers", type=int, default=1,
                   help="nodes of the Kafka cluster: 3 gives every topic 3 replicas and min.insync.replicas 2")
    p.add_argument("--broker-kills", type=int, default=0,
                   help="SIGKILL the node leading the most partitions, keep it down 12-20 s, start it again")
    p.add_argument("--rescales", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--cluster", action="store_true",
                   help="a standalone cluster from the PyPI distribution's scripts; kills hit TaskManagers")
    p.add_argument("--progress-seconds", type=float, default=15.0,
                   help="a progress line (requests produced, output offsets readable) this often; 0: none")
    p.set_defaults(func=cmd_chaos)

    p = sub.add_parser("demo", help="broker, job and scenario end to end")
    p.add_argument("--keep", action="store_true", help="keep the demo's files")
    p.set_defaults(func=cmd_demo)
    from dedupctl.slo_cmd import register as register_slo
    register_slo(sub)
    from dedupctl.senders_cmd import register as register_senders
    register_senders(sub)
    from dedupctl.templates_cmd import register as register_templates
    register_templates(sub)
    from dedupctl.users_cmd import register as register_users
    register_users(sub)
    from dedupctl.api_cmd import register as register_api
    register_api(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("apache_beam", "py4j"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    dump_stacks_on_signal()
    try:
        cfg = load_settings(args.config)
        return int(args.func(cfg, args))
    except DedupError as exc:
        sys.stderr.write(f"dedupctl: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
