"""Scheduling: for each task and target, one point of the MetaSchedule design space (a Schedule record)."""
