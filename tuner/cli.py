"""The `tune` command line (also installed as `attune`, and run by `python -m tuner`).

    tune --model M --gpu G [--gpus N] [--trials K] [--study NAME] [--storage URL] [--backend predict]
    tune show | export | report | predict | models | gpus | profile | trial | check-convergence | component-test

Every error the user can cause is an AttuneError; it ends here in one line on stderr and exit code 2.
The flags live in tuner.options, the commands in tuner.study_commands, tuner.report_html, tuner.what_if
and tuner.catalog_commands (imported only when run, so `tune models` never loads Optuna).
"""
from __future__ import annotations

import importlib
import os
import sys

from cost_model.nouns.errors import AttuneError
from tuner.interrupts import ReaderLeft
from tuner.options import OWN_PARSER_SUBCOMMANDS, PARSERS, SUBCOMMANDS, CliError, one_line_usage_errors

# Subcommands whose module parses its own arguments and returns its own exit code.
DELEGATED = {"check-convergence": "experiments.checks.convergence",
             "component-test": "experiments.checks.adam_component_test"}
# Each command: (module, function); the function takes the parsed arguments and returns the exit code.
COMMANDS = {"run": ("tuner.study_commands", "cmd_run"), "show": ("tuner.study_commands", "cmd_show"),
            "export": ("tuner.study_commands", "cmd_export"), "report": ("tuner.report_html", "cmd_report"),
            "predict": ("tuner.what_if", "cmd_predict"),
            "trial": ("tuner.what_if", "cmd_trial"), "models": ("tuner.catalog_commands", "cmd_models"),
            "gpus": ("tuner.catalog_commands", "cmd_gpus"), "profile": ("tuner.catalog_commands", "cmd_profile")}
STUDY_COMMANDS = ("run", "show", "export", "report")
EXIT_USAGE = 2
EXIT_READER_LEFT = 141   # 128 + SIGPIPE: what a shell shows for a tool the signal ended (`set -o pipefail`)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in DELEGATED:
            module = _delegated(argv[0])
            with one_line_usage_errors():
                return module.main(argv[1:])
        code = _run_command(argv)
        sys.stdout.flush()   # here, not at exit: a reader that left is a BrokenPipeError this function handles
        return code
    except AttuneError as e:
        print(f"tune: error: {e.one_line()}", file=sys.stderr)
        return EXIT_USAGE
    except ReaderLeft:   # `tune ... | head` left while a run was on: its trial was marked interrupted; say nothing
        return EXIT_READER_LEFT
    except KeyboardInterrupt:
        print(f"tune: {_interrupted(argv)}", file=sys.stderr)
        return 130
    except BrokenPipeError:   # `tune show | head`: the reader left; say nothing, as a SIGPIPE'd tool would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_LEFT


def _interrupted(argv: list[str]) -> str:
    """What an interrupt (Ctrl-C) left: a tuning run keeps its finished trials; another command wrote nothing
    it had not finished (its files are written whole or not at all)."""
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "run"
    if command in ("run", "trial"):
        return "interrupted; finished trials are kept in the study"
    return f"{command} interrupted; nothing it had not finished was written"


def _run_command(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        raise CliError(_unknown_command(argv[0]))
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "run"
    if command != "run":
        argv = argv[1:]
    args = PARSERS[command]().parse_args(argv)
    if command in STUDY_COMMANDS:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
    module, function = COMMANDS[command]
    if command in STUDY_COMMANDS and command != "run":   # a storage that fails while read: one line
        from tuner.study import storage_errors, storage_url

        with storage_errors(storage_url(getattr(args, "storage", None))):
            return getattr(importlib.import_module(module), function)(args)
    return getattr(importlib.import_module(module), function)(args)


def _delegated(command: str):
    """The module of a subcommand that parses its own arguments; one line when what it needs is missing."""
    try:
        return importlib.import_module(DELEGATED[command])
    except ModuleNotFoundError as e:
        raise CliError(f"tune {command} needs the Python package '{e.name}', which is not installed "
                       f"(pip install 'attune-llm[megatron]' brings torch and megatron-core)") from None


def _unknown_command(word: str) -> str:
    """A first word that is no subcommand and no flag: name it and the nearest subcommand."""
    import difflib

    known = SUBCOMMANDS + OWN_PARSER_SUBCOMMANDS
    near = difflib.get_close_matches(word, known, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"unknown command '{word[:40]}'{hint}; commands: {', '.join(known)}; or flags: tune --model M --gpu G"


if __name__ == "__main__":
    sys.exit(main())
