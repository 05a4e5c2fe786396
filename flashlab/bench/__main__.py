"""``python -m flashlab.bench``: run measurement suites by name, or list them.

    python -m flashlab.bench list
    python -m flashlab.bench run SUITE [SUITE ...] --out DIR --budget-s S [--quick] [--tar-only]
    python -m flashlab.bench ship-launches RECORD [...] [--check]   (small-launches → the shipped file)

`flashlab.bench.runner` says what a run writes; `flashlab.bench.suites` holds the suites."""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
from pathlib import Path


class OneLineParser(argparse.ArgumentParser):
    """A user error is one line on stderr and exit status 2, not the usage block."""

    def error(self, message):
        self.exit(2, f"python -m flashlab.bench: {message} (see --help)\n")


def suite_lines(suites) -> str:
    return "\n".join(textwrap.fill(f"{s.name:23} {s.summary} [{s.needs}; {s.budget_s:.0f} s]", 100,
                                   initial_indent="  ", subsequent_indent=" " * 26) for s in suites.values())


def build_parser(suites) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m flashlab.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Run flashlab's measurement suites by name; each writes one record.",
                           epilog="suites (name, what it measures, [where it runs; its time budget]):\n"
                                  + suite_lines(suites))
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    listing = commands.add_parser("list", help="the suites, with what each measures, its shapes and its record")
    listing.add_argument("--brief", action="store_true", help="one line per suite")
    run = commands.add_parser("run", help="run suites within one time budget", formatter_class=argparse.
                              RawDescriptionHelpFormatter, epilog="suites:\n" + suite_lines(suites))
    run.add_argument("suites", nargs="+", metavar="SUITE", help="suite names, run in this order")
    run.add_argument("--out", type=Path, required=True,
                     help="folder for <gpu>/<record>.json and .log, run.log and records.tar.gz")
    run.add_argument("--budget-s", type=float, required=True,
                     help="seconds for all the suites together; what would not fit is skipped or shortened")
    run.add_argument("--quick", action="store_true",
                     help="tiny shapes: checks that a suite runs (on a CPU too, where a suite allows it)")
    run.add_argument("--tar-only", action="store_true",
                     help="keep only records.tar.gz in --out (a device call returns at most 8 files)")
    ship = commands.add_parser("ship-launches", help="write flashlab/launch/tuned/small_path/<gpu>.json from "
                               "small-launches records")
    ship.add_argument("records", nargs="+", type=Path, help="small-launches records (.json) of one GPU model")
    ship.add_argument("--check", action="store_true", help="exit 1 if the shipped file differs; write nothing")
    return parser


def describe_suites(suites) -> str:
    blocks = []
    for s in suites.values():
        blocks.append(f"{s.name}: {s.summary}\n"
                      + textwrap.indent(textwrap.fill(f"measures: {s.measures}", 100), "  ") + "\n"
                      + textwrap.indent(textwrap.fill(f"shapes: {s.shapes}", 100), "  ") + "\n"
                      + f"  runs on: {s.needs}; budget {s.budget_s:.0f} s (skipped below {s.min_s:.0f} s); "
                        f"record: results/{'cpu' if s.on_cpu_record else '<gpu>'}/{s.record}.json")
    return "\n\n".join(blocks)


def main(argv: list[str] | None = None) -> int:
    from flashlab.bench.suites import SUITES
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(SUITES).parse_args(argv)
    if args.command == "list":
        print(suite_lines(SUITES) if args.brief else describe_suites(SUITES))
        return 0
    if args.command == "ship-launches":
        missing = [str(p) for p in args.records if not p.is_file()]
        if missing:
            print(f"python -m flashlab.bench: {', '.join(missing)}: no such file", file=sys.stderr)
            return 2
        from flashlab.bench.suites.small_launches import write_launches_file
        try:
            return write_launches_file(args.records, args.check)
        except (ValueError, KeyError) as exc:
            print(f"python -m flashlab.bench: ship-launches: {exc}", file=sys.stderr)
            return 2
    unknown = [name for name in args.suites if name not in SUITES]
    if unknown:
        print(f"python -m flashlab.bench: unknown suite {', '.join(map(repr, unknown))}; "
              f"choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    if args.budget_s <= 0:
        print(f"python -m flashlab.bench: --budget-s {args.budget_s:g}: give a positive number of seconds",
              file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"python -m flashlab.bench: --out {args.out} is a file; give a folder", file=sys.stderr)
        return 2
    from flashlab.bench.runner import run_suites
    command = shlex.join(["python", "-m", "flashlab.bench", *argv])
    return run_suites([SUITES[name] for name in dict.fromkeys(args.suites)], args.out, args.budget_s, args.quick,
                      command, args.tar_only)


if __name__ == "__main__":
    sys.exit(main())
