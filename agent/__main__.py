"""`python -m agent join --url … --token …` registers this machine; `python -m agent run` is the service."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from agent import asyncio_fixes
from agent.config import AgentConfig, state_dir_from_env
from agent.errors import RegistrationError
from agent.registration import join
from agent.transport.commands import RunnerLike
from agent.transport.tunnel import run_agent
from agent.update import launch

log = logging.getLogger("agent")


def make_runner_factory(config: AgentConfig) -> Any:
    """Build the CommandRunner for the cluster's orchestration mode (told by the control plane on connect)."""

    def factory(mode: str, mode_settings: dict[str, Any]) -> RunnerLike:
        from agent.journal import journal_path
        from agent.ray.commands import default_handler
        from agent.runner import CommandRunner, build_executor
        from agent.workloads.endpoints import EndpointManager
        from agent.workloads.models import ModelCache

        work_dir = config.work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        models = ModelCache(config.model_cache)
        executor = build_executor(
            mode,
            mode_settings,
            docker_url=os.environ.get("DOCKER_HOST"),
            kubeconfig=None,
            workdir=work_dir / "gitops",
        )
        ray = default_handler(work_dir, executor=executor, model_dir=config.model_cache)
        # ranks of multi-node endpoints may run inside this node's Ray containers, on the same engine client
        endpoints = EndpointManager(models=models, state_dir=work_dir / "endpoints", containers=ray.containers)
        return CommandRunner(
            executor=executor,
            models=models,
            endpoints=endpoints,
            journal_path=journal_path(work_dir),
            ray=ray,
        )

    return factory


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run `join` or `run`."""
    parser = argparse.ArgumentParser(prog="python -m agent", description="CleverThis compute agent")
    parser.add_argument("--log-level", default=os.environ.get("CLEVERTHIS_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)
    join_cmd = sub.add_parser("join", help="register this machine with a join token")
    join_cmd.add_argument("--url", required=True, help="control plane URL, e.g. https://fleet.example.com")
    join_cmd.add_argument("--token", default=os.environ.get("CLUSTER_TOKEN"), help="join token (or CLUSTER_TOKEN)")
    join_cmd.add_argument("--state-dir", default=None)
    join_cmd.add_argument("--force", action="store_true", help="re-register even if already registered")
    run_cmd = sub.add_parser("run", help="connect and serve commands (the systemd service)")
    run_cmd.add_argument("--state-dir", default=None)
    args = parser.parse_args(argv)
    asyncio_fixes.install()  # every cancellation reaches its task (Python 3.11's wait_for could lose one)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")

    state_dir = state_dir_from_env(args.state_dir)
    if args.command == "join":
        if not args.token:
            parser.error("a join token is required: --token or CLUSTER_TOKEN")
        try:
            config = join(url=args.url, token=args.token, state_dir=state_dir, force=args.force)
        except RegistrationError as exc:
            # One plain line (no log prefix): install.sh repeats it as its own error message.
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"registration successful: this machine is node {config.node_id} (run the agent: python -m agent run)")
        return 0
    try:
        config = AgentConfig.load(state_dir)
    except FileNotFoundError as exc:
        log.error("%s", exc)
        return 2
    launch.exec_current(config)  # the version `versions/current` names, when that is not this code
    code = run_agent(config, make_runner_factory(config))
    if code == launch.EXIT_RESTART and not launch.under_systemd():
        launch.restart(config)
    return code


if __name__ == "__main__":
    sys.exit(main())
