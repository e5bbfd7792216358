"""The names of `kermt predict`'s output columns beyond the tasks themselves, spelled once: for the code that writes
them (ray_app.screening), the service that answers with them (ray_app.serve) and the report that reads them back
(ray_app.report, which must not import the Ray-bound writers). Column order in an output: the SMILES, each task,
then, when asked, ``<task>_std``, ``<task>_lower``/``<task>_upper``, ``<task>_calibrated``, ``<task>_set``,
``domain_distance``/``in_domain``, the carried input columns, ``valid`` and ``error``."""

STD_SUFFIX = "_std"  # --uncertainty: <task>_std, the members' (total) standard deviation
LOWER_SUFFIX, UPPER_SUFFIX = "_lower", "_upper"  # --interval: <task>_lower / <task>_upper, conformal bounds
CALIBRATED_SUFFIX = "_calibrated"  # classification with a calibration: the recalibrated probability
SET_SUFFIX = "_set"  # classification with --interval: the conformal prediction set ("0", "1", "0,1", "")
TASK_SUFFIXES = (STD_SUFFIX, LOWER_SUFFIX, UPPER_SUFFIX, CALIBRATED_SUFFIX, SET_SUFFIX)
DISTANCE_COLUMN, IN_DOMAIN_COLUMN = "domain_distance", "in_domain"  # --applicability_domain

__all__ = ["CALIBRATED_SUFFIX", "DISTANCE_COLUMN", "IN_DOMAIN_COLUMN", "LOWER_SUFFIX", "SET_SUFFIX", "STD_SUFFIX",
           "TASK_SUFFIXES", "UPPER_SUFFIX"]
