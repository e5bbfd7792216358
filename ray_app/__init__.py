"""Ray Train / Data / Tune application built on the ``kermt`` library."""
