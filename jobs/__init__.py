"""Entry points for `ray job submit`."""
