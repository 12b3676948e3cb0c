"""Start-up of ``stream-dedup dedup`` on small inputs, and where the Python kernels stop paying.

Two measurements, each a fresh process per run, the variants taking turns round after
round (the machine is shared and noisy), medians of wall time and CPU time (user + system
of the child):

1. **checkouts**: ``python -m stream_dedup.cli dedup one.jsonl -o out.jsonl`` (one line,
   no ``--index``) and ``--help`` from each checkout given, put first on ``PYTHONPATH``.
2. **sweep**: ``dedup`` over the first ``n`` generated news articles (one batch), with the
   kernels forced compiled and forced Python (:func:`stream_dedup.core.jit.forced`): the
   batch size where loading numba and its cached kernels is repaid, which
   :data:`~stream_dedup.core.jit.SMALL_BATCH` is chosen from.

    .venv/bin/python bench/bench_startup.py --checkout ../old --checkout . --rounds 9
    .venv/bin/python bench/bench_startup.py --sweep 1,16,64,256 --rounds 5

Byte-compiled modules are written first (``compileall``), as an installed package has
them: a run that compiles its sources each time measures the compiler.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
FORCED = (
    "import sys\n"
    "from stream_dedup.core import jit\n"
    "from stream_dedup.cli import main\n"
    "with jit.forced({compiled}):\n"
    "    sys.exit(main(sys.argv[1:]))\n"
)


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv`` (CPU: user + system of the child).

    ``cwd`` holds no checkout: ``python -m`` and ``-c`` put it first on the path.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def medians(runs: dict[str, list[tuple[float, float]]]) -> None:
    for name, times in runs.items():
        wall = statistics.median(t[0] for t in times)
        cpu = statistics.median(t[1] for t in times)
        spread = f"{min(t[0] for t in times):.3f}-{max(t[0] for t in times):.3f}"
        print(f"{name:<48} wall {wall:.3f} s (CPU {cpu:.3f}; wall range {spread})")


def environment(checkout: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(checkout.resolve())
    return env


def checkouts(paths: list[Path], rounds: int, work: Path) -> None:
    one = work / "one.jsonl"
    one.write_text('{"id":"a","text":"hello world"}\n')
    commands = {
        "dedup one.jsonl": ["dedup", str(one), "-o", str(work / "out.jsonl"), "-q"],
        "--help": ["--help"],
    }
    for path in paths:
        compileall.compile_dir(path / "stream_dedup", quiet=1)
        where = subprocess.run(
            [sys.executable, "-c", "import stream_dedup; print(stream_dedup.__file__)"],
            env=environment(path), cwd=work, check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        if not Path(where).is_relative_to(path.resolve()):
            raise SystemExit(f"{path}: the package imported is {where}")
        for argv in commands.values():  # numba's cache filled, if this checkout needs it
            timed([sys.executable, "-m", "stream_dedup.cli", *argv], environment(path), work)
    runs: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for label, argv in commands.items():
            for path in paths:
                key = f"{label} [{path}]"
                cmd = [sys.executable, "-m", "stream_dedup.cli", *argv]
                runs.setdefault(key, []).append(timed(cmd, environment(path), work))
    medians(runs)


def sweep(sizes: list[int], rounds: int, work: Path) -> None:
    from stream_dedup.tools.generate import StreamSpec, generate

    compileall.compile_dir(HERE / "stream_dedup", quiet=1)
    records = list(generate(StreamSpec(max(sizes))))
    for n in {1, *sizes}:
        with (work / f"news-{n}.jsonl").open("w") as out:
            for record in records[:n]:
                out.write(json.dumps(record) + "\n")
    env = environment(HERE)
    warm = [sys.executable, "-c", FORCED.format(compiled=True), "dedup", str(work / "news-1.jsonl")]
    timed([*warm, "-o", str(work / "out.jsonl"), "-q"], env, work)  # numba's cache filled
    runs: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for n in sizes:
            for compiled in (True, False):
                argv = [sys.executable, "-c", FORCED.format(compiled=compiled), "dedup"]
                argv += [str(work / f"news-{n}.jsonl"), "-o", str(work / "out.jsonl"), "-q"]
                argv += ["--batch-size", str(max(sizes))]
                key = f"{n:>5} articles, {'compiled' if compiled else 'python'}"
                runs.setdefault(key, []).append(timed(argv, env, work))
    medians(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", type=Path, action="append", default=[])
    parser.add_argument("--sweep", default="", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkout:
            checkouts(args.checkout, args.rounds, Path(tmp))
        if args.sweep:
            sweep([int(n) for n in args.sweep.split(",")], args.rounds, Path(tmp))


if __name__ == "__main__":
    main()
