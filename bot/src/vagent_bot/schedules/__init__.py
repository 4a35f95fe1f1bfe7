"""Scheduled tasks: the `!schedule` commands, the scheduler loop and the record of each run."""
