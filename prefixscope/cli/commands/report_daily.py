"""``prefixscope report daily``: the daily report, printed or emailed once per day."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, out, print_json


def daily_cmd(
    db: DbOption = DB_DEFAULT,
    date: Annotated[str | None, typer.Option(
        "--date", "--day", help="Local day to report, YYYY-MM-DD (default: yesterday in "
                                "--tz); --day is the same option (the pages' ?day=).")] = None,
    tz: Annotated[str | None, typer.Option(
        "--tz", help="IANA time zone of the day boundary (default [alerts] timezone).")] = None,
    as_json: JsonOption = False,
    send: Annotated[bool, typer.Option(
        "--send", help="Email the report (once per day and recipient group) and POST it to "
                       "the [[alerts.webhooks]] (once per day each).")] = False,
    resend: Annotated[bool, typer.Option(
        "--resend", help="Send again even if already sent for this day (implies --send).")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Compose the emails but neither send nor record them "
                          "(implies --send); without recipients configured, say so and "
                          "compose the full report's email.")] = False,
    eml_dir: Annotated[str | None, typer.Option(
        "--eml-dir", help="Also write each composed email to this folder as .eml.")] = None,
    dashboard_url: Annotated[str | None, typer.Option(
        "--dashboard-url", help="URL of the served dashboard the report links to (default "
                                "env PREFIXSCOPE_DASHBOARD_URL, [dashboard] public_url, "
                                "[alerts] dashboard_url).")] = None,
    config: Annotated[str | None, typer.Option(
        "--config", help="Config file (default $PREFIXSCOPE_CONFIG or ./prefixscope.toml).")] = None,
) -> None:
    """Daily prefix-cache report per model and scope: OK, ALERT, NO DATA or STALE.

    Prints the report; with --send emails it (text + HTML + chart) to the [alerts]
    recipients and POSTs it to the [[alerts.webhooks]] (Slack-compatible or plain JSON), and
    records each send in the database, so that a second run the same day sends nothing.
    Exit code 3 when SMTP or a webhook failed after retries.

    Example: prefixscope report daily --date 2026-11-28 --tz Europe/Berlin --send
    """
    from prefixscope.alerts.daily import parse_day
    from prefixscope.alerts.job import describe_outcomes, link_url, run_daily
    from prefixscope.alerts.render import render_text
    from prefixscope.core.config import load_settings

    settings = load_settings(config)
    day = parse_day(date) if date else None
    run = run_daily(db, settings=settings, day=day, tz=tz, send=send, resend=resend,
                    dry_run=dry_run, eml_dir=eml_dir, dashboard_url=dashboard_url)
    if as_json:
        print_json(run.as_dict())
    else:
        out.print(render_text(run.report, dashboard_url=link_url(settings, dashboard_url)),
                  markup=False, highlight=False, end="")
        for line in [*run.notes, *describe_outcomes([*run.outcomes, *run.webhook_outcomes])]:
            out.print(line, markup=False, highlight=False)
    run.raise_for_failures()


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``report daily``."""
    groups["report"].command("daily")(daily_cmd)
