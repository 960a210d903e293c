"""The command line builds only the parser of the subcommand it runs (dsim.cli._parser(argv)): the
same parse, the same help and the same errors as the parser of every subcommand."""
import argparse

import pytest

from dsim import cli


def _subcommands(parser):
    act = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return act.choices


FULL = cli._parser()
NAMES = sorted(_subcommands(FULL))


def test_every_subcommand_alone_has_the_same_parser():
    assert len(NAMES) >= 20 and {"run", "bench", "plan", "lut", "specdec"} <= set(NAMES)
    for name in NAMES:
        lazy = cli._parser([name, "--help"])
        assert list(_subcommands(lazy)) == [name]                     # only that one was built
        assert _subcommands(lazy)[name].format_help() == _subcommands(FULL)[name].format_help(), name
        assert lazy.format_usage() == FULL.format_usage()


@pytest.mark.parametrize("argv", [
    ["bench", "--requests", "5", "--replicas", "2"],
    ["-v", "-qq", "run", "quickstart", "--set", "seed=3", "--no-plots"],
    ["-vq", "plan", "s.yaml", "--gpus", "8", "--space", "x.yaml", "--slo", "ttft_p99_ms=1", "--out", "o"],
    ["lut", "check", "t.csv"],
])
def test_same_namespace_as_the_full_parser(argv):
    assert vars(cli._parser(argv).parse_args(argv)) == vars(FULL.parse_args(argv))


@pytest.mark.parametrize("argv", [["--log-level", "debug", "bench"], ["--help"], ["benhc"], ["--version"], [],
                                  ["--verb", "bench"], ["--", "run"]])
def test_anything_else_builds_every_subcommand(argv):
    assert sorted(_subcommands(cli._parser(argv))) == NAMES


@pytest.mark.parametrize("argv,msg", [
    (["bench", "--requests", "x"], "argument --requests: invalid int value: 'x'"),
    (["benhc"], "argument COMMAND: invalid choice: 'benhc'"),
    (["run"], "the following arguments are required: scenario"),
])
def test_usage_errors_unchanged(argv, msg, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
