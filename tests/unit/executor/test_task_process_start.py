"""A task process's start in a warm runner's fork: what it would build afresh is built once,
in the runner, before the fork (``engine.executor.warm_runner.prime``)."""

from __future__ import annotations

from engine.execution import process, task_runner
from engine.executor import warm_runner


def test_the_warm_runner_builds_the_task_process_argument_parser_before_it_forks() -> None:
    process.argument_parser.cache_clear()
    warm_runner.prime()
    assert process.argument_parser.cache_info().currsize == 1
    hits = process.argument_parser.cache_info().hits
    args = process.start(*task_runner.ARGUMENTS, ["--ti-id", "7"])  # what a forked step does
    assert (args.ti_id, args.channel_fd) == (7, None)
    assert process.argument_parser.cache_info().hits == hits + 1  # the runner's parser
