"""The files that tell what a run's output directory is, shared by the commands that write them (``ray_app``) and
the readers that must tell a run's own models from anything else under it (:mod:`kermt.inference.members`).
Plain names only, so that reading them costs no import."""

RUN_STATE_FILE = "run_state.json"  # a run's id and settings, written when the run starts
RUN_RECORD_FILE = "run.json"  # written when the run has finished (a finetune's summary names its run id)
COMPLETE_MEMBER_FILE = "metrics.csv"  # the file a finetune member writes last: a member without it is incomplete
CALIBRATION_FILE = "calibration.json"  # fold_k/: the fold ensemble's conformal calibration (kermt.uncertainty)
CLASS_CALIBRATION_FILE = "classification_calibration.json"  # fold_k/: Platt/isotonic + set scores
# run.json's calibration record of a fold calibrated on a --calibration_path file (only then): how many of its
# molecules are also in the fold's training split
IN_TRAINING_SPLIT_KEY = "in_training_split"
SWEEP_FILE = "tune_config.yaml"  # a `kermt tune` save_dir: its trials are candidates, not an ensemble
REPORT_FILE = "report.html"  # the run's report (ray_app.report), rebuilt from the other files by `kermt report`
TEST_SPREAD_FILE = "test_spread.csv"  # fold_k/: the members' spread on each test molecule (the report's intervals)
