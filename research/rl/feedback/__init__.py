"""Targeted feedback: critics that write hints, their governance, efficacy probes and reports."""
