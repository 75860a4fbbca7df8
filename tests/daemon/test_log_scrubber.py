"""The daemon's log filter (``memorizzd.redact.LogScrubber``, on the handler
``setup_logging`` installs): whatever module logs a server's secret, quoted
back by the server, the line says ``[redacted]`` instead, in the message and
in a traceback, in both log formats. The end-to-end view (the real daemon,
servers that quote their secrets back) is tests/e2e/test_secret_leak_battery.py."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import msgspec
import pytest

from memorizzd.redact import OURS_ONLY, REDACTED, LogScrubber, changed, hold
from memorizzd.telemetry.logs import formatter

CANARY = "sk-canary-7f3a9c1e5b"


class _Server:
    """A holder of secrets, as a supervisor is."""

    def __init__(self, *values: str) -> None:
        self.hidden = values


@pytest.fixture(params=["text", "json"])
def logged(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter(request.param))
    handler.addFilter(LogScrubber())
    logger = logging.getLogger(f"memorizzd.test_log_scrubber.{request.param}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)


def test_a_held_secret_is_cut_out_of_messages_and_tracebacks(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = logged
    server = _Server(CANARY, "short")
    hold(server)  # as each supervisor does, for as long as it lives
    logger.info("%s: no answer (%s)", "demo", f"invalid token Bearer {CANARY}")
    logger.warning(f"formatted in place: {CANARY}")  # noqa: G004 - what a careless line does
    try:
        raise RuntimeError(f"the server said {CANARY}")
    except RuntimeError:
        logger.exception("demo: the session failed")
    text = out.getvalue()
    assert CANARY not in text, text
    assert text.count(REDACTED) >= 3, text
    assert "the server said" in text  # the traceback is kept, cleaned


def test_lines_without_secrets_pass_as_they_are(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = logged
    server = _Server(CANARY)
    hold(server)
    logger.info("%s: connected (%d tools)", "demo", 3)
    line = out.getvalue().strip()
    if line.startswith("{"):
        assert msgspec.json.decode(line)["message"] == "demo: connected (3 tools)"
    else:
        assert line.endswith("demo: connected (3 tools)"), line
    assert REDACTED not in line


def test_secrets_that_change_are_read_again(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    """The filter reads the holders' values again when one says they changed
    (``changed``: a connect, a grant refreshed), not at every record."""
    logger, out = logged
    server = _Server("first-secret-value")
    hold(server)
    logger.info("said: first-secret-value")
    server.hidden = ("second-secret-value",)
    changed()
    logger.info("said: second-secret-value")
    text = out.getvalue()
    assert "first-secret-value" not in text
    assert "second-secret-value" not in text, text
    assert text.count(REDACTED) == 2


def test_a_record_the_filter_cannot_read_still_reaches_the_handler() -> None:
    """A record whose arguments do not fit its format: the filter lets it
    through (the handler says what is wrong with it), never raises into the
    code that logged."""
    server = _Server(CANARY)
    hold(server)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d", ("nan",), None)
    assert LogScrubber().filter(record) is True


def test_the_audit_mirror_is_left_unscanned_and_everything_else_is_not(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    """The audit trail's mirror (one line per call under journald) is built
    from names, reasons and ids, and says so (``OURS_ONLY``): it is not
    scanned, which keeps the filter off the hot path; a line without the mark
    is scanned, whatever logger says it."""
    logger, out = logged
    server = _Server(CANARY)
    hold(server)
    # (a marked line is trusted as it is: here, to show that it was not scanned)
    logger.info("audit: #1 tools/call t/%s ok", CANARY, extra={OURS_ONLY: True})
    logger.info("audit: %s", f"quoted {CANARY}")
    lines = out.getvalue().splitlines()
    assert f"t/{CANARY} ok" in lines[0]
    assert CANARY not in lines[1]
    assert REDACTED in lines[1]
