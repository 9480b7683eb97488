"""Alerts: the daily report, its email, and the record of every send."""
