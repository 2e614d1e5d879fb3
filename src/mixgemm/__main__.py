"""`python -m mixgemm [demo|bench|tune|report] ...` (also the `mixgemm` console script).

demo (the default when no subcommand is given): quantize a layer and show bytes, error and speed.
bench: the scoreboard (benchmark protocol). tune: measure candidate kernel configs for a model's layers on this GPU
(per-GPU tuning cache). report: render each GPU's quick run (benchmarks/results) into README.md.
"""

from __future__ import annotations

import sys

USAGE = """usage: mixgemm [demo|bench|tune|report] [options]

  demo    quantize an LLM layer, report bytes/error, time it beside fp16 cuBLAS (default)
  bench   the scoreboard: mixgemm vs cuBLAS/tinygemm/int_mm/gemlite per the benchmark protocol
  tune    measure candidate kernel configs for a model's layer shapes on this GPU, write the tuning cache
  report  render each GPU's quick run (benchmarks/results) into a Markdown table (--write updates README.md)

`mixgemm COMMAND --help` for the options of each."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[0] if argv and not argv[0].startswith("-") else None
    if cmd is None and argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    rest = argv[1:] if cmd else argv
    if cmd in (None, "demo"):
        from mixgemm import demo

        return demo.main(rest)
    if cmd == "bench":
        from mixgemm.bench import cli

        return cli.main(rest)
    if cmd == "tune":
        from mixgemm.bench import tune

        return tune.main(rest)
    if cmd == "report":
        from mixgemm.bench import report

        return report.main(rest)
    print(f"mixgemm: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
