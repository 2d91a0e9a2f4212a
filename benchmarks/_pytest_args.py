"""Benchmarks that run pytest take their own options, then `--`, then options for pytest itself."""


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the benchmark's options, pytest's options): pytest's are whatever follows the first `--`."""
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1:]
