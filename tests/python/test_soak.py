"""A one-minute soak (after a 90-second warm-up) in the suite; scripts/soak.sh runs the
ten-minute one."""

from decimal import Decimal

import soak


def test_one_minute_soak(workdir, capsys):
    report = soak.run(60, workdir, warmup=90)
    with capsys.disabled():
        print(
            f"\nsoak 60 s: {report['requests_in_ledger']} billed requests, ledger S/ {report['ledger_total']}, "
            f"RSS {report['rss_warm_kb']} -> {report['rss_mid_kb']} -> {report['rss_end_kb']} kB "
            f"({report['rss_growth']:+.1%}, second half {report['rss_steady_growth']:+.1%})"
        )
    assert report["mismatch_count"] == 0, report["mismatches"]
    assert report["unbilled_count"] == 0, report["upstream_requests_without_row"]
    assert Decimal(report["ledger_total"]) == Decimal(report["recomputed_total"])
    assert report["client_error_count"] == 0, report["client_errors"]
    assert report["wrong_status_count"] == 0, report["wrong_statuses"]
    assert report["reservations_open"] == 0
    # A leak grows with the requests (~2,500/s here): over the second half of the window
    # even 10 bytes a request would add 2 %.
    assert report["rss_steady_growth"] < 0.02, report
    assert report["rss_growth"] < 0.05, report
    assert report["exit_code"] == 0
    assert report["requests_in_ledger"] > 500
