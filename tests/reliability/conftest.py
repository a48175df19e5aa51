"""Print every reliability figure again at the end of the run, so that a CI log
shows them without ``-s``."""

from __future__ import annotations

from _pytest.terminal import TerminalReporter

from .harness import FIGURES


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("reliability figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
